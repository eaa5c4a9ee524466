"""``agentmars demo`` (``make demo``): the whole system at work, on this machine, in a
few minutes.

For MARS, the default policy, and then FCFS (stock vLLM's order): ``agentmars serve``
starts the gateway and the engine (the embedded default, the wall-clock twin paced
from the ``cpu-tiny`` profile; or vLLM CPU with the agentmars plugin and the tiny
model), and agents replay seed 000's ILR-1 coding sessions against it
(``bench.replay``): their LLM calls through the SDK and the gateway, their tools
(reads, greps, edits, the repository's tests) run for real in the sandbox pool, pinned
to their own core. A progress bar per policy; then the comparison, the simulator's
prediction beside each measured run, and ``results.json`` and an HTML report with plots
in ``--out``.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agentmars.bench.replay import (
    ReplayPlan,
    engine_shape,
    failed_runs_line,
    publish_output,
    run_with_progress,
)
from agentmars.bench.session_mix import EngineShape, SandboxShape

PLAN = ReplayPlan(
    workload="ilr-1",
    sessions=16,
    rate=0.5,
    max_turns=8,
    max_context=4096,
    tool_scale=0.5,
    seed=1,
    policies=("mars", "fcfs"),
)
"""ILR-1 (seed 000's lightest) at a load where the engine's KV is contended: 16
sessions of at most 8 calls, contexts scaled to the tiny model's 4,096 tokens, tools at
half their recorded time so that both policies run within the five minutes (ours).
0.5 sessions/s, past the onset of saturation (seed 000's largest gains are there): at
0.4/s the one tool core, which the agents' own process shares, was as much the
bottleneck as the KV, and the two policies were within a run's noise of each other
(MARS 0.98-1.18x FCFS on the twin; docs/replay.md)."""
NUM_BLOCKS = 48
"""KV blocks of the engine: 48 x 128 tokens, about five sessions' contexts, so that
keeping a session's KV across its tool call competes with admitting another (ours)."""
TOOL_SLOTS = 4
"""Tools at once in the sandbox pool, all on the agent core (ours)."""
PROFILE = "cpu-tiny"


def demo_engine(out: Path, vllm_files: tuple[Path, Path] | tuple[None, None]) -> EngineShape:
    """The twin, or vLLM CPU when given its python and model; engine on core 0, the
    agents and their tools on core 1 (seed 000's disjoint cores, in miniature)."""
    return engine_shape(
        vllm_files,
        num_blocks=NUM_BLOCKS,
        max_context=PLAN.max_context,
        cores="0",
        agent_cores="1",
        log_dir=out / "logs",
        profile=PROFILE,
    )


def run_demo(engine: EngineShape, out: Path) -> int:
    """Run it; 0 when every policy's run ended and every session of it finished."""
    _introduce(engine)
    output = run_with_progress(PLAN, engine, SandboxShape(tool_slots=TOOL_SLOTS), out)
    publish_output(output, out)
    failed_runs = failed_runs_line(output)
    if failed_runs is not None:
        Console(stderr=True).print(f"error: {failed_runs}")
    return 1 if failed_runs is not None or any(run.failed for run in output.runs) else 0


def _introduce(engine: EngineShape) -> None:
    name = (
        f"the twin (the simulated engine paced to the wall clock, profile {PROFILE})"
        if engine.twin
        else "vLLM CPU with the agentmars plugin and the tiny model"
    )
    Console().print(
        f"[bold]agentmars demo[/bold]: {PLAN.sessions} {PLAN.workload} coding sessions "
        f"arriving at {PLAN.rate}/s, each up to {PLAN.max_turns} LLM calls and its tools.\n"
        f"Engine: {name}, {NUM_BLOCKS} KV blocks, on core {engine.cores}. Agents and "
        f"tools: core {engine.agent_cores}, tools in the sandbox pool ({TOOL_SLOTS} slots).\n"
        f"Policies, one after the other: {', '.join(PLAN.policies)}."
    )
