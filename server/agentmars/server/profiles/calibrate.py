"""Fit a ``FittedCost`` to timings recorded from a real engine (``agentmars calibrate``).

The measuring (``agentmars.server.profiles.measure``) records, per probe, when each stream
was sent and when each of its tokens arrived. Everything here is pure: turning those
timings into linear equations in the step-time coefficients, solving them with
non-negative least squares, and writing the profile.

Each probe class gives equations of one kind:

- ``prefill``: one stream, ``max_tokens`` 1. Its time to first token is one request's
  overhead (HTTP, queueing into the engine, detokenising) plus the steps of its prompt
  in chunks of ``max_num_batched_tokens``.
- ``decode``: one stream. Each gap between two tokens is one step decoding one
  sequence whose context grows by one token per step.
- ``batch``: N streams started together. Once all are decoding, each gap is one step
  decoding N sequences.
- ``mixed``: N decoding streams, then one more prompt that fits in the step's leftover
  budget: the decode gap that ends with its first token is one step holding both.
- ``resume``: a prompt, then (in the same session) that prompt plus more tokens, as an
  agent's next call after a tool: the second one's time to first token is one
  request's overhead plus the chunks of its uncached tokens, each attending to the
  cached context before it. NOTE: ours: an agent's prefills are mostly such resumes,
  whose attention reads the cached blocks (the paged path), which fresh prompts alone
  do not measure.

Gaps are summed over windows of a few steps, and equations are weighted by one over
the measured time, so the fit minimises relative error: a 2 ms decode step counts as
much as a 400 ms prefill. Equations far off the fit (a probe slowed by another
process) are set aside and the fit repeated (``fit_rows``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agentmars.server.profiles.cost_model import EngineLimits, FittedCost, Profile, chunk_attention

ProbeKind = Literal["prefill", "decode", "batch", "mixed", "resume"]
FEATURES = ("steps", "prefill_tokens", "prefill_attention", "decode_seqs", "decode_context")
"""Step features, in the order of the coefficients c0..c4."""
DEFAULT_WINDOW = 8
"""Decode gaps summed into one equation: enough to average out per-token jitter."""
OUTLIER_SPREADS = 4.0
OUTLIER_REFITS = 4
MIN_OUTLIER_ERROR = 0.05
"""Rows within 5% are never outliers, however tight the rest."""


class StreamRecord(BaseModel):
    """One streamed completion: seconds since the probe started."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(gt=0)
    cached_tokens: int = Field(default=0, ge=0)
    """Prompt tokens the server found in its prefix cache (``resume``'s second stream)."""
    sent_s: float
    token_s: list[float] = Field(min_length=1)
    """Arrival of each output token, in order."""


