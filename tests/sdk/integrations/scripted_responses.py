"""A scripted ``POST /v1/responses`` (OpenAI's Responses API) for the scripted LLM
server, so the SDK's Responses integrations are tested with the real clients.

The scripted server in ``agentmars.server.engines.scripted`` serves the chat and text
completion APIs only; this adds the Responses one with the same rules: a tool call when
tools are offered and the input does not end with a tool result, else ``tok0 tok1 ...``
up to ``max_output_tokens`` (8 by default), with the same modelled latency. Usage counts
a word of input as a token. Requests are recorded in ``app.state.requests`` as the
server's own are.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentmars.server.engines.scripted.app import RecordedRequest, ScriptedLatency


def _input_words(body: dict[str, Any]) -> int:
    items = body["input"] if isinstance(body["input"], list) else [{"content": body["input"]}]
    texts = [str(body.get("instructions") or "")]
    texts += [str(item.get("content") or item.get("output") or "") for item in items]
    return max(1, len(" ".join(texts).split()))


def _wants_tool_call(body: dict[str, Any]) -> bool:
    items = body["input"] if isinstance(body["input"], list) else []
    ends_in_result = bool(items) and items[-1].get("type") == "function_call_output"
    return bool(body.get("tools")) and body.get("tool_choice") != "none" and not ends_in_result


class _Reply:
    def __init__(self, body: dict[str, Any], latency: ScriptedLatency) -> None:
        self.body = body
        self.latency = latency
        self.id = f"resp_{uuid.uuid4().hex[:16]}"
        self.item_id = f"item_{uuid.uuid4().hex[:12]}"
        self.call_id = f"call_{uuid.uuid4().hex[:12]}"
        self.tool = body["tools"][0]["name"] if _wants_tool_call(body) else None
        count = 1 if self.tool else int(body.get("max_output_tokens") or 8)
        self.tokens = [f"tok{i} " for i in range(count)]

    def item(self, done: bool) -> dict[str, Any]:
        status = "completed" if done else "in_progress"
        if self.tool:
            return {
                "type": "function_call",
                "id": self.item_id,
                "call_id": self.call_id,
                "name": self.tool,
                "arguments": json.dumps({"step": 1}) if done else "",
                "status": status,
            }
        text = [{"type": "output_text", "text": "".join(self.tokens), "annotations": []}]
        return {
            "type": "message",
            "id": self.item_id,
            "role": "assistant",
            "status": status,
            "content": text if done else [],
        }

    def response(self, done: bool) -> dict[str, Any]:
        words = _input_words(self.body)
        usage = {
            "input_tokens": words,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": len(self.tokens),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": words + len(self.tokens),
        }
        return {
            "id": self.id,
            "object": "response",
            "created_at": int(time.time()),
            "model": self.body["model"],
            "status": "completed" if done else "in_progress",
            "output": [self.item(done=True)] if done else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": self.body.get("tools") or [],
            "usage": usage if done else None,
        }

    def generation_time(self) -> float:
        return self.latency.first_token_s + self.latency.per_token_s * (len(self.tokens) - 1)

    def _delta(self, token: str) -> dict[str, Any]:
        where = {"item_id": self.item_id, "output_index": 0}
        if self.tool:
            return {"type": "response.function_call_arguments.delta", **where, "delta": token}
        return {
            "type": "response.output_text.delta",
            **where,
            "content_index": 0,
            "delta": token,
            "logprobs": [],
        }

    async def events(self) -> AsyncIterator[str]:
        """The stream's events as openai's own accumulator (``responses.stream``) wants
        them: the item and its content part opened before their deltas."""
        deltas = [json.dumps({"step": 1})] if self.tool else self.tokens
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        opening = [
            {"type": "response.created", "response": self.response(done=False)},
            {"type": "response.output_item.added", "output_index": 0, "item": self.item(False)},
            *(
                []
                if self.tool
                else [{"type": "response.content_part.added", **where, "part": part}]
            ),
        ]
        closing = [
            {"type": "response.output_item.done", "output_index": 0, "item": self.item(True)},
            {"type": "response.completed", "response": self.response(done=True)},
        ]
        for number, event in enumerate([*opening, *map(self._delta, deltas), *closing]):
            if number == len(opening):
                await asyncio.sleep(self.latency.first_token_s)
            elif len(opening) < number < len(opening) + len(deltas):
                await asyncio.sleep(self.latency.per_token_s)
            data = json.dumps({**event, "sequence_number": number})
            yield f"event: {event['type']}\ndata: {data}\n\n"


def add_responses_route(app: FastAPI, latency: ScriptedLatency) -> None:
    """Serve ``POST /v1/responses`` on the scripted server ``app``."""

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        body = await request.json()
        app.state.requests.append(RecordedRequest(request.url.path, dict(request.headers), body))
        reply = _Reply(body, latency)
        if body.get("stream"):
            return StreamingResponse(reply.events(), media_type="text/event-stream")
        await asyncio.sleep(reply.generation_time())
        return JSONResponse(reply.response(done=True))
