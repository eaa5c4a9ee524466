"""OpenAI's Responses API (``POST /v1/responses``) on the twin, as vLLM 0.32 serves it.

The request is read as the chat completions request it stands for (``as_chat``):
``instructions`` and ``input`` (a string, or items: messages, ``function_call`` and
``function_call_output``; ``reasoning`` items are passed over) become the messages,
function ``tools`` and ``tool_choice`` the chat's, ``max_output_tokens`` the budget and
``text.format`` the ``response_format``. The twin answers that, and the answer is
written as a response object (``output``: a message of ``output_text``, or a
``function_call``), whole or as the stream of typed events OpenAI's client reads
(``response.created`` ... ``response.output_text.delta`` ...
``response.completed``), each with its ``sequence_number``.

A response continues an earlier one (``previous_response_id``) or a conversation
(``conversation``) by its stored context: the twin keeps each answered response's
messages and the latest of each conversation (``ResponseStore``), so the prompt, and
the prefix the twin's KV holds, are those of the whole conversation, as on a server
that stores responses. NOTE: ours: the store keeps the ``STORED`` most recent; an
unknown id is a 404, as OpenAI's.

The answer's status as vLLM gives it: ``incomplete`` (``max_output_tokens``) when the
call ran out of tokens, else ``completed``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any

from agentmars.server.engines.twin.engine import CallStream, LiveError
from agentmars.server.engines.twin.replies import Reply

STORED = 4096
"""Responses and conversations whose context the twin keeps (least recent out)."""
PASSED_THROUGH = ("model", "stream", "vllm_xargs", "session_id")


class UnknownResponse(LookupError):
    """A ``previous_response_id`` or ``conversation`` the store does not hold."""


class ResponseStore:
    """The messages of each answered response and the latest of each conversation."""

    def __init__(self, size: int = STORED) -> None:
        self._size = size
        self._contexts: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def context(self, key: str) -> list[dict[str, Any]]:
        if key not in self._contexts:
            raise UnknownResponse(key)
        self._contexts.move_to_end(key)
        return self._contexts[key]

    def keep(self, key: str, messages: list[dict[str, Any]]) -> None:
        self._contexts[key] = messages
        self._contexts.move_to_end(key)
        while len(self._contexts) > self._size:
            self._contexts.popitem(last=False)


def conversation_id(body: Mapping[str, Any]) -> str | None:
    """``conversation``: an id, or an object with one."""
    value = body.get("conversation")
    if isinstance(value, Mapping):
        value = value.get("id")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise LiveError("'conversation' must be an id or {'id': ...}", "conversation")
    return value


def as_chat(body: Mapping[str, Any], store: ResponseStore) -> dict[str, Any]:
    """The chat completions request a Responses request stands for (``LiveError`` for
    a field the twin cannot read; ``UnknownResponse`` for a context it does not hold)."""
    messages = list(_earlier(body, store))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise LiveError("'instructions' must be a string", "instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    messages += _input_messages(body.get("input"))
    chat: dict[str, Any] = {k: body[k] for k in PASSED_THROUGH if k in body}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    form = _dict(body.get("text")).get("format")
    if form is not None:
        chat["response_format"] = _response_format(form)
    return chat


def _earlier(body: Mapping[str, Any], store: ResponseStore) -> list[dict[str, Any]]:
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str) or not previous:
            raise LiveError("'previous_response_id' must be a response id", "previous_response_id")
        return store.context(previous)
    conversation = conversation_id(body)
    if conversation is None:
        return []
    try:
        return store.context(conversation)
    except UnknownResponse:
        return []  # its first response


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _input_messages(value: object) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise LiveError("'input' must be a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    for item in value:
        if not isinstance(item, Mapping):
            raise LiveError("each input item must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {"name": item.get("name"), "arguments": item.get("arguments", "")}
            tool_call = {"id": item.get("call_id"), "type": "function", "function": call}
            messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind != "reasoning":  # a model's reasoning is not read back
            raise LiveError(
                f"input items of type {kind!r:.80} are not served by the simulated engine "
                "(messages, function_call, function_call_output and reasoning are)",
                "input",
            )
    return messages


def _text(content: object) -> str:
    """A message's content: a string, or its parts' texts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(_dict(part).get("text") or "") for part in content)
    raise LiveError("a message's 'content' must be a string or a list of parts", "input")


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise LiveError("'tools' must be a list of function tools", "tools")
    functions = []
    for tool in tools:
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise LiveError(
                "each tool must be {'type': 'function', 'name': ...} (the simulated engine "
                "calls functions only)",
                "tools",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: object) -> object:
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice  # "auto", "none", "required" (others are refused as chat's)


def _response_format(form: object) -> object:
    kind = _dict(form).get("type")
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"schema": _dict(form).get("schema")}}
    return form  # {"type": "text"} or {"type": "json_object"}, read as chat's


