"""An unmodified OpenHands-style agent on the real stack: its requests carry no
agentmars field, only its conversation id as OpenAI's ``prompt_cache_key`` (body) and
LiteLLM's ``x-litellm-session-id`` (header). The gateway makes one session of the
conversation, and vLLM's plugin (Continuum, linked to the gateway by the side channel
as ``agentmars serve`` links them) pins the conversation's KV between its calls, so
the next call finds its context in the prefix cache.

The calls are text completions of token ids (the gateway reads the same fields on
``/v1/chat/completions``, which OpenHands uses), so the prefix-cache hit is exact.
One vLLM server (64 blocks of 128 tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.sdk.events import LLMSubmit
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, SERVED_MODEL_NAME
from agentmars.server.engines.vllm.smoke import model_vocab_size, random_prompt
from tests.server.engines.vllm.helpers import (
    LinkedEngine,
    admitted_sessions,
    blocks,
    engine_metric,
    eventually,
    kv_status,
    linked_gateway,
    linked_vllm,
    released,
)

TOKEN = "openhands-token"
SETTINGS = {"ttl_s": 30.0}
"""Longer than the test: the pin goes by the conversation's next call, not by expiry."""
USABLE_BLOCKS = 63
"""64 blocks, less vLLM's null block."""
CONVERSATION = "3f2a9c41e8d54b6f9a0c7e5d21b8f604"
"""An OpenHands conversation id."""
CONTEXT_TOKENS = 1300
CONTEXT_BLOCKS = CONTEXT_TOKENS // CPU_BLOCK_SIZE
"""The first call's prompt, 1,300 tokens (+ 4 output): its 10 full blocks (1,280
tokens) are hashed and pinned for the conversation."""
DISPLACING_TOKENS = 2600
DISPLACING_CALLS = 3
"""Calls of no session between the conversation's two: 3 x 21 blocks, more than the 53
left beside the pin, so every cached block that is not pinned is evicted and the
second call's hit can only come from the pin."""


@pytest.fixture(scope="class")
def continuum(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LinkedEngine]:
    folder = tmp_path_factory.mktemp("openhands")
    with linked_vllm(vllm_python, folder, "continuum", settings=SETTINGS) as engine:
        yield engine


def _openhands_call(client: httpx.Client, prompt: list[int]) -> dict[str, Any]:
    """A request as OpenHands (through LiteLLM) sends it: the conversation id in
    ``prompt_cache_key`` and ``x-litellm-session-id``, nothing of agentmars'."""
    response = client.post(
        "/v1/completions",
        json={
            "model": SERVED_MODEL_NAME,
            "prompt": prompt,
            "max_tokens": 4,
            "ignore_eos": True,
            "prompt_cache_key": CONVERSATION,
        },
        headers={"x-litellm-session-id": CONVERSATION},
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _active_sessions(client: httpx.Client) -> float:
    return admitted_sessions(client.get("/metrics").text)


class TestOpenHandsOnVllm:
    @pytest.mark.slow
    def test_a_conversation_is_one_session_at_the_gateway_and_in_vllms_pins(
        self, continuum: LinkedEngine
    ) -> None:
        vocab_size = model_vocab_size(continuum.config.model)
        context = random_prompt(CONTEXT_TOKENS, vocab_size, seed=1)
        with linked_gateway(continuum, TOKEN, "continuum", policy_settings=SETTINGS) as (
            client,
            gateway,
        ):
            start = kv_status(continuum.status)
            assert blocks(start) == (USABLE_BLOCKS, 0, 0)
            _openhands_call(client, context)
            first = kv_status(continuum.status)
            assert blocks(first) == (USABLE_BLOCKS - CONTEXT_BLOCKS, CONTEXT_BLOCKS, 1)
            assert released(first, start) == {}

            for seed in range(DISPLACING_CALLS):
                other = random_prompt(DISPLACING_TOKENS, vocab_size, seed=10 + seed)
                body = {"model": SERVED_MODEL_NAME, "prompt": other, "max_tokens": 1}
                assert client.post("/v1/completions", json=body).status_code == 200
            # The calls of no session were one-call sessions, over; the pin held.
            assert blocks(kv_status(continuum.status))[1:] == (CONTEXT_BLOCKS, 1)

            hits = engine_metric(continuum.url, "vllm:prefix_cache_hits")
            tail = random_prompt(20, vocab_size, seed=2)
            answer = _openhands_call(client, context + tail)
            assert engine_metric(continuum.url, "vllm:prefix_cache_hits") - hits == (
                CONTEXT_BLOCKS * CPU_BLOCK_SIZE
            )
            assert answer["usage"]["prompt_tokens"] == CONTEXT_TOKENS + 20
            second = kv_status(continuum.status)
            # The second call took the pin over, and its own end pinned it again.
            assert released(second, first) == {"next_call": 1}
            assert blocks(second) == (USABLE_BLOCKS - CONTEXT_BLOCKS, CONTEXT_BLOCKS, 1)

            # One session at the gateway, across both calls.
            assert set(gateway.admission.admitted) == {CONVERSATION}
            eventually(lambda: _active_sessions(client) == 1, "the gauge counts one session")
            submits = [
                (e.session_id, e.turn)
                for e in gateway.hub.events()
                if isinstance(e, LLMSubmit) and e.session_id == CONVERSATION
            ]
            assert submits == [(CONVERSATION, 0), (CONVERSATION, 1)]
