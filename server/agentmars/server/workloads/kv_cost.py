"""Seed 004's memory-centric cost (§4.1, Eq. 1): an inference with a prompt of ``p``
tokens that decodes ``d`` holds ``p + i`` tokens of KV while it makes its ``i``-th
token, so its cost is the KV token-time ``sum_{i=1..d} (p + i) = p*d + d^2/2`` (the
paper's closed form, which drops the sum's ``d/2``; kept as published so that costs
compare with its figures). An agent's cost is the sum over its inferences.

It is a property of an inference's token sizes, so it lives with the workloads: the
task-parallel workloads label their agents with it (``agent_prompts``), and Justitia
and SRJF predict and count it.
"""

from __future__ import annotations

from collections.abc import Iterable


def kv_token_time(prompt_tokens: float, output_tokens: float) -> float:
    """One inference's KV token-time, ``p*d + d^2/2``."""
    if prompt_tokens < 0 or output_tokens < 0:
        raise ValueError(f"token counts must not be negative, got {prompt_tokens}, {output_tokens}")
    return prompt_tokens * output_tokens + output_tokens * output_tokens / 2


def agent_cost(inferences: Iterable[tuple[float, float]]) -> float:
    """An agent's KV token-time: the sum over its ``(prompt, output)`` inferences."""
    return sum(kv_token_time(prompt, output) for prompt, output in inferences)
