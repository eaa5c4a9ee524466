"""ReAct and Plan-and-Execute agents on ToolBench tasks: seed 002 (AgentServe) Table I.

A session starts with a cold prefill (system prompt and tool descriptions, not
shared with other sessions: AgentServe observes it is processed "without prefix
caching"), then alternates resume prefills (a tool's output appended) and short
decodes. Table I gives min-max (mean) token counts; each is drawn from a beta
stretched to the published range with the published mean:

================  ===================  ===================  ===================
workload          cold prefill         resume prefill       decode
================  ===================  ===================  ===================
ReAct             2.5K-3.5K (uniform)  30-127, mean 56      21-127, mean 40
  generated       2,500-3,500, 3,000   30-127, 56           21-127, 40
Plan-and-Execute  2.5K-3.5K (uniform)  125-421, mean 251    22-141, mean 60
  generated       2,500-3,500, 3,000   125-421, 251         22-141, 60
================  ===================  ===================  ===================

(Decode: Table I's ranges and means per model -- ReAct 37/45/38, P&E 55/62/64 --
pooled over the three models.)

NOTE: Table I gives no turn counts or tool times. The tasks are ToolBench's, whose
API statistics seed 001 Table 1 publishes: 2.45 +/- 1.81 calls per request and
1.72 +/- 3.33 s per call. A session makes that many tool calls (so has one more
turn), each a remote API call (no host CPU), for both agents: generated, 2.46 +/-
1.82 calls of 1.72 s. The context cap is 8,192 tokens, the smallest of
AgentServe's models (Llama-3-8B). (Generated: 20,000 sessions, seed 0; the
command is in docs/workloads.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmars.server.workloads.model import SessionSpec
from agentmars.server.workloads.sampling import (
    counts_with_moments,
    lognormal_mean_sd,
    scaled_beta,
    tokens,
)
from agentmars.server.workloads.sessions import assemble_session
from agentmars.server.workloads.tool_kinds import tool_call

LLAMA3_8B_CONTEXT = 8_192
COLD_PREFILL = (2_500, 3_500)
TOOLBENCH_CALLS = (2.45, 1.81)
TOOLBENCH_API_S = (1.72, 3.33)


@dataclass(frozen=True)
class LoopShape:
    agent: str
    resume: tuple[int, int, int]
    """min, max, mean tokens of a resume prefill."""
    decode: tuple[int, int, int]
    resume_a: float
    """Beta shape parameter a of the resume prefill (b follows from the mean)."""
    decode_a: float


REACT = LoopShape(
    agent="react", resume=(30, 127, 56), decode=(21, 127, 40), resume_a=1.5, decode_a=1.2
)
PLAN_EXECUTE = LoopShape(
    agent="plan-execute", resume=(125, 421, 251), decode=(22, 141, 60), resume_a=2.0, decode_a=1.5
)


def loop_sessions(
    shape: LoopShape, rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[SessionSpec]:
    calls_mean, calls_sd = TOOLBENCH_CALLS
    turns = counts_with_moments(rng, calls_mean + 1, calls_sd, count, minimum=2).tolist()
    colds = tokens(rng.uniform(*COLD_PREFILL, count))
    return [
        loop_session(shape, rng, f"{prefix}-{i:05d}", n, cold, max_context)
        for i, (n, cold) in enumerate(zip(turns, colds, strict=True))
    ]


def loop_session(
    shape: LoopShape,
    rng: np.random.Generator,
    session_id: str,
    turns: int,
    cold: int,
    max_context: int,
) -> SessionSpec:
    low, high, mean = shape.resume
    resumes = tokens(scaled_beta(rng, low, high, mean, shape.resume_a, turns - 1))
    low, high, mean = shape.decode
    decodes = tokens(scaled_beta(rng, low, high, mean, shape.decode_a, turns))
    walls = lognormal_mean_sd(rng, *TOOLBENCH_API_S, turns - 1)
    return assemble_session(
        session_id,
        agent=shape.agent,
        first_prompt=cold,
        appends=resumes,
        outputs=decodes,
        tools=[tool_call("api", wall) for wall in walls.tolist()],
        max_context=max_context,
    )
