"""The routes beside the completions through the gateway to vLLM CPU (the tiny model,
the plugin running Continuum, linked to the gateway by the side channel as
``agentmars serve`` links them): the tokenizer, version and health as vLLM answers
them, and a Responses call and a Messages call that reach vLLM's plugin as the
session the gateway read (its KV is pinned for the session) and record their tokens.
One vLLM start (about 40 s on 2 cores)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from agentmars.sdk.events import LLMEnd, LLMFirstToken
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME
from tests.server.engines.vllm.conftest import vllm_python
from tests.server.engines.vllm.helpers import LinkedEngine, kv_status, linked_gateway, linked_vllm

__all__ = ["vllm_python"]  # the fixture, shared with the real-engine tests

TOKEN = "passthrough-token"
SETTINGS = {"ttl_s": 60.0}
"""Longer than the test: a pin goes only when its session's next call takes it over."""
PROMPT = " ".join(f"word{i}" for i in range(300))
"""Several full KV blocks of 128 tokens, so the session's KV is pinned at its end."""


@pytest.fixture(scope="module")
def engine(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinkedEngine]:
    folder = tmp_path_factory.mktemp("passthrough")
    with linked_vllm(vllm_python, folder, "continuum", settings=SETTINGS) as engine:
        yield engine


@pytest.mark.slow
def test_vllms_other_routes_through_the_gateway(engine: LinkedEngine) -> None:
    with (
        linked_gateway(engine, TOKEN, "continuum", policy_settings=SETTINGS) as (client, gateway),
        httpx.Client(base_url=engine.url, timeout=60) as direct,
    ):
        # Passed through as vLLM answers them.
        body = {"model": SERVED_MODEL_NAME, "prompt": "hello world"}
        tokens = client.post("/tokenize", json=body)
        assert (tokens.status_code, tokens.content) == (
            200,
            direct.post("/tokenize", json=body).content,
        )
        ids = tokens.json()["tokens"]
        text = client.post("/detokenize", json={"model": SERVED_MODEL_NAME, "tokens": ids})
        assert text.status_code == 200 and "hello world" in text.json()["prompt"]
        assert client.get("/version").json() == direct.get("/version").json()
        assert client.get("/health").status_code == 200

        # A Responses call: the session reaches the plugin, the tokens the events.
        pins = kv_status(engine.status).pins
        responses = openai.OpenAI(base_url=client.base_url.join("/v1"), api_key="unused")
        reply = responses.responses.create(
            model=SERVED_MODEL_NAME, input=PROMPT, max_output_tokens=4, prompt_cache_key="conv-r"
        )
        assert reply.usage is not None and reply.usage.input_tokens > 256
        assert kv_status(engine.status).pins == pins + 1
        (end,) = [e for e in gateway.hub.events() if isinstance(e, LLMEnd)]
        assert (end.session_id, end.status) == ("conv-r", "ok")
        assert (end.prompt_tokens, end.output_tokens) == (
            reply.usage.input_tokens,
            reply.usage.output_tokens,
        )
        stream = responses.responses.create(
            model=SERVED_MODEL_NAME, input="hi", max_output_tokens=4, stream=True
        )
        assert [e.type for e in stream][-1] == "response.completed"
        assert any(isinstance(e, LLMFirstToken) for e in gateway.hub.events())

        # An Anthropic Messages call, its session named by the user id.
        message = {
            "model": SERVED_MODEL_NAME,
            "max_tokens": 4,
            "metadata": {"user_id": "user_1_session_m"},
            "messages": [{"role": "user", "content": PROMPT}],
        }
        answer = client.post("/v1/messages", json=message)
        assert answer.status_code == 200, answer.text
        assert kv_status(engine.status).pins == pins + 2
        last = [e for e in gateway.hub.events() if isinstance(e, LLMEnd)][-1]
        assert last.session_id == "user_1_session_m"
        assert last.output_tokens == answer.json()["usage"]["output_tokens"]
