"""ILR-1..4 and S-ILR-1..3: seed 000's input-length regimes (§6.1, Fig. 6).

Seed 000 samples OpenHands coding sessions from a pool of SWE-bench, GitTaskBench,
Terminal-Bench, RepoBench and coBench tasks into four regimes of rising "mean
request-level prompt volume": 125K, 167K, 220K and 263K tokens. We read that
volume as the sum of the prompts of a session's LLM calls
(``SessionSpec.prompt_volume``): ILR-4's 263K exceeds Qwen3-Coder's 262K context, so
it cannot be the prompt of one call. The regimes differ "primarily in context size
rather than task difficulty" (the isolated completion times stay in the same
range), so here they share everything but the size of the first prompt.

An ILR session looks like an OpenHands session: a repository-scale first prompt
(OpenHands' system prompt and tool definitions, shared by all sessions, plus the
task and the repository context it pulls in), then one tool observation appended
per turn and short outputs (tool-call actions). The tools are seed 003's
coding-agent tools (``coding.py``) with the long calls being test runs. All of
these sizes are ours (``NOTE:``): the paper publishes only the volumes. Only the
median of the task part of the first prompt differs between regimes; it is solved
from the target volume with ``CodingShape.mean_prompt_volume``.

S-ILR-1..3 are sampled "the same way except with a restricted upper bound on the
sampled sequence length" for GPT-OSS-120B's 131K context. Their volumes are not
published; ours are ILR-1..3's scaled by the ratio of the context limits
(131K / 262K): 62.5K, 83.5K and 110K, and every call is capped at 131,072 tokens.

=========  ==============  ===========  ==================  ==============================
workload   target volume   max context  generated volume    mean first prompt (task median)
=========  ==============  ===========  ==================  ==============================
ILR-1      125,000         262,144      125,278             16.8K (10.7K)
ILR-2      167,000         262,144      167,567             23.8K (16.6K)
ILR-3      220,000         262,144      220,916             32.6K (23.9K)
ILR-4      263,000         262,144      263,404             39.7K (29.9K)
S-ILR-1     62,500         131,072       62,348              6.4K (2.0K)
S-ILR-2     83,500         131,072       83,493              9.9K (4.9K)
S-ILR-3    110,000         131,072      110,175             14.3K (8.6K)
=========  ==============  ===========  ==================  ==============================

Generated: 20,000 sessions, seed 0 (``python -m agentmars.server.workloads.stats
--sessions 20000 --seed 0``; docs/workloads.md).
"""

from __future__ import annotations

import math
from dataclasses import replace

from agentmars.server.workloads.coding import OPENHANDS_LONG_KINDS, CodingShape

QWEN3_CODER_CONTEXT = 262_144
GPT_OSS_CONTEXT = 131_072

ILR_VOLUMES = {"ilr-1": 125_000, "ilr-2": 167_000, "ilr-3": 220_000, "ilr-4": 263_000}
S_ILR_VOLUMES = {"s-ilr-1": 62_500, "s-ilr-2": 83_500, "s-ilr-3": 110_000}

OPENHANDS = CodingShape(
    agent="openhands",
    turns_mean=6.0,
    turns_sd=4.2,
    system_prompt=4_000,
    task_median=1.0,
    task_sigma=0.6,
    output_median=150,
    output_sigma=0.8,
    long_kinds=OPENHANDS_LONG_KINDS,
)
"""The regime-independent part (ours): 6 +/- 4.2 turns (one in ten sessions has 12 or
more), a 4K-token system prompt, outputs of ~200 tokens on average."""


def ilr_shape(target_volume: float) -> CodingShape:
    """The OpenHands shape whose mean prompt volume is ``target_volume``: the task
    part of the first prompt scales, everything else stays."""
    base = replace(OPENHANDS, task_median=0.0).mean_prompt_volume()
    unit = OPENHANDS.turns_mean * math.exp(OPENHANDS.task_sigma**2 / 2)
    median = (target_volume - base) / unit
    if median <= 0:
        raise ValueError(f"volume {target_volume} is below what the turns alone add ({base:.0f})")
    return replace(OPENHANDS, task_median=median)
