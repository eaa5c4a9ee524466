"""Anthropic's Messages API (``POST /v1/messages``) on the twin, as vLLM 0.32 serves it
(``vllm/entrypoints/anthropic``): the request is read as the chat completions request
it stands for (``as_chat``: ``system`` and ``messages`` with their ``text``,
``tool_use`` and ``tool_result`` blocks, ``tools`` by their ``input_schema``,
``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none``, ``stop_sequences``), the
twin answers that, and the answer is written as a message, whole or as its stream of
typed events (``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta``, ``message_stop``).

Stop reasons as vLLM maps them: out of tokens ``max_tokens``, a stop string
``stop_sequence`` (naming it), a tool call ``tool_use``, else ``end_turn``. Usage as
Anthropic counts it: ``input_tokens`` leaves out the ``cache_read_input_tokens``.
Errors have Anthropic's body (``{"type": "error", "error": {"type", "message"}}``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from agentmars.server.engines.twin.engine import CallStream, LiveError
from agentmars.server.engines.twin.replies import Reply, stop_strings

PASSED_THROUGH = ("model", "stream", "vllm_xargs", "session_id")
CHOICES = {"auto": "auto", "any": "required", "none": "none"}
"""Anthropic's ``tool_choice`` types and the chat's (``tool`` names one)."""


def error_response(status: int, message: str) -> JSONResponse:
    kind = "not_found_error" if status == 404 else "invalid_request_error"
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status)


def as_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions request a Messages request stands for (``LiveError`` for a
    field the twin cannot read)."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise LiveError("'max_tokens' is required", "max_tokens")
    messages = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text(system, "system")})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise LiveError("'messages' must be a non-empty list of messages", "messages")
    for turn in turns:
        messages += _chat_messages(turn)
    chat: dict[str, Any] = {k: body[k] for k in PASSED_THROUGH if k in body}
    chat |= {"messages": messages, "max_tokens": max_tokens}
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def _text(content: object, field: str) -> str:
    """A string, or the texts of ``text`` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text") or "") for b in content if isinstance(b, Mapping))
    raise LiveError(f"'{field}' must be a string or a list of content blocks", field)


def _chat_messages(turn: object) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: its tool results each a ``tool``
    message, its tool uses the assistant's ``tool_calls``."""
    if not isinstance(turn, Mapping) or turn.get("role") not in ("user", "assistant"):
        raise LiveError(
            "each message must be an object with role 'user' or 'assistant'", "messages"
        )
    content = turn.get("content")
    if not isinstance(content, list):
        return [{"role": turn["role"], "content": _text(content, "messages")}]
    blocks = [block for block in content if isinstance(block, Mapping)]
    results = [
        {
            "role": "tool",
            "tool_call_id": block.get("tool_use_id"),
            "content": _text(block.get("content", ""), "messages"),
        }
        for block in blocks
        if block.get("type") == "tool_result"
    ]
    calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input"))},
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    text = "".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text")
    message: dict[str, Any] = {"role": turn["role"], "content": text}
    if calls:
        message["tool_calls"] = calls
    return [*results, message] if text or calls or not results else results


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise LiveError("'tools' must be a list of tools", "tools")
    functions = []
    for tool in tools:
        if not isinstance(tool, Mapping) or "input_schema" not in tool:
            raise LiveError(
                "each tool must be {'name': ..., 'input_schema': {...}} (the simulated "
                "engine calls client tools only)",
                "tools",
            )
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if "description" in tool:
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: object) -> object:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind in CHOICES:
        return CHOICES[kind]
    if kind == "tool" and isinstance(choice, Mapping):
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise LiveError(
        "'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
        "tool_choice",
    )


def _usage(stream: CallStream, output: int) -> dict[str, int]:
    call = stream.call
    cached = call.record.cached_tokens
    return {
        "input_tokens": max(0, call.prompt_tokens - cached),
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    }


class MessagesAnswer:
    """One request's answer as an Anthropic message, whole or streamed."""

    def __init__(self, model: str, reply: Reply, chat: Mapping[str, Any]) -> None:
        self.model = model
        self.reply = reply
        self.stops = stop_strings(chat)
        self.id = f"msg_{uuid.uuid4().hex}"

    def stop(self, stream: CallStream) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence), as vLLM maps the chat's finish."""
        reply = self.reply
        if stream.status != "finished" or reply.finish_reason == "length":
            return "max_tokens", None
        if reply.tool_call is not None:
            return "tool_use", None
        if reply.said is not None:  # cut by a stop string: the one found there
            text = reply.text
            return "stop_sequence", next(s for s in self.stops if text.startswith(s, reply.said))
        return "end_turn", None

    def _block(self, said: str) -> dict[str, Any]:
        call = self.reply.tool_call
        if call is None:
            return {"type": "text", "text": said}
        arguments = json.loads(said) if said else {}
        return {"type": "tool_use", "id": f"toolu_{call.id}", "name": call.name, "input": arguments}

    def _message(
        self, stream: CallStream, content: list[dict[str, Any]], output: int
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(stream, output),
        }

    def whole(self, stream: CallStream) -> dict[str, Any]:
        produced = stream.call.output_tokens
        said = "".join(self.reply.piece(i) for i in range(produced))
        message = self._message(stream, [self._block(said)], produced)
        message["stop_reason"], message["stop_sequence"] = self.stop(stream)
        return message

    async def events(self, stream: CallStream) -> AsyncIterator[bytes]:
        """The SSE body, as the tokens come."""
        yield _event("message_start", message=self._message(stream, [], 0))
        call = self.reply.tool_call
        start = self._block("") if call is None else {**self._block(""), "input": {}}
        yield _event("content_block_start", index=0, content_block=start)
        produced = 0
        async for index in stream.tokens():
            piece = self.reply.piece(index)
            produced = index + 1
            delta = (
                {"type": "text_delta", "text": piece}
                if call is None
                else {"type": "input_json_delta", "partial_json": piece}
            )
            yield _event("content_block_delta", index=0, delta=delta)
        yield _event("content_block_stop", index=0)
        reason, sequence = self.stop(stream)
        yield _event(
            "message_delta",
            delta={"stop_reason": reason, "stop_sequence": sequence},
            usage=_usage(stream, produced),
        )
        yield _event("message_stop")


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()
