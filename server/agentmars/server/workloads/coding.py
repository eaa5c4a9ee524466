"""Coding-agent sessions: tool durations of seed 003 (MORI), and the session shape
shared with the ILR family (seed 000), which runs OpenHands coding agents.

Tool durations (seed 003 §3.2-3.3, Claude Code on SWE-bench Pro): a mixture of two
lognormals, "short" calls (file reads and edits, quick shell commands: hundreds of
milliseconds to seconds) and "long" ones (test suites, sub-agents, waiting for a
human: tens of seconds to minutes). Fitted (least squares on the relative errors)
to the published p50, p90, p99 and to "87% of calls under 2 s; the 13% longer ones
hold 58% of tool time". The published numbers are not all reachable by one smooth
distribution: P(< 2 s) = 0.87 and p90 = 2.03 s would need 3% of all calls between
2.00 s and 2.03 s, so the fit keeps the percentiles and the time share and lets
the share under 2 s land at 88%:

================================  ==========  ==============================
statistic                         published   this mixture (analytic)
================================  ==========  ==============================
p50                               1.10 s      1.10 s
p90                               2.03 s      2.10 s
p99                               20 s        20.3 s
calls under 2 s                   87%         88.4%
tool time held by calls >= 2 s    58%         58.1%
tail                              "minutes"   p99.9 = 206 s
mean                              --          2.25 s
================================  ==========  ==============================

(`python -m agentmars.server.workloads.stats` measures the generated workloads.)

NOTE: calls are drawn independently. Seed 003 also reports busy phases (runs of
calls under 2 s) lasting a median 20 s; independent draws give runs of ~8 short
calls between calls over 2 s, i.e. ~20 s at ~1.1 s per tool plus ~1.5 s per model
step, so we do not add a phase model. Which kind a call is (and so its CPU demand
and the size of its observation) is ours: short calls are reads, edits, searches
and shell commands; long ones are test runs, and for Claude Code also waits on
sub-agents or the user. A ``ToolMix`` may replace the long component (share,
duration, kinds): ilr-2-cpu's long calls are parallel test suites and builds
(``ilr.CPU_HEAVY_TOOLS``, ours).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from agentmars.server.workloads.model import SessionSpec, ToolSpec
from agentmars.server.workloads.sampling import (
    counts_with_moments,
    lognormal_mean,
    lognormal_median,
    split,
    tokens,
)
from agentmars.server.workloads.sessions import assemble_session
from agentmars.server.workloads.tool_kinds import tool_call

LONG_SHARE = 0.015
SHORT_MEDIAN_S, SHORT_SIGMA = 1.09, 0.48
LONG_MEDIAN_S, LONG_SIGMA = 34.0, 1.2
"""Seed 003's durations (§3.2-3.3, Fig. 3, 5), fitted as above."""

SHORT_KINDS: Mapping[str, float] = {"read": 0.35, "edit": 0.25, "search": 0.15, "bash": 0.25}
"""Kinds of the short calls and their shares (ours: seed 003 names reads, edits and
light shell commands without their shares)."""
OPENHANDS_LONG_KINDS: Mapping[str, float] = {"test": 1.0}
"""Seed 000's OpenHands tools are a terminal, a file editor and a task tracker, with no
sub-agents or human approvals: its long calls are test runs (seed 003's example)."""
CLAUDE_CODE_LONG_KINDS: Mapping[str, float] = {"test": 0.6, "wait": 0.4}
PARALLEL_LONG_KINDS: Mapping[str, float] = {"test-suite": 0.6, "build": 0.4}
"""The CPU-heavy variant's long calls: parallel test suites and builds (whole cores
each, ``tool_kinds.TOOL_CORES``)."""

OBSERVATION_MEDIAN: Mapping[str, float] = {
    "read": 900,
    "edit": 250,
    "search": 400,
    "bash": 350,
    "test": 1200,
    "test-suite": 1200,
    "build": 800,
    "wait": 800,
}
"""Median tokens a tool's observation appends to the context, by kind (ours: a file
view shows ~100 lines, an edit echoes a snippet, a test run prints a report, a build
its warnings and errors)."""
OBSERVATION_SIGMA = 0.9


@dataclass(frozen=True)
class ToolMix:
    """A coding agent's tool calls: seed 003's two lognormal components, short calls
    (``SHORT_KINDS``) and long ones, whose share, duration and kinds may change."""

    long_kinds: Mapping[str, float]
    long_share: float = LONG_SHARE
    long_median_s: float = LONG_MEDIAN_S
    long_sigma: float = LONG_SIGMA

    def mean_observation_tokens(self) -> float:
        """E[append] over the kinds of the calls."""

        def mix_mean(shares: Mapping[str, float]) -> float:
            return sum(share * OBSERVATION_MEDIAN[kind] for kind, share in shares.items())

        short, long = mix_mean(SHORT_KINDS), mix_mean(self.long_kinds)
        mixed = (1 - self.long_share) * short + self.long_share * long
        return mixed * math.exp(OBSERVATION_SIGMA**2 / 2)


OPENHANDS_TOOLS = ToolMix(long_kinds=OPENHANDS_LONG_KINDS)
CLAUDE_CODE_TOOLS = ToolMix(long_kinds=CLAUDE_CODE_LONG_KINDS)


