"""The scripted stand-in engine (``engines.scripted``), which the gateway's tests put
behind it, under bodies it cannot read: a 400 with a message, never a 500 (issue 10)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agentmars.server.engines.scripted.app import ScriptedLatency, create_scripted_llm_app


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "scripted", "prompt": "x", "max_tokens": 1e400}',
        b'{"model": "scripted", "prompt": "x", "max_tokens": NaN}',
        b'{"model": "scripted", "prompt": "x", "max_tokens": "many"}',
        b'{"model": "scripted", "messages": [1, 2]}',
        b'{"model": "scripted", "messages": [{"role": "user"}], "tools": {"a": 1}}',
        b'{"model": "scripted", "messages": [{"role": "user"}], "tools": [{"function": 5}]}',
        b'{"model": "scripted", "messages": [], "stream": true, "stream_options": 5}',
    ],
)
def test_the_scripted_server_refuses_what_it_cannot_read(body: bytes) -> None:
    async def post() -> httpx.Response:
        app = create_scripted_llm_app(ScriptedLatency(0.0, 0.0))
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://scripted") as client:
            path = "/v1/completions" if b"prompt" in body else "/v1/chat/completions"
            return await client.post(path, content=body)

    reply = asyncio.run(post())
    assert reply.status_code == 400, reply.text
    assert reply.json()["detail"]