class ProbeRecord(BaseModel):
    """One probe; for ``mixed`` the last stream is the injected prompt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ProbeKind
    streams: list[StreamRecord] = Field(min_length=1)


class Recording(BaseModel):
    """Everything measured against one server (the raw file ``calibrate`` writes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["agentmars-calibration/1"] = "agentmars-calibration/1"
    url: str
    model: str
    recorded_at: str
    host: str | None = None
    """The measured machine's CPU (``measure.host_cpu_description``): a CPU engine's
    speed is its host's, so a profile only predicts the machine it was fitted on."""
    engine: EngineLimits
    probes: list[ProbeRecord]


@dataclass(frozen=True, slots=True)
class Row:
    """One linear equation: ``seconds = c . features + request_overhead * requests``."""

    kind: ProbeKind
    seconds: float
    features: tuple[float, float, float, float, float]
    requests: int = 0


@dataclass(frozen=True, slots=True)
class ClassError:
    """Relative error of the fitted model on one probe class."""

    rows: int
    mean_abs: float
    max_abs: float
    outliers: int = 0
    """Rows the robust fit set aside (not in ``rows``)."""


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted step-time model and how well it explains the measurements."""

    cost: FittedCost
    request_overhead_s: float
    r_squared: float
    errors: dict[ProbeKind, ClassError]


def kv_bytes_per_token_from_config(config: Mapping[str, object]) -> int:
    """KV bytes per token of a Hugging Face ``config.json``: K and V of every layer's
    KV heads. NOTE: 2 bytes per element whatever the checkpoint's dtype: vLLM's
    ``dtype="auto"`` serves FP32 checkpoints in 16-bit and keeps the KV cache in the
    model's dtype."""

    def field(name: str) -> int:
        value = config.get(name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"model config: {name} must be a positive integer, not {value!r}")
        return value

    layers = field("num_hidden_layers")
    heads = field("num_attention_heads")
    kv_heads = field("num_key_value_heads") if "num_key_value_heads" in config else heads
    head_dim = field("head_dim") if "head_dim" in config else field("hidden_size") // heads
    return 2 * layers * kv_heads * head_dim * 2


# --- probes -> equations ----------------------------------------------------------------

Features = tuple[float, float, float, float, float]


def _add(a: Features, b: Features) -> Features:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


def prefill_features(tokens: int, budget: int, before: int = 0) -> Features:
    """The steps of one prompt alone, in chunks of ``budget`` tokens, after ``before``
    cached tokens."""
    total: Features = (0.0, 0.0, 0.0, 0.0, 0.0)
    done = 0
    while done < tokens:
        chunk = min(budget, tokens - done)
        total = _add(total, (1.0, chunk, chunk_attention(chunk, before + done), 0.0, 0.0))
        done += chunk
    return total


def _windows(count: int, width: int) -> list[tuple[int, int]]:
    """Split gaps 0..count-1 into consecutive windows of ``width``; a short tail joins
    the last window (all gaps form one window when there are fewer than ``width``)."""
    spans = [(start, start + width) for start in range(0, count - width + 1, width)]
    if not spans:
        return [(0, count)] if count else []
    if spans[-1][1] < count:
        spans[-1] = (spans[-1][0], count)
    return spans


def _tokens_by(stream: StreamRecord, moment: float) -> int:
    return sum(1 for t in stream.token_s if t <= moment)


def prefill_rows(probe: ProbeRecord, budget: int) -> list[Row]:
    stream = probe.streams[0]
    ttft = stream.token_s[0] - stream.sent_s
    return [Row("prefill", ttft, prefill_features(stream.prompt_tokens, budget), requests=1)]


def resume_rows(probe: ProbeRecord, budget: int) -> list[Row]:
    """The second prompt's time to first token: its uncached tokens after the cached."""
    stream = probe.streams[-1]
    ttft = stream.token_s[0] - stream.sent_s
    features = prefill_features(
        stream.prompt_tokens - stream.cached_tokens, budget, before=stream.cached_tokens
    )
    return [Row("resume", ttft, features, requests=1)]


def decode_rows(probe: ProbeRecord, window: int) -> list[Row]:
    return _lockstep_rows("decode", probe.streams, probe.streams[0], window)


def batch_rows(probe: ProbeRecord, window: int) -> list[Row]:
    streams = probe.streams
    reference = max(streams, key=lambda s: s.token_s[0])
    return _lockstep_rows("batch", streams, reference, window)


def _lockstep_rows(
    kind: ProbeKind, streams: Sequence[StreamRecord], reference: StreamRecord, window: int
) -> list[Row]:
    """Equations from the reference stream's gaps while every stream decodes: a step's
    context is each stream's prompt plus the tokens it has so far. The reference's
    first gap is left out: it may still carry the tail of the prefill step."""
    times = reference.token_s
    all_decoding = max(s.token_s[0] for s in streams)
    first_done = min(s.token_s[-1] for s in streams)
    gaps = [
        j
        for j in range(1, len(times) - 1)
        if times[j] >= all_decoding and times[j + 1] <= first_done
    ]
    rows = []
    for start, end in _windows(len(gaps), window):
        features: Features = (0.0, 0.0, 0.0, 0.0, 0.0)
        for j in gaps[start:end]:
            middle = (times[j] + times[j + 1]) / 2
            context = sum(s.prompt_tokens + _tokens_by(s, middle) for s in streams)
            features = _add(features, (1.0, 0.0, 0.0, float(len(streams)), float(context)))
        seconds = times[gaps[end - 1] + 1] - times[gaps[start]]
        rows.append(Row(kind, seconds, features))
    return rows


def mixed_rows(probe: ProbeRecord, budget: int) -> list[Row]:
    """The decode gap that ends nearest the injected prompt's first token (none when
    the prompt needs more than the step's leftover budget)."""
    *decoders, injected = probe.streams
    if not decoders or injected.prompt_tokens + len(decoders) > budget:
        return []
    arrival = injected.token_s[0]
    reference = decoders[0]
    times = reference.token_s
    candidates = [j for j in range(len(times) - 1) if times[j] < arrival]
    if not candidates:
        return []
    j = min(candidates, key=lambda k: abs(times[k + 1] - arrival))
    middle = (times[j] + times[j + 1]) / 2
    context = sum(s.prompt_tokens + _tokens_by(s, middle) for s in decoders)
    tokens = injected.prompt_tokens
    features: Features = (
        1.0,
        float(tokens),
        float(chunk_attention(tokens, 0)),
        float(len(decoders)),
        float(context),
    )
    return [Row("mixed", times[j + 1] - times[j], features)]


def recording_rows(recording: Recording, window: int = DEFAULT_WINDOW) -> list[Row]:
    """Every equation the recording's probes give."""
    budget = recording.engine.max_num_batched_tokens
    rows: list[Row] = []
    for probe in recording.probes:
        if probe.kind == "prefill":
            rows += prefill_rows(probe, budget)
        elif probe.kind == "decode":
            rows += decode_rows(probe, window)
        elif probe.kind == "batch":
            rows += batch_rows(probe, window)
        elif probe.kind == "resume":
            rows += resume_rows(probe, budget)
        else:
            rows += mixed_rows(probe, budget)
    return rows


# --- solving ----------------------------------------------------------------------------


def nnls(a: np.ndarray, b: np.ndarray, max_iterations: int | None = None) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    _, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tolerance = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(a.shape)
    for _ in range(max_iterations or 3 * n):
        gradient = a.T @ (b - a @ x)
        if passive.all() or np.max(gradient[~passive]) <= tolerance:
            break
        passive[np.argmax(np.where(passive, -np.inf, gradient))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tolerance).all():
                x = z
                break
            blocking = passive & (z <= tolerance)
            step = np.min(x[blocking] / (x[blocking] - z[blocking]))
            x = x + step * (z - x)
            passive &= x > tolerance
            x[~passive] = 0.0
    return x


def _design(rows: Sequence[Row]) -> tuple[np.ndarray, np.ndarray]:
    a = np.array([[*row.features, row.requests] for row in rows], dtype=float)
    y = np.array([row.seconds for row in rows], dtype=float)
    return a, y


def _solve(a: np.ndarray, y: np.ndarray, *, relative: bool = True) -> np.ndarray:
    """Non-negative coefficients minimising the relative (else the absolute) error of
    ``a x`` against ``y``."""
    weights = y if relative else np.full(len(y), y.mean())
    weighted = a / weights[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    solution: np.ndarray = nnls(weighted / scale, y / weights) / scale
    return solution


def fit_rows(rows: Sequence[Row]) -> Fit:
    """Non-negative coefficients minimising the relative error over ``rows``.

    NOTE: ours: a robust refit. Rows whose relative error exceeds OUTLIER_SPREADS
    robust standard deviations (1.4826 x the median absolute relative error) are set
    aside and the fit repeated, a few times: one probe slowed by another process on the
    machine must not tilt every coefficient."""
    if len(rows) < len(FEATURES) + 1:
        raise ValueError(f"{len(rows)} equations cannot determine {len(FEATURES) + 1} unknowns")
    if any(row.seconds <= 0 for row in rows):
        raise ValueError("measured times must be positive")
    a, y = _design(rows)
    kept = np.ones(len(rows), dtype=bool)
    # NOTE: the first fit weighs absolute errors: under relative weights one short,
    # mis-attributed window (a mixed probe whose prefill fell into another step) can
    # outweigh every other equation and hide from the outlier test it tilted.
    solution = _solve(a, y, relative=False)
    for _ in range(OUTLIER_REFITS):
        relative = np.abs(a @ solution / y - 1.0)
        spread = 1.4826 * float(np.median(relative[kept]))
        now_kept = relative <= max(OUTLIER_SPREADS * spread, MIN_OUTLIER_ERROR)
        if now_kept.sum() <= len(FEATURES) + 1:
            break
        changed = not (now_kept == kept).all()
        kept = now_kept
        solution = _solve(a[kept], y[kept])
        if not changed:
            break
    c0, c1, c2, c3, c4, overhead = (float(v) for v in solution)
    if c0 <= 0:
        raise ValueError(
            "the fit found no per-step time (c0 = 0): the measurements are inconsistent; "
            "record again with more repeats"
        )
    predicted = a @ solution
    residual = float(np.sum((y[kept] - predicted[kept]) ** 2))
    r_squared = 1.0 - residual / float(np.sum((y[kept] - y[kept].mean()) ** 2))
    cost = FittedCost(c0=c0, c1=c1, c2=c2, c3=c3, c4=c4, r_squared=r_squared)
    return Fit(cost, overhead, r_squared, class_errors(rows, predicted, kept.tolist()))


def class_errors(
    rows: Sequence[Row], predicted: Iterable[float], kept: Sequence[bool]
) -> dict[ProbeKind, ClassError]:
    """Mean and largest |predicted / measured - 1| per probe class, over the rows the
    fit kept, and how many it set aside."""
    errors: dict[ProbeKind, list[float]] = {}
    outliers: dict[ProbeKind, int] = {}
    for row, guess, keep in zip(rows, predicted, kept, strict=True):
        errors.setdefault(row.kind, [])
        if keep:
            errors[row.kind].append(abs(guess / row.seconds - 1.0))
        else:
            outliers[row.kind] = outliers.get(row.kind, 0) + 1
    return {
        kind: ClassError(
            len(values),
            sum(values) / len(values) if values else 0.0,
            max(values, default=0.0),
            outliers.get(kind, 0),
        )
        for kind, values in errors.items()
    }


def fit_recording(recording: Recording, window: int = DEFAULT_WINDOW) -> Fit:
    """Fit the step-time coefficients to a recording."""
    return fit_rows(recording_rows(recording, window))


def fitted_profile(
    name: str,
    recording: Recording,
    fit: Fit,
    *,
    cpu_kv_blocks: int,
    cpu_kv_bandwidth_bytes_s: float,
    description: str | None = None,
) -> Profile:
    """The profile of the measured engine with its fitted step time."""
    errors = ", ".join(
        f"{kind} {error.mean_abs:.1%} mean / {error.max_abs:.1%} max"
        + (f" ({error.outliers} outliers set aside)" if error.outliers else "")
        for kind, error in fit.errors.items()
    )
    return Profile(
        name=name,
        description=description
        or f"{recording.model} measured at {recording.url} on {recording.recorded_at}"
        + (f" ({recording.host})" if recording.host else ""),
        sources=[
            f"step time fitted by agentmars calibrate to {len(recording.probes)} probes "
            f"(R^2 {fit.r_squared:.4f}; relative error {errors}; request overhead "
            f"{fit.request_overhead_s * 1e3:.2f} ms)",
            "engine limits as given to / read by agentmars calibrate from the server",
        ],
        **recording.engine.model_dump(),
        cpu_kv_blocks=cpu_kv_blocks,
        cpu_kv_bandwidth_bytes_s=cpu_kv_bandwidth_bytes_s,
        cost=fit.cost,
        request_overhead_s=fit.request_overhead_s,
    )
