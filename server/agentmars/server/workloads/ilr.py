"""ILR-1..4 and S-ILR-1..3: seed 000's input-length regimes (§6.1, Fig. 6), and
ilr-2-cpu, ILR-2 with CPU-heavy tools (ours).

Seed 000 samples OpenHands coding sessions from a pool of SWE-bench, GitTaskBench,
Terminal-Bench, RepoBench and coBench tasks into four regimes of rising "mean
request-level prompt volume": 125K, 167K, 220K and 263K tokens. We read that
volume as the sum of the prompts of a session's LLM calls
(``SessionSpec.prompt_volume``): ILR-4's 263K exceeds Qwen3-Coder's 262K context, so
it cannot be the prompt of one call. The regimes differ "primarily in context size
rather than task difficulty" (the isolated completion times stay in the same
range), so here they share everything but the size of the first prompt.

An ILR session looks like an OpenHands session on SWE-bench:

- turns: 10.9 +/- 2.1, Continuum's SWE-bench programs (notes/baselines.md);
  seed 000 publishes no turn count and SWE-bench is one of its five benchmarks;
- tools: seed 003's coding-tool durations (``coding.py``), the long calls being
  test runs (seed 000's OpenHands has a terminal, a file editor and a task
  tracker: no sub-agents or human approvals);
- sizes (ours, ``NOTE:``): a 4K-token system prompt shared by all sessions, then
  the task and the repository context it pulls in (lognormal, sigma 0.6), one tool
  observation appended per turn (``coding.OBSERVATION_MEDIAN``) and outputs of
  ~200 tokens (tool-call actions).

Only the median of the task part of the first prompt differs between regimes; it is
solved from the target volume with ``CodingShape.mean_prompt_volume``.

S-ILR-1..3 are sampled "the same way except with a restricted upper bound on the
sampled sequence length" for GPT-OSS-120B's 131K context. We read the sampled
length as the quantity the regimes are sampled by (Fig. 6's input length, the
prompt volume), and the bound, which is not published, as the model's 131,072
tokens: S-ILR-k is ILR-k less its sessions whose prompt volume exceeds 131,072.
Their volumes follow from that (they are no longer chosen).

=========  ==============  ==================  ============  ===============================
workload   target volume   generated volume    turns         mean first prompt (task median)
=========  ==============  ==================  ============  ===============================
ILR-1      125,000         125,074             10.90 ± 2.11  6.3K (1.9K)
ILR-2      167,000         167,186             10.90 ± 2.11  10.1K (5.1K)
ILR-3      220,000         220,327             10.90 ± 2.11  15.0K (9.2K)
ILR-4      263,000         263,441             10.90 ± 2.11  19.0K (12.5K)
S-ILR-1    <= 131,072      96,774              9.83 ± 1.68   5.9K (ILR-1's)
S-ILR-2    <= 131,072      103,316             9.10 ± 1.59   8.0K (ILR-2's)
S-ILR-3    <= 131,072      106,801             8.51 ± 1.57   9.6K (ILR-3's)
ilr-2-cpu  167,000         167,246             10.90 ± 2.11  9.6K (4.7K)
=========  ==============  ==================  ============  ===============================

Generated: 20,000 sessions, seed 0 (``python -m agentmars.server.workloads.stats
--sessions 20000 --seed 0``; docs/workloads.md).
"""

from __future__ import annotations

import math
from dataclasses import replace

from agentmars.server.workloads.coding import (
    OPENHANDS_TOOLS,
    PARALLEL_LONG_KINDS,
    CodingShape,
    ToolMix,
)

QWEN3_CODER_CONTEXT = 262_144
GPT_OSS_CONTEXT = 131_072

ILR_VOLUMES = {"ilr-1": 125_000, "ilr-2": 167_000, "ilr-3": 220_000, "ilr-4": 263_000}
"""Seed 000 §6.1, Fig. 6: mean request-level prompt volume of ILR-1..4 (tokens)."""
S_ILR_REGIMES = {"s-ilr-1": "ilr-1", "s-ilr-2": "ilr-2", "s-ilr-3": "ilr-3"}
"""Each S-ILR regime is its ILR regime's sampling under GPT-OSS-120B's bound."""

OPENHANDS = CodingShape(
    agent="openhands",
    turns_mean=10.9,
    turns_sd=2.1,
    system_prompt=4_000,
    task_median=1.0,
    task_sigma=0.6,
    output_median=150,
    output_sigma=0.8,
    tools=OPENHANDS_TOOLS,
)
"""The regime-independent part. Turns: 10.9 +/- 2.1, Continuum's SWE-bench programs
(notes/baselines.md; SWE-bench is one of seed 000's five benchmarks). Tools: seed 003's
durations. Ours: the 4K-token system prompt, the task's lognormal spread, outputs of
~200 tokens on average, observation sizes (``coding.OBSERVATION_MEDIAN``)."""

CPU_HEAVY_TOOLS = ToolMix(
    long_kinds=PARALLEL_LONG_KINDS, long_share=0.15, long_median_s=10.0, long_sigma=0.7
)
"""ilr-2-cpu's tools (ours, ``NOTE:`` no seed publishes a tool's CPU demand): seed
003's short calls, but 15% of the calls (seed 003: 1.5%) are parallel test suites and
builds on 4 whole cores (``tool_kinds.PARALLEL_CORES``) lasting seconds to tens of
seconds (median 10 s, sigma 0.7): 1.5 runs per session, an agent that reproduces the
failure and checks its fix with the suite or a rebuild (SWE-bench's test loops,
Terminal-Bench's compile tasks). Sized so that 0.25 sessions/s keep ~80% of 16 tool cores busy
(docs/workloads.md "CPU pressure")."""


def ilr_shape(target_volume: float, tools: ToolMix = OPENHANDS_TOOLS) -> CodingShape:
    """The OpenHands shape whose mean prompt volume is ``target_volume``: the task
    part of the first prompt scales, everything else stays."""
    shape = replace(OPENHANDS, tools=tools)
    base = replace(shape, task_median=0.0).mean_prompt_volume()
    unit = shape.turns_mean * math.exp(shape.task_sigma**2 / 2)
    median = (target_volume - base) / unit
    if median <= 0:
        raise ValueError(f"volume {target_volume} is below what the turns alone add ({base:.0f})")
    return replace(shape, task_median=median)


def s_ilr_shape(regime: str) -> CodingShape:
    """S-ILR: the ILR regime's sampling, keeping only sessions whose prompt volume (the
    "input length" the regimes are sampled by) is within GPT-OSS-120B's 131,072
    tokens (the paper's bound is unpublished; ours is the model's limit)."""
    return replace(ilr_shape(ILR_VOLUMES[regime]), max_volume=GPT_OSS_CONTEXT)