def coding_tool_draws(
    rng: np.random.Generator, size: int, mix: ToolMix
) -> tuple[list[str], list[float]]:
    """Kinds and durations (s) of ``size`` independent calls from the seed 003 mixture."""
    is_long = rng.random(size) < mix.long_share
    walls = np.where(
        is_long,
        lognormal_median(rng, mix.long_median_s, mix.long_sigma, size),
        lognormal_median(rng, SHORT_MEDIAN_S, SHORT_SIGMA, size),
    )
    short = rng.choice(list(SHORT_KINDS), size, p=list(SHORT_KINDS.values()))
    long = rng.choice(list(mix.long_kinds), size, p=list(mix.long_kinds.values()))
    return np.where(is_long, long, short).tolist(), walls.tolist()


def coding_tool_calls(rng: np.random.Generator, size: int, mix: ToolMix) -> list[ToolSpec]:
    kinds, walls = coding_tool_draws(rng, size, mix)
    return [tool_call(kind, wall) for kind, wall in zip(kinds, walls, strict=True)]


def observation_tokens(rng: np.random.Generator, tools: list[ToolSpec]) -> list[int]:
    medians = np.array([OBSERVATION_MEDIAN[tool.kind] for tool in tools], dtype=np.float64)
    return tokens(medians * rng.lognormal(0.0, OBSERVATION_SIGMA, len(tools)))


@dataclass(frozen=True)
class CodingShape:
    """How one coding-agent session is drawn (all sizes in tokens)."""

    agent: str
    turns_mean: float
    turns_sd: float
    system_prompt: int
    """The agent's system prompt and tool definitions, shared by all its sessions."""
    task_median: float
    """The rest of the first prompt (task, repository context): lognormal."""
    task_sigma: float
    output_median: float
    output_sigma: float
    tools: ToolMix
    max_volume: int | None = None
    """Sessions whose prompt volume would exceed this are not sampled (seed 000's
    S-ILR: "a restricted upper bound on the sampled sequence length")."""

    def mean_prompt_volume(self) -> float:
        """E[sum of the prompts of a session] (before any context cap or bound): with n
        turns, first prompt P, appends a and outputs o, the prompts sum to
        n P + (sum over turns of the appends and outputs before them), whose mean is
        E[n] E[P] + (E[a] + E[o]) E[n(n - 1)] / 2."""
        turns = self.turns_mean
        pairs = self.turns_sd**2 + turns**2 - turns
        first = self.system_prompt + lognormal_mean(self.task_median, self.task_sigma)
        growth = self.tools.mean_observation_tokens() + lognormal_mean(
            self.output_median, self.output_sigma
        )
        return turns * first + growth * pairs / 2


Draw = tuple[int, Sequence[int], Sequence[ToolSpec], Sequence[int]]
"""One session's task tokens, outputs, tools and observations."""


def draw_sessions(shape: CodingShape, rng: np.random.Generator, count: int) -> list[Draw]:
    turns = counts_with_moments(rng, shape.turns_mean, shape.turns_sd, count).tolist()
    tasks = tokens(lognormal_median(rng, shape.task_median, shape.task_sigma, count))
    outputs = tokens(lognormal_median(rng, shape.output_median, shape.output_sigma, sum(turns)))
    tools = coding_tool_calls(rng, sum(turns) - count, shape.tools)
    gaps = [n - 1 for n in turns]
    appends = observation_tokens(rng, tools)
    return list(
        zip(tasks, split(outputs, turns), split(tools, gaps), split(appends, gaps), strict=True)
    )


def draw_volume(shape: CodingShape, draw: Draw) -> int:
    """The prompt volume of a drawn session before any context cap: turn j's prompt
    holds the first prompt and every append and output before it."""
    task, outputs, _, appends = draw
    first = shape.system_prompt + task
    growth = [output + append for output, append in zip(outputs, appends, strict=False)]
    return len(outputs) * first + sum(accumulate(growth))


def within_bound(shape: CodingShape, draw: Draw) -> bool:
    return shape.max_volume is None or draw_volume(shape, draw) <= shape.max_volume


def coding_sessions(
    shape: CodingShape, rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[SessionSpec]:
    draws: list[Draw] = []
    while len(draws) < count:
        # NOTE: the first batch is the unbounded shape's sessions, so a bounded
        # regime is its base regime less the sessions that do not fit.
        batch = draw_sessions(shape, rng, count - len(draws))
        draws += [draw for draw in batch if within_bound(shape, draw)]
    return [
        assemble_session(
            f"{prefix}-{i:05d}",
            agent=shape.agent,
            first_prompt=shape.system_prompt + task,
            appends=session_appends,
            outputs=session_outputs,
            tools=session_tools,
            max_context=max_context,
            shared_prefix=shape.system_prompt,
            prefix_group=f"{shape.agent}-system",
        )
        for i, (task, session_outputs, session_tools, session_appends) in enumerate(draws)
    ]


CLAUDE_CODE = CodingShape(
    agent="claude-code",
    turns_mean=30.0,
    turns_sd=17.5,
    system_prompt=15_000,
    task_median=1_500,
    task_sigma=0.6,
    output_median=200,
    output_sigma=0.9,
    tools=CLAUDE_CODE_TOOLS,
)
"""Seed 003's trace: Claude Code on SWE-bench Pro. Only the tool durations are
published; "tens of inference steps" per program (§3.1) gives 30 turns on average
(ours), and the prompt sizes are ours (Claude Code's system prompt and tool
definitions are ~15K tokens)."""
