"""A scripted OpenAI-compatible server: deterministic replies with modelled latency.

It stands in for an LLM engine where the point is what crosses the wire (the
SDK's headers, body fields and ``vllm_xargs``; streaming timing), not the
model: the demo and the SDK tests run real clients against it. Every request
is recorded (headers and JSON body) in ``app.state.requests``.

Reply rule (agent-like, so an agent loop terminates): when the request offers
tools and the last message is not a tool result, the reply calls the first
tool; otherwise it answers in text. Generation latency is modelled as a
first-token delay plus a per-token delay.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentmars.sdk.http_guard import COMPLETION_BODY_BYTES, RequestGuard


@dataclass(frozen=True)
class ScriptedLatency:
    """Modelled generation time: ``first_token_s`` before the first token, then
    ``per_token_s`` for each further token."""

    first_token_s: float = 0.02
    per_token_s: float = 0.002


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _word_count(body: dict[str, Any]) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content") or "") for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    return max(1, len(text.split()))


def _wants_tool_call(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    last_role = messages[-1].get("role") if messages else None
    return bool(body.get("tools")) and body.get("tool_choice") != "none" and last_role != "tool"


def _tool_call(body: dict[str, Any]) -> dict[str, Any]:
    function = body["tools"][0].get("function", {})
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": function.get("name", "tool"), "arguments": json.dumps({"step": 1})},
    }


def _reply_tokens(body: dict[str, Any]) -> list[str]:
    count = int(body.get("max_tokens") or body.get("max_completion_tokens") or 8)
    return [f"tok{i} " for i in range(max(1, min(count, 64)))]


def _check_shape(body: dict[str, Any], chat: bool) -> None:
    """Refuse (400) what the reply rules above cannot read, rather than fail on it.
    NOTE: a text completion's "messages" is not checked: one that is not a list of
    objects still fails (500), the crash tests/server/gateway/test_proxy.py needs."""
    for name in ("messages", "tools") if chat else ("tools",):
        items = body.get(name)
        if items is not None and not (
            isinstance(items, list) and all(isinstance(item, dict) for item in items)
        ):
            raise HTTPException(400, f"'{name}' must be a list of objects")
    tools = body.get("tools") or [{}]
    if not isinstance(tools[0].get("function", {}), dict):
        raise HTTPException(400, "a tool's 'function' must be an object")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise HTTPException(400, "'stream_options' must be an object")
    try:
        _reply_tokens(body)
    except (TypeError, ValueError, OverflowError):  # e.g. "abc", NaN, 1e400
        raise HTTPException(400, "'max_tokens' must be an integer") from None


def _usage(body: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
    prompt = _word_count(body)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


class _Reply:
    """The reply to one request, as a whole response or as stream chunks."""

    def __init__(self, body: dict[str, Any], chat: bool, latency: ScriptedLatency) -> None:
        self.body = body
        self.chat = chat
        self.latency = latency
        self.id = f"cmpl-{uuid.uuid4().hex[:16]}"
        self.created = int(time.time())
        self.tool_call = _tool_call(body) if chat and _wants_tool_call(body) else None
        self.tokens = [] if self.tool_call else _reply_tokens(body)
        self.finish_reason = "tool_calls" if self.tool_call else "length"

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens) or 1

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": f"{kind}.chunk" if chunk and self.chat else kind,
            "created": self.created,
            "model": self.body["model"],
            "choices": choices,
        }

    async def whole(self) -> dict[str, Any]:
        await asyncio.sleep(self.generation_time())
        text = "".join(self.tokens)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if self.tool_call:
                message["tool_calls"] = [self.tool_call]
            choice = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        else:
            choice = {"index": 0, "text": text, "finish_reason": self.finish_reason}
        return {**self._envelope([choice], False), "usage": _usage(self.body, len(self.tokens))}

    def generation_time(self) -> float:
        return self.latency.first_token_s + self.latency.per_token_s * (self.completion_tokens - 1)

    def _choice(self, delta: dict[str, Any], text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            return {"index": 0, "delta": delta, "finish_reason": finish}
        return {"index": 0, "text": text, "finish_reason": finish}

    def _deltas(self) -> list[tuple[dict[str, Any], str]]:
        if self.tool_call:
            return [({"role": "assistant", "tool_calls": [{"index": 0, **self.tool_call}]}, "")]
        return [({"role": "assistant", "content": token}, token) for token in self.tokens]

    async def chunks(self) -> AsyncIterator[str]:
        await asyncio.sleep(self.latency.first_token_s)
        for i, (delta, text) in enumerate(self._deltas()):
            if i:
                await asyncio.sleep(self.latency.per_token_s)
            yield _sse(self._envelope([self._choice(delta, text, None)], True))
        yield _sse(self._envelope([self._choice({}, "", self.finish_reason)], True))
        if (self.body.get("stream_options") or {}).get("include_usage"):
            yield _sse({**self._envelope([], True), "usage": _usage(self.body, len(self.tokens))})
        yield "data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _read_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HTTPException(400, "request body is not valid JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise HTTPException(400, "request body must be a JSON object with a string 'model'")
    return body


def create_scripted_llm_app(
    latency: ScriptedLatency | None = None, model: str = "scripted"
) -> FastAPI:
    """The server app; ``app.state.requests`` lists every request received."""
    app = FastAPI(title="agentmars scripted LLM")
    app.state.requests = []
    app.state.latency = latency or ScriptedLatency()

    async def complete(request: Request, chat: bool) -> Any:
        body = await _read_body(request)
        if body["model"] != model:
            raise HTTPException(
                404, f"model {body['model']!r} not found; this server has {model!r}"
            )
        if chat and not isinstance(body.get("messages"), list):
            raise HTTPException(400, "chat completion needs a 'messages' list")
        _check_shape(body, chat)
        app.state.requests.append(RecordedRequest(request.url.path, dict(request.headers), body))
        reply = _Reply(body, chat, app.state.latency)
        if body.get("stream"):
            return StreamingResponse(reply.chunks(), media_type="text/event-stream")
        return JSONResponse(await reply.whole())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await complete(request, chat=False)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "owned_by": "agentmars"}],
        }

    # Bodies bounded as they arrive, as in front of the gateway (a chunked body too).
    app.add_middleware(RequestGuard, max_body_bytes=COMPLETION_BODY_BYTES)
    return app