def _usage(stream: CallStream) -> dict[str, Any]:
    call = stream.call
    return {
        "input_tokens": call.prompt_tokens,
        "input_tokens_details": {"cached_tokens": call.record.cached_tokens},
        "output_tokens": call.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": call.prompt_tokens + call.output_tokens,
    }


class ResponsesAnswer:
    """One request's answer as a response object, whole or streamed."""

    def __init__(
        self,
        model: str,
        reply: Reply,
        chat: Mapping[str, Any],
        body: Mapping[str, Any],
        store: ResponseStore,
    ) -> None:
        self.model = model
        self.reply = reply
        self.chat = chat
        self.body = body
        self.store = store
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"{'fc' if reply.tool_call else 'msg'}_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._sequence = 0

    def _item(self, said: str, status: str) -> dict[str, Any]:
        call = self.reply.tool_call
        if call is not None:
            return {
                "type": "function_call",
                "id": self.item_id,
                "call_id": call.id,
                "name": call.name,
                "arguments": said,
                "status": status,
            }
        content = [{"type": "output_text", "text": said, "annotations": [], "logprobs": []}]
        return {
            "type": "message",
            "id": self.item_id,
            "status": status,
            "role": "assistant",
            "content": content if status == "completed" else [],
        }

    def response(self, stream: CallStream | None, said: str = "") -> dict[str, Any]:
        """The response object: in progress (``stream`` None) or ended."""
        status, incomplete, output = "in_progress", None, []
        if stream is not None:
            if stream.status != "finished":
                status = "cancelled"
            elif self.reply.finish_reason == "length":
                status, incomplete = "incomplete", {"reason": "max_output_tokens"}
            else:
                status = "completed"
            output = [self._item(said, "completed")]
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "incomplete_details": incomplete,
            "error": None,
            "instructions": self.body.get("instructions"),
            "max_output_tokens": self.body.get("max_output_tokens"),
            "previous_response_id": self.body.get("previous_response_id"),
            "conversation": self.body.get("conversation"),
            "parallel_tool_calls": False,
            "tool_choice": self.body.get("tool_choice", "auto"),
            "tools": self.body.get("tools", []),
            "text": self.body.get("text", {"format": {"type": "text"}}),
            "metadata": self.body.get("metadata") or {},
            "temperature": self.body.get("temperature"),
            "top_p": self.body.get("top_p"),
            "truncation": "disabled",
            "usage": None if stream is None else _usage(stream),
        }

    def said(self, produced: int) -> str:
        return "".join(self.reply.piece(i) for i in range(produced))

    def whole(self, stream: CallStream) -> dict[str, Any]:
        said = self.said(stream.call.output_tokens)
        self._keep(said)
        return self.response(stream, said)

    def _keep(self, said: str) -> None:
        """The conversation after this answer, kept for the responses that continue it
        (by this response's id, and its conversation's)."""
        context = self._context(said)
        self.store.keep(self.id, context)
        if (conversation := conversation_id(self.body)) is not None:
            self.store.keep(conversation, context)

    def _context(self, said: str) -> list[dict[str, Any]]:
        call = self.reply.tool_call
        if call is None:
            answer: dict[str, Any] = {"role": "assistant", "content": said}
        else:
            function = {"name": call.name, "arguments": said}
            answer = {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function", "function": function}
            ]}  # fmt: skip
        return [*self.chat["messages"], answer]

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()

    async def events(self, stream: CallStream) -> AsyncIterator[bytes]:
        """The SSE body, as the tokens come."""
        at = {"item_id": self.item_id, "output_index": 0}
        yield self._event("response.created", response=self.response(None))
        yield self._event("response.in_progress", response=self.response(None))
        yield self._event("response.output_item.added", output_index=0,
                          item=self._item("", "in_progress"))  # fmt: skip
        text = self.reply.tool_call is None
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        if text:
            yield self._event("response.content_part.added", **at, content_index=0, part=part)
        said = []
        async for index in stream.tokens():
            piece = self.reply.piece(index)
            said.append(piece)
            if text:
                yield self._event("response.output_text.delta", **at, content_index=0,
                                  delta=piece, logprobs=[])  # fmt: skip
            else:
                yield self._event("response.function_call_arguments.delta", **at, delta=piece)
        whole = "".join(said)
        self._keep(whole)
        if text:
            yield self._event("response.output_text.done", **at, content_index=0, text=whole,
                              logprobs=[])  # fmt: skip
            yield self._event("response.content_part.done", **at, content_index=0,
                              part={**part, "text": whole})  # fmt: skip
        else:
            yield self._event("response.function_call_arguments.done", **at, arguments=whole)
        yield self._event("response.output_item.done", output_index=0,
                          item=self._item(whole, "completed"))  # fmt: skip
        response = self.response(stream, whole)
        ended = {"completed": "completed", "incomplete": "incomplete"}.get(response["status"])
        yield self._event(f"response.{ended or 'failed'}", response=response)
