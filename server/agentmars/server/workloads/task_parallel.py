"""Task-parallel agents: seed 004 (Justitia) §5.1.

Seed 004 mixes nine agent classes, sampled by size: small (EV, FV, CC, ALFWI,
KBQAV; usually under a minute) 72%, medium (CG, PE, SC; 1-10 minutes) 26%, large
(DM, MRS; over 10 minutes) 2%. An agent is a set of parallel inference tasks
(§2.1): a file summarised chunk by chunk then merged (MRS), merges each followed
by a scoring call (DM), a claim verified per call (EV, FV, CC, KBQAV), several
reasoning paths voted on (SC), candidate programs (CG), a plan executed step by
step with model tools (PE, after HuggingGPT), an ALFWorld episode (ALFWI).

How one agent becomes sessions: each parallel branch is a session; a branch with
several stages (FV's generate-queries then verify, DM's merge then score) is a
multi-turn session whose stages are separated by a zero-length ``handoff`` tool
(ALFWI's steps by ALFWorld environment steps, PE's by model-tool calls). All the
branches of one agent arrive together, carry the agent's class in
``SessionSpec.agent`` and the agent instance in ``prefix_group`` (their shared
input, e.g. the question of SC or the documents of DM, is the shared prefix), and
are named ``<instance>.<branch>``. ``sessions`` in ``build_workload`` counts
agents, not branches.

This module holds the classes and how one agent of a class becomes sessions
(``agent_sessions``); the workloads' generators (``task_parallel_agents`` for
``task-parallel``, ``elephant_mice_agents`` for seed 004 §5.3's ``elephant-mice``)
are in ``agent_prompts``, which draws every agent as it draws the cost predictor's
training samples (``agent_prompts.draw_agent``): a detail instruction first, which
scales the class's output sizes (``agent_prompts.DETAIL``), then the sessions, then
the agent's input text, carried by each of its sessions as ``input_text``.

An aggregation step is a session of its own that waits for the branches it reads
(``SessionSpec.after``): MRS's reduce, ``<instance>.reduce``, reads every map's
summary and starts when the last map ends. Branch counts and token sizes are ours,
chosen so that the classes' mean memory cost (KV token-time, seed 004 §4.1) differs
by about an order of magnitude per size class; the one published size, FV's generate-queries input
of 360-380 tokens (Appendix A), is kept. The context cap is 32,768 tokens
(Qwen2.5-32B, the largest model seed 004 serves).

======  =========  ==========================  ===================================
size    published  generated (20,000 agents)   mean KV token-time per agent (ours)
======  =========  ==========================  ===================================
small   72%        72.4%                       0.46M
medium  26%        25.6%                       4.8M
large   2%         2.0%                        45M
======  =========  ==========================  ===================================

(seed 0; the command is in docs/workloads.md. The detail instructions' output
factors have a geometric mean of 1 but an arithmetic mean of 1.09, and the cost
grows faster than the output: drawn without them the means were 0.40M, 4.0M, 39M.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmars.server.workloads.model import SessionSpec, ToolSpec
from agentmars.server.workloads.sampling import (
    counts_with_moments,
    lognormal_median,
    tokens,
)
from agentmars.server.workloads.sessions import assemble_session
from agentmars.server.workloads.tool_kinds import tool_call

QWEN25_32B_CONTEXT = 32_768
SIZE_SHARES = {"small": 0.72, "medium": 0.26, "large": 0.02}
DENSITY_RATES = {1: 300 / 1080, 2: 300 / 540, 3: 300 / 360}
"""Workload density -> agents per second (the ``rate`` of ``task-parallel``): seed
004 §5.1 submits its 300 agents within 18, 9 and 6 minutes for 1x, 2x and 3x.
NOTE: ours — the arrivals are Poisson at that rate; the paper replays the arrival
times of Mooncake's production traces, which are not here."""
TOKEN_SIGMA = 0.4


@dataclass(frozen=True)
class AgentClass:
    name: str
    size: str
    branches: tuple[float, float]
    """Parallel branches (mean, sd); (1, 0) for one."""
    stages: tuple[float, float]
    """Inference calls per branch (mean, sd); (1, 0) for one."""
    prompt: float
    """Median tokens of a branch's first prompt."""
    shared: float
    """Fraction of it that is the agent's input, common to all branches."""
    output: float
    """Median output tokens of a call."""
    append: float = 0.0
    """Median tokens appended at each later stage."""
    step_kind: str = "handoff"
    step_s: float = 0.0
    """Median duration of the step between stages (lognormal, sigma 0.5)."""
    reduce_output: float = 0.0
    """If set: a last session reads every branch's output, after they all end."""


