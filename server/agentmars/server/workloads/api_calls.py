"""API-augmented requests of INFERCEPT's multi-API dataset: seed 001 Table 1.

Each request belongs to one API class and calls that API a number of times during
its generation; the class fixes the call duration and how many calls a request
makes (mean, sd):

========  ====================  =================  ===================================
class     duration (s)          calls per request  generated: duration / calls
========  ====================  =================  ===================================
Math      9e-5 +/- 6e-5         3.75 +/- 1.3       9.01e-5 +/- 5.99e-5 / 3.75 +/- 1.28
QA        0.69 +/- 0.17         2.52 +/- 1.73      0.692 +/- 0.173 / 2.53 +/- 1.71
VE        0.09 +/- 0.014        28.18 +/- 15.2     0.0899 +/- 0.014 / 28.4 +/- 15.2
Chatbot   28.6 +/- 15.6         4.45 +/- 1.96      28.5 +/- 15.3 / 4.43 +/- 1.95
Image     20.03 +/- 7.8         6.91 +/- 3.93      20.0 +/- 7.75 / 6.90 +/- 3.91
TTS       17.24 +/- 7.6         6.91 +/- 3.93      17.2 +/- 7.63 / 6.99 +/- 4.04
========  ====================  =================  ===================================

(Generated: 20,000 requests, seed 0; the command is in docs/workloads.md.)

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


INFERCEPT_CLASSES = (
    ApiClass("math", (9e-5, 6e-5), (3.75, 1.3), response_median=10, output_median=40),
    ApiClass("qa", (0.69, 0.17), (2.52, 1.73), response_median=120, output_median=40),
    ApiClass("ve", (0.09, 0.014), (28.18, 15.2), response_median=25, output_median=15),
    ApiClass("chatbot", (28.6, 15.6), (4.45, 1.96), response_median=150, output_median=60),
    ApiClass("image", (20.03, 7.8), (6.91, 3.93), response_median=30, output_median=40),
    ApiClass("tts", (17.24, 7.6), (6.91, 3.93), response_median=15, output_median=40),
)


def infercept_sessions(
    rng: np.random.Generator, count: int, max_context: int, prefix: str
) -> list[SessionSpec]:
    classes = rng.integers(len(INFERCEPT_CLASSES), size=count).tolist()
    return [
        api_session(INFERCEPT_CLASSES[c], rng, f"{prefix}-{i:05d}", max_context)
        for i, c in enumerate(classes)
    ]


def api_session(
    api: ApiClass, rng: np.random.Generator, session_id: str, max_context: int
) -> SessionSpec:
    calls = int(counts_with_moments(rng, *api.calls, 1)[0])
    walls = lognormal_mean_sd(rng, *api.duration_s, calls)
    return assemble_session(
        session_id,
        agent=api.kind,
        first_prompt=tokens(lognormal_median(rng, PROMPT_MEDIAN, PROMPT_SIGMA, 1))[0],
        appends=tokens(lognormal_median(rng, api.response_median, TOKEN_SIGMA, calls)),
        outputs=tokens(lognormal_median(rng, api.output_median, TOKEN_SIGMA, calls + 1)),
        tools=[tool_call(api.kind, wall) for wall in walls.tolist()],
        max_context=max_context,
    )
