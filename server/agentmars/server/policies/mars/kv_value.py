"""What keeping a session's KV across its tool call is worth (seed 000 §4.3: a session's
KV stays resident "only when that pays"), in one place for both halves of MARS: the
engine half's pins (``co_scheduler``) and the admission half's count of the KV its
admitted sessions hold while their tools run (``control_plane``).

Keeping costs the share of the KV pool the session holds, for as long as its tool runs,
priced by the KV pressure: GPU-seconds of KV kept from other work. It saves the prefill
of the session's context on its resume: GPU-seconds of compute. NOTE: ours — seed 000
names the trade-off (the benefit of a warm resume against the cost of holding blocks
under current pressure) but gives no formula.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable

import numpy as np

from agentmars.sdk.events import AnyEvent, CallEvent, LLMEnd, LLMFirstToken, SessionEnd, ToolEnd
from agentmars.server.policies.mars.settings import MarsSettings


def keeping_pays(
    recompute_s: Callable[[], float | None], share: float, holding_s: float, pressure: float
) -> bool:
    """Whether the prefill a warm resume saves (``recompute_s()``; None: unknown)
    outweighs holding ``share`` of the pool for ``holding_s`` at ``pressure`` (0..1).
    Free KV (no pressure) is always worth keeping, and the saving is then not worked
    out; an unknown saving never outweighs a cost."""
    cost = pressure * share * holding_s
    if cost == 0:
        return True
    saved = recompute_s()
    return saved is not None and saved > cost


class KeepingRegime:
    """Whether keeping the KV of a session parked in a tool pays with the pool full
    (``keeping_pays`` at pressure 1), for the admission half's count of the KV its
    sessions hold (``control_plane.resident_blocks``). Both sides of that rule scale
    with the session's blocks, so it holds for every parked session or for none: it
    pays when recomputing the whole pool (the stream's prefill rate) takes at least a
    tool call's duration. Until both are known, it pays.

    NOTE: ours, twice. The tool call's duration is the mean of the last
    ``regime_tool_samples`` tools, not the pins' per-kind EMA: this judges the
    engine's regime, not the next call, and with react's heavy-tailed tools the EMA
    swung across the pool's recompute time at the real stack's point
    (docs/results/mars.md) and the count flipped with it. And it stays a yes/no: a
    share of the parked blocks by how far the rule misses, tried instead, still
    counted too much on fast engines, where recomputing is cheap (docs/mars.md)."""

    def __init__(self, settings: MarsSettings) -> None:
        self.prefill = PrefillEstimate(settings)
        self._tools: deque[float] = deque(maxlen=settings.regime_tool_samples)

    def observe(self, event: AnyEvent) -> None:
        self.prefill.observe(event)
        if isinstance(event, ToolEnd):
            self._tools.append(event.duration_s)

    def keeping_pays(self, pool_tokens: int) -> bool:
        rate = self.prefill.seconds_per_token()
        if rate is None or not self._tools:
            return True
        return keeping_pays(lambda: rate * pool_tokens, 1.0, statistics.fmean(self._tools), 1.0)


class PrefillEstimate:
    """Seconds per uncached prompt token, learned from the stream: the
    ``prefill_quantile`` of recent calls' TTFT per uncached prompt token (NOTE: ours —
    the low quantile leaves out calls that queued before their first token)."""

    def __init__(self, settings: MarsSettings) -> None:
        self.settings = settings
        self._rates: deque[float] = deque(maxlen=settings.prefill_samples)
        self._ttft: dict[tuple[str, str], float] = {}

    def observe(self, event: AnyEvent) -> None:
        if isinstance(event, LLMFirstToken):
            self._ttft[_key(event)] = event.ttft_s
        elif isinstance(event, LLMEnd):
            ttft = self._ttft.pop(_key(event), None)
            uncached = (event.prompt_tokens or 0) - (event.cached_tokens or 0)
            if ttft is not None and uncached > 0 and event.status == "ok":
                self._rates.append(ttft / uncached)
        elif isinstance(event, SessionEnd):
            for key in [key for key in self._ttft if key[0] == event.session_id]:
                del self._ttft[key]

    def seconds_per_token(self) -> float | None:
        if not self._rates:
            return None
        return float(np.quantile(np.fromiter(self._rates, float), self.settings.prefill_quantile))


def _key(event: CallEvent) -> tuple[str, str]:
    return (event.session_id, event.call_id)
