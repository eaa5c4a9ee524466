"""SWE-bench-like and BFCL-like agent programs, calibrated to the traces of
Continuum (Li et al., 2025) as restated in notes/baselines.md.

=====================  ==============  ===================================  ===============
statistic              published       how the generator gets it            generated
=====================  ==============  ===================================  ===============
SWE-bench turns        10.9 +/- 2.1    1 + binomial(18, 0.55)               10.90 +/- 2.11
SWE-bench tool time    925 +/- 3550ms  lognormal with that mean and sd      912 +/- 3450 ms
SWE-bench tokens       70K +/- 20K     each program's prompt volume drawn   70.2K +/- 19.9K
                                       from normal(70K, 20K), cut at 17.5K
BFCL turns             6.3 +/- 2.3     1 + Poisson(5.3)                     6.33 +/- 2.28
BFCL tool time         1923 +/- 2133   lognormal with that mean and sd      1.92 +/- 2.17 s
=====================  ==============  ===================================  ===============

(Generated: 20,000 programs, seed 0; docs/workloads.md has the command.)

NOTE: "tokens per program" is read as the prompt volume (the sum of the prompts of
the program's calls), the same reading as seed 000's volumes (``ilr.py``): 10.9
calls of ~6.4K tokens on average. A program is first drawn with natural
proportions (a ~3K first prompt, observations of ~800 tokens, actions of ~150
tokens: ours) and its first prompt and observations are then scaled so that its
volume is the drawn one; outputs keep their size. BFCL's token sizes are not
published; ours are a ~2K-token prompt with the function documentation, function
results of ~200 tokens and calls of ~60.
The tools: SWE-bench's are shell commands in the task's container (one core);
BFCL's are function executions that wait on APIs (no host CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agentmars.server.workloads.model import SessionSpec
from agentmars.server.workloads.sampling import (
    counts_with_moments,
    lognormal_mean_sd,
    lognormal_median,
    split,
    tokens,
)
from agentmars.server.workloads.sessions import assemble_session
from agentmars.server.workloads.tool_kinds import tool_call

LLAMA_31_CONTEXT = 131_072
"""Continuum serves Llama-3.1 8B / 70B."""


@dataclass(frozen=True)
class ProgramShape:
    agent: str
    turns_mean: float
    turns_sd: float
    tool_kind: str
    tool_mean_s: float
    tool_sd_s: float
    first_median: float
    append_median: float
    append_sigma: float
    output_median: float
    output_sigma: float
    volume_mean: float | None = None
    """When set, each program's prompt volume is drawn from normal(mean, sd)..."""
    volume_sd: float = 0.0
    first_sigma: float = 0.3


SWE_BENCH = ProgramShape(
    agent="swe-bench",
    turns_mean=10.9,
    turns_sd=2.1,
    tool_kind="bash",
    tool_mean_s=0.925,
    tool_sd_s=3.55,
    first_median=3_000,
    append_median=500,
    append_sigma=1.0,
    output_median=120,
    output_sigma=0.6,
    volume_mean=70_000,
    volume_sd=20_000,
)
BFCL = ProgramShape(
    agent="bfcl",
    turns_mean=6.3,
    turns_sd=2.3,
    tool_kind="function",
    tool_mean_s=1.923,
    tool_sd_s=2.133,
    first_median=2_000,
    append_median=150,
    append_sigma=0.8,
    output_median=50,
    output_sigma=0.6,
)


def program_sessions(
    shape: ProgramShape, rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[SessionSpec]:
    turns = counts_with_moments(rng, shape.turns_mean, shape.turns_sd, count).tolist()
    gaps = [n - 1 for n in turns]
    firsts = lognormal_median(rng, shape.first_median, shape.first_sigma, count).tolist()
    appends = lognormal_median(rng, shape.append_median, shape.append_sigma, sum(gaps)).tolist()
    outputs = tokens(lognormal_median(rng, shape.output_median, shape.output_sigma, sum(turns)))
    walls = lognormal_mean_sd(rng, shape.tool_mean_s, shape.tool_sd_s, sum(gaps)).tolist()
    if shape.volume_mean is None:
        volumes: list[float | None] = [None] * count
    else:
        drawn = rng.normal(shape.volume_mean, shape.volume_sd, count)
        volumes = np.maximum(drawn, shape.volume_mean / 4).tolist()
    return [
        program_session(shape, f"{prefix}-{i:05d}", draw, max_context)
        for i, draw in enumerate(
            zip(
                firsts,
                split(appends, gaps),
                split(outputs, turns),
                split(walls, gaps),
                volumes,
                strict=True,
            )
        )
    ]


Draw = tuple[float, Sequence[float], Sequence[int], Sequence[float], float | None]
"""One program's first prompt, appends, outputs, tool times and target volume."""


def program_session(
    shape: ProgramShape, session_id: str, draw: Draw, max_context: int
) -> SessionSpec:
    first, appends, outputs, walls, volume = draw
    scale = 1.0 if volume is None else volume_scale(first, appends, outputs, volume)
    return assemble_session(
        session_id,
        agent=shape.agent,
        first_prompt=max(1, round(first * scale)),
        appends=tokens(np.array(appends) * scale),
        outputs=outputs,
        tools=[tool_call(shape.tool_kind, wall) for wall in walls],
        max_context=max_context,
    )


def volume_scale(
    first: float, appends: Sequence[float], outputs: Sequence[int], volume: float
) -> float:
    """The factor on the first prompt and the appends that makes the session's prompt
    volume ``volume``. The volume is n P + sum_i (n - i) a_i + sum_i (n - 1 - i) o_i
    (turn i's append is in the prompts of turns i..n-1, its output in those after
    it); outputs are kept, so the factor is (volume - outputs' part) / (the rest).
    Floored at 0.05 for the rare program whose outputs alone nearly fill it."""
    n = len(outputs)
    output_part = sum((n - 1 - i) * o for i, o in enumerate(outputs))
    scaled_part = n * first + sum((n - 1 - i) * a for i, a in enumerate(appends))
    return max((volume - output_part) / scaled_part, 0.05)
