"""API-augmented requests of seed 001's datasets (Table 1): INFERCEPT's multi-API
mix (``infercept``) and ToolBench (``toolbench``).

Each request belongs to one API class and calls that API a number of times during
its generation; the class fixes the call duration and how many calls a request
makes (mean, sd):

=========  ====================  =================  ===================================
class      duration (s)          calls per request  generated: duration / calls
=========  ====================  =================  ===================================
Math       9e-5 +/- 6e-5         3.75 +/- 1.3       9.01e-5 +/- 5.99e-5 / 3.75 +/- 1.28
QA         0.69 +/- 0.17         2.52 +/- 1.73      0.692 +/- 0.173 / 2.53 +/- 1.71
VE         0.09 +/- 0.014        28.18 +/- 15.2     0.0899 +/- 0.014 / 28.4 +/- 15.2
Chatbot    28.6 +/- 15.6         4.45 +/- 1.96      28.5 +/- 15.3 / 4.43 +/- 1.95
Image      20.03 +/- 7.8         6.91 +/- 3.93      20.0 +/- 7.75 / 6.90 +/- 3.91
TTS        17.24 +/- 7.6         6.91 +/- 3.93      17.2 +/- 7.63 / 6.99 +/- 4.04
ToolBench  1.72 +/- 3.33         2.45 +/- 1.81      1.71 +/- 3.45 / 2.44 +/- 1.80
=========  ====================  =================  ===================================

(Generated: 20,000 requests of each workload, seed 0; the commands are in
docs/workloads.md.)

Durations are lognormal with the class's mean and sd; call counts are 1 + a
negative binomial (binomial for Math, whose count is under-dispersed) with the
class's mean and sd (``sampling.counts_with_moments``). A request with k calls has
k + 1 turns: generation up to the call, the call, generation resumed with the API's
response appended.

NOTE (ours): the six classes are equally likely (the dataset's mix is not
published); token sizes per class are ours (a ~340-token prompt; responses of a
few tokens for Math and TTS, ~100 for QA and Chatbot; VE's environment steps are
short, so its ~28 calls fit the context); Math (a calculator) and VE (a simulated
environment) run on the host, the other classes wait on remote models. The context
cap is 8,192 tokens (Llama-3-70B, the largest model seed 001 serves), which keeps
VE's long requests whole.

ToolBench: Table 1 gives its calls no type ("-"); they are RapidAPI calls across
ToolBench's 49 categories (seed 001 §4), so one class, ``rapidapi``, a remote
service (no host CPU: ``tool_kinds.canonical_kind`` counts an unknown name as
``api``). NOTE (ours: seed 001 publishes no ToolBench token sizes): the first
prompt is ToolBench's system prompt with the documentation of the query's APIs plus
the query, typically ~1-2K tokens (lognormal, median 1,400, sigma 0.5: interquartile
1.0K-2.0K, mean ~1.6K). A response is lognormal (median 150) cut at
``TOOLBENCH_RESPONSE_CAP`` = 300 tokens, the 1,024 characters of an observation
ToolBench keeps (OpenBMB/ToolBench ``rapidapi_wrapper.step``,
``--max_observation_length 1024``; ~3.4 characters per token of JSON, ours): mean
163, 8% at the cap. Each segment generates a thought and a function call of median
80 tokens (mean ~90, p99.9 ~370: inside the 0-500 range of seed 001's 50-bin x
10-token ToolBench output predictor, Appendix C.1). Seed 002 measured cold
prefills of 2.5K-3.5K on ToolBench with its agents' own prompts (``agent_loops``);
ours is ToolBench's plain prompt. The context cap is 8,192 tokens as for INFERCEPT
(Llama-3-70B; also ToolLLaMA's ``--max_sequence_length``); it cuts 7 requests in
20,000 (a prompt in the far tail). GPT-J 6B's 2,048, which seed 001 also serves
ToolBench on, would cut 53% of them (``max_context=2048``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentmars.server.workloads.agent_loops import TOOLBENCH_API_S, TOOLBENCH_CALLS
from agentmars.server.workloads.model import SessionSpec
from agentmars.server.workloads.sampling import (
    counts_with_moments,
    lognormal_mean_sd,
    lognormal_median,
    tokens,
)
from agentmars.server.workloads.sessions import assemble_session
from agentmars.server.workloads.tool_kinds import tool_call

LLAMA3_70B_CONTEXT = 8_192
PROMPT_MEDIAN, PROMPT_SIGMA = 300, 0.5
TOKEN_SIGMA = 0.5


@dataclass(frozen=True)
class ApiClass:
    kind: str
    duration_s: tuple[float, float]
    calls: tuple[float, float]
    response_median: float
    """Tokens the API's response appends (ours)."""
    output_median: float
    """Tokens generated before each call and after the last (ours)."""
    prompt_median: float = PROMPT_MEDIAN
    """Median tokens of the first prompt (ours)."""
    response_cap: int | None = None
    """Most tokens a response appends (an API wrapper that truncates), or no cap."""


INFERCEPT_CLASSES = (
    ApiClass("math", (9e-5, 6e-5), (3.75, 1.3), response_median=10, output_median=40),
    ApiClass("qa", (0.69, 0.17), (2.52, 1.73), response_median=120, output_median=40),
    ApiClass("ve", (0.09, 0.014), (28.18, 15.2), response_median=25, output_median=15),
    ApiClass("chatbot", (28.6, 15.6), (4.45, 1.96), response_median=150, output_median=60),
    ApiClass("image", (20.03, 7.8), (6.91, 3.93), response_median=30, output_median=40),
    ApiClass("tts", (17.24, 7.6), (6.91, 3.93), response_median=15, output_median=40),
)


TOOLBENCH_RESPONSE_CAP = 300
"""ToolBench keeps the first 1,024 characters of an observation (``rapidapi_wrapper``,
``--max_observation_length``): ~300 tokens of JSON at ~3.4 characters a token (ours)."""
TOOLBENCH_API = ApiClass(
    "rapidapi",
    TOOLBENCH_API_S,
    TOOLBENCH_CALLS,
    response_median=150,
    output_median=80,
    prompt_median=1_400,
    response_cap=TOOLBENCH_RESPONSE_CAP,
)


def infercept_sessions(
    rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[SessionSpec]:
    classes = rng.integers(len(INFERCEPT_CLASSES), size=count).tolist()
    return [
        api_session(INFERCEPT_CLASSES[c], rng, f"{prefix}-{i:05d}", max_context)
        for i, c in enumerate(classes)
    ]


def toolbench_sessions(
    rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[SessionSpec]:
    return [api_session(TOOLBENCH_API, rng, f"{prefix}-{i:05d}", max_context) for i in range(count)]


def api_session(
    api: ApiClass, rng: np.random.Generator, session_id: str, max_context: int
) -> SessionSpec:
    calls = int(counts_with_moments(rng, *api.calls, 1)[0])
    walls = lognormal_mean_sd(rng, *api.duration_s, calls)
    first_prompt = tokens(lognormal_median(rng, api.prompt_median, PROMPT_SIGMA, 1))[0]
    responses = lognormal_median(rng, api.response_median, TOKEN_SIGMA, calls)
    if api.response_cap is not None:
        responses = np.minimum(responses, api.response_cap)
    return assemble_session(
        session_id,
        agent=api.kind,
        first_prompt=first_prompt,
        appends=tokens(responses),
        outputs=tokens(lognormal_median(rng, api.output_median, TOKEN_SIGMA, calls + 1)),
        tools=[tool_call(api.kind, wall) for wall in walls.tolist()],
        max_context=max_context,
    )