AGENT_CLASSES = (
    AgentClass("EV", "small", (3, 1.5), (1, 0), prompt=350, shared=0.6, output=120),
    AgentClass("FV", "small", (3, 1.5), (2, 0), prompt=370, shared=0.5, output=80, append=600),
    AgentClass("CC", "small", (3, 1.5), (1, 0), prompt=500, shared=0.6, output=250),
    AgentClass(
        "ALFWI",
        "small",
        (1, 0),
        (10, 4),
        prompt=1_200,
        shared=0.0,
        output=30,
        append=60,
        step_kind="env",
        step_s=0.05,
    ),
    AgentClass("KBQAV", "small", (3, 1.5), (1, 0), prompt=400, shared=0.6, output=150),
    AgentClass("CG", "medium", (4, 2), (1, 0), prompt=600, shared=1.0, output=800),
    AgentClass(
        "PE",
        "medium",
        (1, 0),
        (4, 1.5),
        prompt=1_500,
        shared=0.0,
        output=300,
        append=300,
        step_kind="api",
        step_s=2.0,
    ),
    AgentClass("SC", "medium", (10, 3), (1, 0), prompt=500, shared=1.0, output=500),
    AgentClass("DM", "large", (10, 3), (2, 0), prompt=3_000, shared=0.9, output=600, append=100),
    AgentClass(
        "MRS", "large", (30, 10), (1, 0), prompt=2_500, shared=0.05, output=250, reduce_output=600
    ),
)


@dataclass
class Branch:
    own: int
    """Tokens of its first prompt beyond the agent's shared input."""
    appends: list[int]
    outputs: list[int]
    tools: list[ToolSpec]


def agent_sessions(
    agent: AgentClass, rng: np.random.Generator, instance: str, max_context: int
) -> list[SessionSpec]:
    branches = [draw_branch(agent, rng) for _ in range(draw_count(rng, agent.branches))]
    shared = round(agent.prompt * agent.shared)
    maps = [
        assemble_session(
            f"{instance}.{i}",
            agent=agent.name,
            first_prompt=shared + branch.own,
            appends=branch.appends,
            outputs=branch.outputs,
            tools=branch.tools,
            max_context=max_context,
            shared_prefix=shared if len(branches) > 1 else 0,
            prefix_group=instance,
            task_id=instance,
        )
        for i, branch in enumerate(branches)
    ]
    if not agent.reduce_output:
        return maps
    return [*maps, reduce_session(agent, rng, maps, shared, instance, max_context)]


def draw_branch(agent: AgentClass, rng: np.random.Generator) -> Branch:
    stages = draw_count(rng, agent.stages)
    own = agent.prompt * (1 - agent.shared)
    return Branch(
        own=tokens(lognormal_median(rng, own, TOKEN_SIGMA, 1), minimum=0)[0] if own else 0,
        appends=tokens(lognormal_median(rng, max(agent.append, 1), TOKEN_SIGMA, stages - 1)),
        outputs=tokens(lognormal_median(rng, agent.output, TOKEN_SIGMA, stages)),
        tools=stage_steps(agent, rng, stages - 1),
    )


def reduce_session(
    agent: AgentClass,
    rng: np.random.Generator,
    maps: list[SessionSpec],
    instruction: int,
    instance: str,
    max_context: int,
) -> SessionSpec:
    """The aggregation step: the agent's instruction (its shared input) and every
    branch's last output in, the merged result out, once every branch has ended."""
    read = sum(session.turns[-1].output_tokens for session in maps)
    return assemble_session(
        f"{instance}.reduce",
        agent=agent.name,
        first_prompt=instruction + read,
        appends=[],
        outputs=tokens(lognormal_median(rng, agent.reduce_output, TOKEN_SIGMA, 1)),
        tools=[],
        max_context=max_context,
        task_id=instance,
        after=[session.session_id for session in maps],
    )


def stage_steps(agent: AgentClass, rng: np.random.Generator, size: int) -> list[ToolSpec]:
    walls = lognormal_median(rng, agent.step_s, 0.5, size) if agent.step_s else np.zeros(size)
    return [tool_call(agent.step_kind, wall) for wall in walls.tolist()]


def draw_count(rng: np.random.Generator, moments: tuple[float, float]) -> int:
    mean, sd = moments
    return round(mean) if sd == 0 else int(counts_with_moments(rng, mean, sd, 1)[0])
