"""The workload generators by name, and how a workload is built from one.

Each generator draws sessions from a seeded ``numpy.random.Generator``; the
calibration of each (published statistic vs. what it produces) is in its module's
docstring and in docs/workloads.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from agentmars.server.workloads.agent_loops import (
    LLAMA3_8B_CONTEXT,
    PLAN_EXECUTE,
    REACT,
    loop_sessions,
)
from agentmars.server.workloads.agent_prompts import (
    elephant_mice_agents,
    elephant_mice_times,
    task_parallel_agents,
)
from agentmars.server.workloads.api_calls import (
    LLAMA3_70B_CONTEXT,
    infercept_sessions,
    toolbench_sessions,
)
from agentmars.server.workloads.arrivals import arrive_together, poisson_times
from agentmars.server.workloads.coding import CLAUDE_CODE, CodingShape, coding_sessions
from agentmars.server.workloads.errors import WorkloadError
from agentmars.server.workloads.ilr import (
    CPU_HEAVY_TOOLS,
    GPT_OSS_CONTEXT,
    ILR_VOLUMES,
    QWEN3_CODER_CONTEXT,
    S_ILR_REGIMES,
    ilr_shape,
    s_ilr_shape,
)
from agentmars.server.workloads.model import SessionSpec, Workload
from agentmars.server.workloads.programs import BFCL, LLAMA_31_CONTEXT, SWE_BENCH, program_sessions
from agentmars.server.workloads.task_parallel import QWEN25_32B_CONTEXT

Units = list[list[SessionSpec]]
"""Sessions grouped by what arrives together (one session, or one agent's branches)."""
Generate = Callable[[np.random.Generator, int, int, str], Units]
"""(rng, count, max_context, name prefix) -> ``count`` arrival units."""
Sessions = Callable[[np.random.Generator, int, int, str], list[SessionSpec]]
Arrivals = Callable[[np.random.Generator, float, int], list[float]]
"""(rng, rate, count) -> the arrival times of ``count`` units, open loop."""


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    max_context: int
    """The context limit of the model the workload was published with."""
    generate: Generate
    arrivals: Arrivals = poisson_times
    """The open-loop arrival process (default: Poisson at ``rate`` per second)."""


def one_per_unit(sessions: Sessions) -> Generate:
    def generate(rng: np.random.Generator, count: int, max_context: int, prefix: str) -> Units:
        return [[session] for session in sessions(rng, count, max_context, prefix)]

    return generate


def _ilr_families() -> list[Family]:
    what = "OpenHands-like coding sessions"
    regimes: list[tuple[str, CodingShape, int, str]] = [
        (
            name,
            ilr_shape(volume),
            QWEN3_CODER_CONTEXT,
            f"seed 000 {name.upper()}: {what}, mean prompt volume {volume / 1000:g}K",
        )
        for name, volume in ILR_VOLUMES.items()
    ]
    regimes += [
        (
            name,
            s_ilr_shape(base),
            GPT_OSS_CONTEXT,
            f"seed 000 {name.upper()}: {base.upper()} sampling, prompt volume at most "
            f"{GPT_OSS_CONTEXT:,}",
        )
        for name, base in S_ILR_REGIMES.items()
    ]
    regimes.append(
        (
            "ilr-2-cpu",
            ilr_shape(ILR_VOLUMES["ilr-2"], CPU_HEAVY_TOOLS),
            QWEN3_CODER_CONTEXT,
            "ILR-2 with CPU-heavy tools (ours): 15% of calls are test suites and builds on 4 cores",
        )
    )
    return [
        Family(
            name,
            f"{description}, context {context:,}",
            context,
            one_per_unit(partial(coding_sessions, shape)),
        )
        for name, shape, context, description in regimes
    ]


def _families() -> dict[str, Family]:
    families = _ilr_families()
    families += [
        Family(
            "swe-bench",
            "Continuum SWE-bench programs: 10.9 turns, tools 925 ms mean, 70K prompt tokens",
            LLAMA_31_CONTEXT,
            one_per_unit(partial(program_sessions, SWE_BENCH)),
        ),
        Family(
            "bfcl",
            "Continuum BFCL programs: 6.3 turns, function calls 1923 ms mean",
            LLAMA_31_CONTEXT,
            one_per_unit(partial(program_sessions, BFCL)),
        ),
        Family(
            "coding-agent",
            "seed 003 Claude Code on SWE-bench Pro: ~30 turns, tools p50 1.1 s, p99 20 s",
            LLAMA_31_CONTEXT,
            one_per_unit(partial(coding_sessions, CLAUDE_CODE)),
        ),
        Family(
            "react",
            "seed 002 ReAct on ToolBench: 3K cold prefill, resumes of ~56, decodes of ~40",
            LLAMA3_8B_CONTEXT,
            one_per_unit(partial(loop_sessions, REACT)),
        ),
        Family(
            "plan-execute",
            "seed 002 Plan-and-Execute on ToolBench: 3K cold prefill, resumes of ~251, "
            "decodes of ~60",
            LLAMA3_8B_CONTEXT,
            one_per_unit(partial(loop_sessions, PLAN_EXECUTE)),
        ),
        Family(
            "infercept",
            "seed 001 INFERCEPT API mix: Math, QA, VE, Chatbot, Image, TTS calls",
            LLAMA3_70B_CONTEXT,
            one_per_unit(infercept_sessions),
        ),
        Family(
            "toolbench",
            "seed 001 ToolBench: 2.45 RapidAPI calls per request of 1.72 s mean, ~1.4K-token "
            "prompts with the API docs",
            LLAMA3_70B_CONTEXT,
            one_per_unit(toolbench_sessions),
        ),
        Family(
            "task-parallel",
            "seed 004 task-parallel agents: small 72%, medium 26%, large 2% (one agent = "
            "its parallel branches)",
            QWEN25_32B_CONTEXT,
            task_parallel_agents,
        ),
        Family(
            "elephant-mice",
            "seed 004 §5.3 starvation test: one MRS elephant agent at t=0, then a mouse agent "
            "(KBQAV, CC or ALFWI) every 1/rate s",
            QWEN25_32B_CONTEXT,
            elephant_mice_agents,
            arrivals=elephant_mice_times,
        ),
    ]
    return {family.name: family for family in families}


FAMILIES = _families()


def workload_names() -> list[str]:
    """The registered generators."""
    return list(FAMILIES)


def describe_workload(name: str) -> str:
    """One line about the workload ``name``."""
    return family(name).description


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise WorkloadError(f"unknown workload {name!r}; known: {', '.join(FAMILIES)}") from None


def build_workload(
    name: str,
    *,
    sessions: int,
    seed: int,
    rate: float | None = None,
    concurrency: int | None = None,
    max_context: int | None = None,
) -> Workload:
    """``sessions`` sessions (agents, for task-parallel and elephant-mice) of the
    workload ``name``.

    Exactly one of ``rate`` (open loop: arrivals per second, Poisson except for
    elephant-mice's evenly spaced mice, ``Family.arrivals``) and
    ``concurrency`` (closed loop: that many sessions at once). ``max_context`` caps
    every call's prompt plus output (a model's context limit); default: the limit of
    the model the workload was published with. The same seed gives the same
    sessions whatever the arrival process (arrivals use their own random stream)."""
    chosen = family(name)
    check_arguments(sessions, seed, rate, concurrency, max_context)
    content_rng, arrival_rng = np.random.default_rng(seed).spawn(2)
    units = chosen.generate(content_rng, sessions, max_context or chosen.max_context, name)
    if rate is not None:
        times = chosen.arrivals(arrival_rng, rate, len(units))
        return Workload(name=name, seed=seed, sessions=tuple(arrive_together(units, times)))
    return Workload(
        name=name,
        seed=seed,
        arrival="closed",
        concurrency=concurrency,
        sessions=tuple(session for unit in units for session in unit),
    )


def check_arguments(
    sessions: int, seed: int, rate: float | None, concurrency: int | None, max_context: int | None
) -> None:
    if (rate is None) == (concurrency is None):
        raise WorkloadError(
            "give exactly one of rate (open loop, sessions per second) and concurrency "
            "(closed loop, sessions at once)"
        )
    if sessions < 1:
        raise WorkloadError(f"sessions must be at least 1 (got {sessions})")
    if seed < 0:
        raise WorkloadError(f"seed must be non-negative (got {seed})")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise WorkloadError(f"rate must be a positive number of sessions per second (got {rate})")
    if concurrency is not None and concurrency < 1:
        raise WorkloadError(f"concurrency must be at least 1 (got {concurrency})")
    if max_context is not None and max_context < 2:
        raise WorkloadError(f"max_context must be at least 2 tokens (got {max_context})")
