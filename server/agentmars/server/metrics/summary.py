"""The metrics of one run (DESIGN.md "Metrics"), computed from its ``RunRecord`` alone,
so a simulated run, a replay on the real stack and a gateway capture are measured by
the same code. Definitions, sources and units: ``docs/metrics.md``.

Three kinds of input:

- ``run``: the run to measure.
- ``ideal``: session id -> the session's record when it ran alone (seed 000 footnote
  1: maximum concurrency one). Its latency there is the session's T_ideal; its calls'
  TTFT and TPOT there are the isolated values seed 002's SLO thresholds scale. Without
  it slowdown, goodput and SLO attainment are ``None``. A run of the workload with
  concurrency one gives it as ``{s.session_id: s for s in alone.sessions}``.
- ``fair_reference``: the same workload under VTC, for seed 004's finish-time fair
  ratio. Without it ``fairness`` is ``None``.

Percentiles are numpy's default (linear interpolation between the closest ranks).
Every rate is over the run's window: from the first arrival to the end of the run,
which is the last completion when every session finished (seed 000 Eq. 1's Delta t).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agentmars.server.metrics.records import CallRecord, RunRecord, SessionRecord

DEFAULT_ALPHAS = (1.0, 2.0, 3.0)
"""Seed 000 §6.3 evaluates goodput at these slack factors."""
DEFAULT_SLO_FACTOR = 5.0
"""NOTE: ours. Seed 002 §IV-A scales the isolated TTFT and TPOT "with a constant
factor" but does not publish it."""
DEFAULT_PROGRESS_BINS = 20
"""Bins of normalized progress for the eviction curve (seed 000 Fig. 3A)."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_END_TOLERANCE_S = 1e-9


class Distribution(BaseModel):
    """Mean and percentiles of a non-empty sample; percentiles use numpy's default
    linear interpolation."""

    model_config = _FROZEN

    n: int = Field(ge=1)
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float


def distribution(values: Iterable[float]) -> Distribution | None:
    """The distribution of ``values``, or None when there are none."""
    sample = np.fromiter(values, dtype=float)
    if sample.size == 0:
        return None
    p50, p90, p95, p99 = np.percentile(sample, (50, 90, 95, 99))
    return Distribution(
        n=int(sample.size),
        mean=float(sample.mean()),
        p50=float(p50),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
    )


class KVSummary(BaseModel):
    """The KV cache over the run."""

    model_config = _FROZEN

    evicted_blocks: int | None
    """Cached blocks removed from the GPU (seed 000 Fig. 3A's block removals); None
    when the run did not measure them."""
    eviction_rate_by_progress: list[float]
    """Evicted blocks per second in equal bins of normalized progress (time since the
    first arrival / window); empty when the run has no window."""
    recomputed_tokens: int
    """Tokens computed again after preemptions by recompute."""
    prefix_hit_rate: float | None
    """Prompt tokens found in the prefix cache / prompt tokens looked up."""
    pinned_block_s: float
    """Blocks held by pins, integrated over time (block-seconds)."""
    preemptions: int
    load_s: float = 0.0
    """Time the calls' KV spent loading back from the CPU tier, summed."""
    load_hidden_share: float | None = None
    """The part of it done before the calls arrived (loads ahead of need); None: no
    loads."""


class CPUSummary(BaseModel):
    """The tool side of the host."""

    model_config = _FROZEN

    tool_queue_s: Distribution | None
    """Tool queueing delay (enqueue to start)."""
    active_tools: float | None
    """Time-averaged number of running tools: their summed run time / window."""
    core_utilisation: float | None
    """Tool busy core-seconds / (tool cores x window)."""


class FairnessSummary(BaseModel):
    """Seed 004's finish-time fair ratio, per agent instance (seed 004's "job": the
    sessions of one task together, ``SessionRecord.instance``): its completion time /
    its completion time under VTC (lower is better; 1 is what fair sharing would have
    given it). An instance's completion time runs from its first session's arrival to
    its last session's end."""

    model_config = _FROZEN

    by_agent: dict[str, float]
    """Mean ratio over the agent instances of each agent class."""
    mean: float
    max: float
    """The worst-case delay relative to VTC (seed 004 §5.2)."""
    at_most_1: float
    """Fraction of agent instances finishing no later than under VTC (seed 004 Fig. 8)."""
    ratios: list[float] = []
    """Every agent instance's ratio, ascending: the CDF of seed 004 Fig. 8."""


class RunSummary(BaseModel):
    """Every metric of one run; ``to_dict()`` is its JSON form."""

    model_config = _FROZEN

    workload: str
    policy: str
    engine: str
    seed: int | None
    sessions: int
    """Sessions that finished."""
    unfinished: int
    """Sessions that arrived but had not finished when the run stopped."""
    window_s: float | None
    """First arrival to the end of the run; the Delta t of every rate below."""
    latency_s: Distribution | None
    """End-to-end latency: arrival to the last token of the last turn."""
    jct_s: Distribution | None = None
    """Seed 004's job completion time, per agent instance (``SessionRecord.instance``):
    its first session's arrival to its last session's end, over the instances all of
    whose sessions finished; None when no session has a ``task_id`` (every session is
    its own job, whose JCT is its latency)."""
    slowdown: Distribution | None
    """Latency / T_ideal."""
    goodput: dict[float, float] | None
    """alpha -> sessions per second finishing within alpha x T_ideal (seed 000 Eq. 1-2)."""
    ttft_s: Distribution | None
    """Time to first token over all calls (submission to the engine to first token)."""
    ttft_by_turn_s: dict[int, Distribution]
    """TTFT per turn index, over the sessions that reached that turn (seed 000 Fig. 3B)."""
    tpot_s: Distribution | None
    """Time per output token after the first, over calls with two or more tokens."""
    step_tpot_s: float | None = None
    """The run's step-level TPOT (seed 002 §III-B): the engine's decode steps' summed
    time over their number; None when the engine counted none (a replay's agents)."""
    slo_factor: float
    slo_attainment: float | None
    """Fraction of sessions whose every call met both SLOs; unfinished sessions fail
    (seed 002 §IV-C)."""
    slo_attainment_calls: float | None
    """Fraction of calls meeting both SLOs."""
    prompt_tokens_per_s: float | None
    output_tokens_per_s: float | None
    steps_per_s: float | None
    loaded_output_tokens_per_s: float | None = None
    """Output tokens of the calls that ended while sessions were still arriving (from
    the first arrival to the last), per second of that span: a closed loop's steady
    state, without the drain of its last sessions (seed 003 §6.1 measures a fixed hour
    of clients that restart at once); None when all sessions arrived at once."""
    loaded_calls_per_s: float | None = None
    """Calls (agent steps) that ended in the same span, per second."""
    moved_sessions: float = 0.0
    """Share of the sessions that moved to another engine replica at least once
    (seed 003 §6.2.2's program churn)."""
    moves_per_session: float = 0.0
    """Replica moves per session (seed 003's switches per program)."""
    kv: KVSummary
    cpu: CPUSummary
    fairness: FairnessSummary | None

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready plain data (``RunSummary.model_validate`` reads
        it back)."""
        return self.model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class _Window:
    start_s: float
    length_s: float

    def rate(self, amount: float) -> float:
        return amount / self.length_s


def summarize(
    run: RunRecord,
    ideal: Mapping[str, SessionRecord] | None = None,
    *,
    fair_reference: RunRecord | None = None,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    slo_factor: float = DEFAULT_SLO_FACTOR,
    progress_bins: int = DEFAULT_PROGRESS_BINS,
) -> RunSummary:
    """Measure ``run``; ``ideal`` (each session's record when run alone) and
    ``fair_reference`` (the same workload under VTC) must hold every session of
    ``run``."""
    _check_parameters(alphas, slo_factor, progress_bins)
    window = _window(run)
    calls = [call for session in run.sessions for call in session.calls]
    isolated = _matched_sessions(run, ideal, "ideal") if ideal is not None else None
    slo_sessions, slo_calls = _slo_attainment(run, isolated, slo_factor)
    return RunSummary(
        workload=run.workload,
        policy=run.policy,
        engine=run.engine,
        seed=run.seed,
        sessions=len(run.sessions),
        unfinished=len(run.unfinished),
        window_s=window.length_s if window else None,
        latency_s=distribution(session.latency_s for session in run.sessions),
        jct_s=_jct(run),
        slowdown=_slowdown(run, isolated),
        goodput=_goodput(run, isolated, alphas, window),
        ttft_s=distribution(call.ttft_s for call in calls),
        ttft_by_turn_s=_ttft_by_turn(calls),
        tpot_s=distribution(tpot for call in calls if (tpot := call.tpot_s) is not None),
        step_tpot_s=run.decode_time_s / run.decode_steps if run.decode_steps else None,
        slo_factor=slo_factor,
        slo_attainment=slo_sessions,
        slo_attainment_calls=slo_calls,
        prompt_tokens_per_s=window.rate(sum(c.prompt_tokens for c in calls)) if window else None,
        output_tokens_per_s=window.rate(sum(c.output_tokens for c in calls)) if window else None,
        steps_per_s=window.rate(run.steps) if window else None,
        **_loaded_rates(run, calls),
        **_churn(run),
        kv=_kv_summary(run, calls, window, progress_bins),
        cpu=_cpu_summary(run, window),
        fairness=_fairness(run, fair_reference) if fair_reference is not None else None,
    )


def _loaded_rates(run: RunRecord, calls: Sequence[CallRecord]) -> dict[str, float | None]:
    """``loaded_output_tokens_per_s`` and ``loaded_calls_per_s``."""
    if not run.sessions:
        return {"loaded_output_tokens_per_s": None, "loaded_calls_per_s": None}
    start = min(session.arrival_s for session in run.sessions)
    stop = max(session.arrival_s for session in run.sessions)
    if not stop > start:
        return {"loaded_output_tokens_per_s": None, "loaded_calls_per_s": None}
    ended = [call for call in calls if start <= call.end_s <= stop]
    span = stop - start
    return {
        "loaded_output_tokens_per_s": sum(call.output_tokens for call in ended) / span,
        "loaded_calls_per_s": len(ended) / span,
    }


def _churn(run: RunRecord) -> dict[str, float]:
    """``moved_sessions`` and ``moves_per_session``."""
    if not run.sessions:
        return {"moved_sessions": 0.0, "moves_per_session": 0.0}
    moved = sum(session.moves > 0 for session in run.sessions)
    moves = sum(session.moves for session in run.sessions)
    return {
        "moved_sessions": moved / len(run.sessions),
        "moves_per_session": moves / len(run.sessions),
    }


def _check_parameters(alphas: Sequence[float], slo_factor: float, progress_bins: int) -> None:
    if not alphas or any(not alpha > 0 for alpha in alphas):
        raise ValueError(f"alphas must be positive numbers, got {list(alphas)}")
    if not slo_factor > 0:
        raise ValueError(f"slo_factor must be positive, got {slo_factor}")
    if progress_bins < 1:
        raise ValueError(f"progress_bins must be at least 1, got {progress_bins}")


def _window(run: RunRecord) -> _Window | None:
    """From the first arrival to the end of the run (None when no session finished)."""
    if not run.sessions:
        return None
    name = f"run {run.policy!r} on {run.workload!r}"
    last_end = max(session.end_s for session in run.sessions)
    if last_end > run.duration_s + _END_TOLERANCE_S:
        raise ValueError(
            f"{name}: a session ends at {last_end} s, after the run's duration_s {run.duration_s} s"
        )
    start = min(session.arrival_s for session in run.sessions)
    if not run.duration_s > start:
        raise ValueError(f"{name}: duration_s {run.duration_s} s is not after the first arrival")
    return _Window(start, run.duration_s - start)


def _matched_sessions(
    run: RunRecord, reference: Mapping[str, SessionRecord], what: str
) -> dict[str, SessionRecord]:
    """The ``reference`` record of each session of ``run``, by session id."""
    missing = [s.session_id for s in run.sessions if s.session_id not in reference]
    if missing:
        raise ValueError(f"{what} lacks {len(missing)} sessions of the run: {missing[:5]}")
    matched = {s.session_id: reference[s.session_id] for s in run.sessions}
    for session_id, session in matched.items():
        if not session.latency_s > 0:
            raise ValueError(f"{what}: session {session_id!r} has latency <= 0")
    return matched


def _sessions_by_id(run: RunRecord, what: str) -> dict[str, SessionRecord]:
    by_id: dict[str, SessionRecord] = {}
    for session in run.sessions:
        if session.session_id in by_id:
            raise ValueError(f"{what} has session {session.session_id!r} twice")
        by_id[session.session_id] = session
    return by_id


def _slowdown(run: RunRecord, isolated: Mapping[str, SessionRecord] | None) -> Distribution | None:
    if isolated is None:
        return None
    return distribution(s.latency_s / isolated[s.session_id].latency_s for s in run.sessions)


def _goodput(
    run: RunRecord,
    isolated: Mapping[str, SessionRecord] | None,
    alphas: Sequence[float],
    window: _Window | None,
) -> dict[float, float] | None:
    """Seed 000 Eq. 1-2: G(alpha) = |{i completed : L_i <= alpha x T_ideal(i)}| / Delta t."""
    if isolated is None:
        return None
    if window is None:  # no session finished: none finished in time either
        return {alpha: 0.0 for alpha in alphas}
    pairs = [(s.latency_s, isolated[s.session_id].latency_s) for s in run.sessions]
    return {
        alpha: window.rate(sum(latency <= alpha * t_ideal for latency, t_ideal in pairs))
        for alpha in alphas
    }


def _ttft_by_turn(calls: Sequence[CallRecord]) -> dict[int, Distribution]:
    by_turn: defaultdict[int, list[float]] = defaultdict(list)
    for call in calls:
        by_turn[call.turn].append(call.ttft_s)
    return {turn: d for turn in sorted(by_turn) if (d := distribution(by_turn[turn])) is not None}


def _slo_attainment(
    run: RunRecord, isolated: Mapping[str, SessionRecord] | None, factor: float
) -> tuple[float | None, float | None]:
    """(fraction of sessions, fraction of calls) within the SLOs; seed 002 §IV-C counts
    a session as attaining its SLO only if none of its calls violates either bound."""
    if isolated is None:
        return None, None
    met_sessions, met_calls, n_calls = 0, 0, 0
    for session in run.sessions:
        alone = _calls_by_turn(isolated[session.session_id])
        met = [_call_meets_slo(call, alone, session.session_id, factor) for call in session.calls]
        met_sessions += all(met)
        met_calls += sum(met)
        n_calls += len(met)
    n_sessions = len(run.sessions) + len(run.unfinished)
    return (
        met_sessions / n_sessions if n_sessions else None,
        met_calls / n_calls if n_calls else None,
    )


def _calls_by_turn(session: SessionRecord) -> dict[int, CallRecord]:
    return {call.turn: call for call in session.calls}


def _call_meets_slo(
    call: CallRecord, alone: Mapping[int, CallRecord], session_id: str, factor: float
) -> bool:
    """TTFT <= factor x isolated TTFT and TPOT <= factor x isolated TPOT (the TPOT bound
    does not apply to one-token answers)."""
    isolated = alone.get(call.turn)
    if isolated is None:
        raise ValueError(f"ideal: session {session_id!r} has no call for turn {call.turn}")
    if call.ttft_s > factor * isolated.ttft_s:
        return False
    tpot, isolated_tpot = call.tpot_s, isolated.tpot_s
    return tpot is None or isolated_tpot is None or tpot <= factor * isolated_tpot


def _kv_summary(
    run: RunRecord, calls: Sequence[CallRecord], window: _Window | None, bins: int
) -> KVSummary:
    load_s = sum(call.load_s for call in calls)
    return KVSummary(
        evicted_blocks=(
            None if run.evictions is None else sum(blocks for _, blocks in run.evictions)
        ),
        eviction_rate_by_progress=_eviction_rate_by_progress(run, window, bins),
        recomputed_tokens=sum(call.recomputed_tokens for call in calls),
        prefix_hit_rate=run.prefix_hits / run.prefix_queries if run.prefix_queries else None,
        pinned_block_s=run.pinned_block_s,
        preemptions=run.preemptions,
        load_s=load_s,
        load_hidden_share=sum(call.load_hidden_s for call in calls) / load_s if load_s else None,
    )


def _eviction_rate_by_progress(run: RunRecord, window: _Window | None, bins: int) -> list[float]:
    """Evicted blocks per second in ``bins`` equal slices of the window (seed 000 Fig.
    3A). A slice is half-open [start, end) except the last, which ends at 1."""
    if window is None or run.evictions is None:
        return []
    blocks = np.zeros(bins)
    for time_s, evicted in run.evictions:
        progress = (time_s - window.start_s) / window.length_s
        # NOTE: nothing is evicted before the first arrival or after the end of the run;
        # clipping only guards the edges against rounding.
        blocks[min(max(int(progress * bins), 0), bins - 1)] += evicted
    return [float(b) for b in blocks / (window.length_s / bins)]


def _cpu_summary(run: RunRecord, window: _Window | None) -> CPUSummary:
    tools = [tool for session in run.sessions for tool in session.tools]
    busy_s = sum(tool.end_s - tool.start_s for tool in tools)
    return CPUSummary(
        tool_queue_s=distribution(tool.queue_s for tool in tools),
        active_tools=window.rate(busy_s) if window else None,
        core_utilisation=(
            window.rate(run.tool_busy_core_s) / run.tool_cores
            if window and run.tool_cores > 0 and run.tool_busy_core_s is not None
            else None
        ),
    )


def _fairness(run: RunRecord, reference: RunRecord) -> FairnessSummary | None:
    """Seed 004 §5.1: a job's completion time over its completion time under VTC; a job
    is an agent instance (§5.1: "a running agent triggered by a given user input")."""
    what = "fair_reference"
    under_vtc = _matched_sessions(run, _sessions_by_id(reference, what), what)
    for session in run.sessions:
        fair_instance = under_vtc[session.session_id].instance
        if fair_instance != session.instance:
            raise ValueError(
                f"{what} puts session {session.session_id!r} in agent instance "
                f"{fair_instance!r}, the run in {session.instance!r}"
            )
    fair_instances = _instances(reference.sessions)
    ratios: dict[str, float] = {}
    agents: dict[str, str] = {}
    for instance, sessions in _instances(run.sessions).items():
        reference_sessions = fair_instances[instance]
        # NOTE: ours — an instance with a session that did not finish in the run (cut
        # by a time limit) has no completion time; it is left out.
        if len(sessions) < len(reference_sessions):
            continue
        ratios[instance] = _completion_s(sessions) / _completion_s(reference_sessions)
        agents[instance] = sessions[0].agent
    if not ratios:
        return None
    by_agent: defaultdict[str, list[float]] = defaultdict(list)
    for instance, ratio in ratios.items():
        by_agent[agents[instance]].append(ratio)
    values = list(ratios.values())
    return FairnessSummary(
        by_agent={agent: float(np.mean(r)) for agent, r in sorted(by_agent.items())},
        mean=float(np.mean(values)),
        max=max(values),
        at_most_1=sum(r <= 1.0 for r in values) / len(values),
        ratios=sorted(values),
    )


def _jct(run: RunRecord) -> Distribution | None:
    """Seed 004 §5.1's JCT ("the duration between job arrival and completion"; a job
    is an agent instance), over the instances all of whose sessions finished."""
    if all(session.task_id is None for session in run.sessions):
        return None
    # NOTE: ours — ``RunRecord.unfinished`` holds session ids only, not their agent
    # instances; an unfinished session is taken to belong to the instance its id
    # names, itself or before a ".": the generators name a branch
    # ``<instance>.<branch>``. Such an instance has no completion time: left out.
    cut: set[str] = set()
    for session_id in run.unfinished:
        parts = session_id.split(".")
        cut.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return distribution(
        _completion_s(sessions)
        for instance, sessions in _instances(run.sessions).items()
        if instance not in cut
    )


def _instances(sessions: Iterable[SessionRecord]) -> dict[str, list[SessionRecord]]:
    """Agent instance -> its sessions, first arrival first (the instance's agent class
    is its first session's: the branches of one agent share it)."""
    by_instance: defaultdict[str, list[SessionRecord]] = defaultdict(list)
    for session in sorted(sessions, key=lambda s: (s.arrival_s, s.session_id)):
        by_instance[session.instance].append(session)
    return dict(by_instance)


def _completion_s(sessions: Sequence[SessionRecord]) -> float:
    """An agent instance's completion time: its first arrival to its last end."""
    return max(s.end_s for s in sessions) - min(s.arrival_s for s in sessions)
