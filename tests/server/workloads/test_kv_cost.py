"""Seed 004's memory-centric cost (Eq. 1), on numbers worked out by hand."""

from __future__ import annotations

import pytest

from agentmars.server.workloads.kv_cost import agent_cost, kv_token_time


def test_an_inference_costs_its_kv_token_time() -> None:
    # A 10-token prompt decoding 4 tokens: 10 x 4 + 4^2 / 2 = 48 token-steps of KV.
    assert kv_token_time(10, 4) == 48
    assert kv_token_time(10, 0) == 0  # no decode, no KV held over steps


def test_an_agent_costs_the_sum_of_its_inferences() -> None:
    assert agent_cost([(10, 4), (100, 2)]) == 48 + (200 + 2)


def test_negative_token_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        kv_token_time(-1, 4)
