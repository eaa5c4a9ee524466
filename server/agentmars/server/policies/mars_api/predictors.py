"""Seed 001's predictions (§3 Step 1), learned online from the stream: a call's output
length before its API call and the API's duration, per API class.

Seed 001 predicts the pre-API output length from the prompt (an OPT-125M classifier
over 50 bins) and takes an API's duration as its class's mean in the training set,
"APIs belong to fixed classes (e.g., Math, Image), each with consistent functionality
and a similar duration". NOTE: ours — there is no prompt text in the engine's view, so
both are the class's running mean over the calls and tools seen so far: the class is
the tool the call says it will call (``next_tool``; "final" for a call that ends its
session or calls nothing). Before a class has history, the output falls back to the
mean over every class, then to the call's ``max_tokens``; the duration to the mean
over every tool, then to 0 (a Preserve, the cheapest handling of a short call).

``error``: seed 001's misprediction study (its §4) multiplies each prediction by
1 + N(0, error), drawn once per call (seeded), floored at 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agentmars.sdk.events import AnyEvent, ToolEnd
from agentmars.server.policies.views import CallView

FINAL = "final"
"""The class of a call that calls no API after it."""


@dataclass(slots=True)
class RunningMean:
    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class Prediction:
    output_tokens: int
    """Tokens the call generates before its API call (or in all, for a final call)."""
    api_s: float
    """How long its API call takes (0 for a final call)."""


@dataclass
class ApiPredictors:
    error: float = 0.0
    seed: int = 0
    _outputs: dict[str, RunningMean] = field(default_factory=dict)
    _durations: dict[str, RunningMean] = field(default_factory=dict)
    _all_outputs: RunningMean = field(default_factory=RunningMean)
    _all_durations: RunningMean = field(default_factory=RunningMean)
    _noise: dict[str, tuple[float, float]] = field(default_factory=dict)

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, ToolEnd):
            self._durations.setdefault(event.tool, RunningMean()).add(event.duration_s)
            self._all_durations.add(event.duration_s)

    def observe_output(self, call: CallView) -> None:
        """A finished call's output length, for its class."""
        self._outputs.setdefault(api_class(call), RunningMean()).add(call.output_tokens)
        self._all_outputs.add(call.output_tokens)

    def predict(self, call: CallView) -> Prediction:
        cls = api_class(call)
        output = _first(self._outputs.get(cls), self._all_outputs, call.max_tokens)
        api_s = 0.0
        if cls != FINAL:
            api_s = _first(self._durations.get(cls), self._all_durations, 0.0)
        output_noise, api_noise = self._noise_of(call.call_id)
        return Prediction(
            output_tokens=max(round(output * output_noise), 1), api_s=max(api_s * api_noise, 0.0)
        )

    def forget(self, call_id: str) -> None:
        self._noise.pop(call_id, None)

    def _noise_of(self, call_id: str) -> tuple[float, float]:
        if not self.error:
            return 1.0, 1.0
        if call_id not in self._noise:
            rng = random.Random(f"{self.seed}:{call_id}")
            self._noise[call_id] = (
                max(1 + rng.gauss(0.0, self.error), 0.0),
                max(1 + rng.gauss(0.0, self.error), 0.0),
            )
        return self._noise[call_id]


def api_class(call: CallView) -> str:
    return call.next_tool if call.expects_tool and call.next_tool else FINAL


def _first(mean: RunningMean | None, overall: RunningMean, default: float) -> float:
    for candidate in (mean.mean if mean else None, overall.mean):
        if candidate is not None:
            return candidate
    return default
