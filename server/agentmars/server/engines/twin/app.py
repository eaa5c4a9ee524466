"""The OpenAI-compatible API of the wall-clock twin (``engines.twin.engine``), shaped
like vLLM's so the gateway sits in front of it unchanged.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed as SSE in
vLLM's chunk format, ending with ``data: [DONE]``, or whole), ``POST /v1/responses``
(OpenAI's Responses API: ``responses_api``) and ``POST /v1/messages`` (Anthropic's:
``messages_api``), each read as the chat request it stands for, as vLLM does;
``POST /tokenize`` and ``/detokenize`` (on the synthetic tokens: ``synthetic_ids``),
``GET /version``, ``GET /v1/models`` and ``/v1/models/{model}``, ``GET /health`` and
``GET /metrics`` (vLLM's series where they mean the same, e.g.
``vllm:time_to_first_token_seconds``, plus ``agentmars_sim_*`` figures of the block
pool: ``engines.twin.metrics``).

Session metadata is read where vLLM's plugin reads it (``engines/vllm/views.py``):
``vllm_xargs`` (``session_id``, ``turn``, ``follows_tool``, ``expects_tool``,
``next_tool``, ``expected_tool_s``, ``agent``, ``task_id``), else the body's
``session_id``, else the ``X-Session-ID`` header.

Tokens are synthetic. NOTE: ours — a text prompt counts one token per
``CHARS_PER_TOKEN`` characters (rounded up; the SDK's projection uses the same ratio),
a chat prompt is its messages rendered as ``<|role|>content`` lines and counted the
same way, and a token-id prompt counts its ids. What the answer's tokens say is
``replies``' (words of a fixed vocabulary, cut by ``stop``; a JSON document for
``response_format``; a tool call, chosen by ``tool_calls``), and with
``return_token_ids`` each chunk carries its token's id (``token_id``), as vLLM's do, so
a client can append the answer to its next token-id prompt; without
``max_tokens`` a call generates ``DEFAULT_MAX_TOKENS`` (vLLM would go on to the end of
the context, which a model without an end token would really do). ``echo`` (completions)
starts the answer with the prompt (a token id as its vocabulary word); ``logprobs`` are
refused.

Errors carry vLLM's body (``{"error": {"message", "type", "param", "code"}}``): 400 for
a body that is not a JSON object of valid Unicode (a lone surrogate such as ``"\ud800"``
anywhere in it), a field of the wrong type or out of range (``vllm_xargs`` as the
gateway checks it, ``call_metadata``), ``max_tokens`` above the context and a prompt the
context cannot hold (vLLM 0.32's messages), a field the twin refuses (``logprobs``,
chat's ``echo``, an unknown ``response_format``, a ``tool_choice`` naming no offered
function); 404 for another model.

This module is the twin's web layer (``engines.twin.engine`` imports no web framework,
so the twin's engine installs where the simulator does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from agentmars.sdk import wire
from agentmars.sdk.http_guard import COMPLETION_BODY_BYTES, RequestGuard
from agentmars.sdk.wire import SESSION_HEADER
from agentmars.server.engines.twin import messages_api, responses_api
from agentmars.server.engines.twin.engine import (
    CallRequest,
    CallStream,
    LiveEngine,
    LiveError,
    output_limit_error,
)
from agentmars.server.engines.twin.metrics import TwinMetrics
from agentmars.server.engines.twin.replies import (
    WORDS,
    Reply,
    echoes,
    refuse_logprobs,
    reply_for,
    token_id,
    token_text,
)
from agentmars.server.engines.twin.tool_calls import SessionHints, tool_call_for
from agentmars.server.web.client_watch import ClientGone, ClientWatch, ClosingStreamingResponse
from agentmars.server.web.json_body import BadBody, json_object

CHARS_PER_TOKEN = 4
MAX_NAME = 256
"""Longest session id, call id, tool or agent name (the events' ``Id`` bound)."""
XARGS_INTS = (-(2**63), 2**64)
"""Integers ``vllm_xargs`` may carry (vLLM checks its ``extra_args`` so: its engine's
MessagePack transport holds 64 bits)."""
DEFAULT_MAX_TOKENS = 16
VLLM_API_VERSION = "0.32.0"
"""The vLLM whose API the twin answers as (``/version``)."""
SURROGATE_SOURCE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
"""What a UTF-8 body needs to hold a surrogate once parsed: a ``\\uD800``-``\\uDFFF``
escape or such a code point's bytes (``json.loads`` lets both through). A body without
any is not walked for lone surrogates (the walk is Python, one step a value)."""


class ApiError(Exception):
    """An error answer in vLLM's format."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> JSONResponse:
        kind = "NotFoundError" if self.status == 404 else "BadRequestError"
        # An echoed input never stops the answer: what UTF-8 cannot hold is escaped.
        message = self.message.encode("utf-8", "backslashreplace").decode("utf-8")
        body = {"message": message, "type": kind, "param": self.param, "code": self.status}
        return JSONResponse({"error": body}, status_code=self.status)


# --- reading requests ----------------------------------------------------------------------


def synthetic_tokens(text: str) -> int:
    """Tokens of a text (at least one)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def synthetic_ids(text: str) -> tuple[list[int], list[str]]:
    """A text's synthetic tokens: its ``CHARS_PER_TOKEN``-character pieces and their ids.

    NOTE: ours: the twin has no tokenizer. The count is the one its calls are charged
    (``synthetic_tokens``); an id names one of the twin's vocabulary words (a piece's
    code points summed, modulo the vocabulary), so ``/detokenize`` gives words back,
    not the text."""
    pieces = [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]
    pieces = pieces or [""]
    return [sum(map(ord, piece)) % len(WORDS) for piece in pieces], pieces


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json_object(raw)
    except BadBody as exc:
        raise ApiError(exc.status, str(exc)) from None
    may_hold = not json.detect_encoding(raw).startswith("utf-8") or SURROGATE_SOURCE.search(raw)
    surrogate = _lone_surrogate(body) if may_hold else None
    if surrogate is not None:
        raise ApiError(
            400,
            f"request body is not valid Unicode: a string holds the lone surrogate "
            f"{surrogate!r} (U+{ord(surrogate):04X}), which no UTF-8 text can hold",
        )
    return body


def _lone_surrogate(body: object) -> str | None:
    """The first lone surrogate in any key or string of a parsed body (JSON's
    ``"\\ud800"`` escape, or its bytes, which ``json.loads`` lets through), else None."""
    pending = [body]
    while pending:  # not recursive: the body may nest as deep as the parser allowed
        value = pending.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    return value[exc.start]
        elif isinstance(value, dict):
            pending += value.keys()
            pending += value.values()
        elif isinstance(value, list):
            pending += value
    return None


def _one_prompt(body: Mapping[str, Any]) -> object:
    """A completions request's prompt (a list of one prompt is that prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return prompt[0]
    return prompt


def completion_prompt(body: Mapping[str, Any]) -> tuple[str, int]:
    """(content, tokens) of a completions prompt: a string, token ids, or one of either
    in a list (several prompts in one request are not served)."""
    prompt = _one_prompt(body)
    if isinstance(prompt, str):
        return prompt, synthetic_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        # A delimiter after every id keeps "1,2," from being a prefix of "1,23,".
        return "".join(f"{token}," for token in prompt), len(prompt)
    raise ApiError(
        400,
        "'prompt' must be a string or a non-empty list of token ids >= 0 (one prompt)",
        "prompt",
    )


def chat_prompt(body: Mapping[str, Any]) -> tuple[str, int]:
    """(content, tokens) of a chat prompt: its messages rendered one after another."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages", "messages")
    text = "".join(_render(message) for message in messages)
    return text, synthetic_tokens(text)


def _render(message: object) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(400, "each message must be an object with a string 'role'", "messages")
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        content = "".join(part for part in parts if isinstance(part, str))
    elif content is not None and not isinstance(content, str):
        raise ApiError(400, "a message's 'content' must be a string or a list of parts")
    calls = message.get("tool_calls")
    extra = json.dumps(calls, sort_keys=True) if calls else ""
    return f"<|{message['role']}|>{content or ''}{extra}\n"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _max_tokens(body: Mapping[str, Any], limit: int) -> int:
    """The output budget the client asked for (``max_completion_tokens`` before
    ``max_tokens``), refused with vLLM 0.32's message when above the context
    ``limit`` (a prompt plus it above the context is served shortened, as vLLM does)."""
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else None
    param = param or "max_tokens"
    value = body.get(param)
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not _is_int(value):
        raise ApiError(400, f"'{param}' must be a positive integer, got {value!r:.80}", param)
    if value < 1:
        raise ApiError(
            400,
            f"max_tokens must be at least 1, got {value}. (parameter={param}, value={value})",
            param,
        )
    if value > limit:
        raise ApiError(400, str(output_limit_error(value, limit, param)), param)
    return int(value)


def _xargs(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """``vllm_xargs``, its integers within vLLM's bounds (``XARGS_INTS``)."""
    xargs = body.get("vllm_xargs") or {}
    if not isinstance(xargs, Mapping):
        raise ApiError(400, "'vllm_xargs' must be a JSON object", "vllm_xargs")
    pending: list[object] = [xargs]
    while pending:
        value = pending.pop()
        if isinstance(value, int) and not XARGS_INTS[0] <= value < XARGS_INTS[1]:
            raise ApiError(
                400, "extra_args integers must be between -2**63 and 2**64 - 1.", "vllm_xargs"
            )
        if isinstance(value, Mapping):
            pending += value.values()
        elif isinstance(value, list):
            pending += value
    return xargs


def _name(value: object, field: str, *, empty: bool = False) -> str | None:
    """An id or name as the events carry it (1 to ``MAX_NAME`` characters; ``empty``:
    "" is taken as not given); ids may come as integers."""
    if value is None or (empty and value == ""):
        return None
    if _is_int(value):
        value = str(value)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME:
        raise ApiError(
            400,
            f"{field} must be a non-empty string of at most {MAX_NAME} characters, "
            f"got {value!r:.80}",
            field,
        )
    return value


def _session_id(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    named = _xargs(body).get("session_id") or body.get("session_id")
    named = named or headers.get(SESSION_HEADER.lower())
    return _name(named or None, "session_id")


def call_request(
    body: Mapping[str, Any], headers: Mapping[str, str], *, chat: bool, max_model_len: int
) -> CallRequest:
    """The engine's view of one request body (see the module docstring)."""
    if body.get("n", 1) != 1:
        raise ApiError(400, "only n=1 is served by the simulated engine", "n")
    max_tokens = _max_tokens(body, max_model_len)
    prompt, tokens = chat_prompt(body) if chat else completion_prompt(body)
    xargs = _xargs(body)
    next_tool = xargs.get(wire.NEXT_TOOL)
    try:
        turn = wire.turn(xargs)
        follows_tool = wire.flag(xargs, wire.FOLLOWS_TOOL)
        expects_tool = wire.flag(xargs, wire.EXPECTS_TOOL)
        expected_tool_s = wire.seconds(xargs, wire.EXPECTED_TOOL_S)
    except wire.HintError as error:
        raise ApiError(400, str(error), wire.XARGS) from None
    return CallRequest(
        prompt=prompt,
        prompt_tokens=tokens,
        max_tokens=max_tokens,
        session_id=_session_id(body, headers),
        turn=turn,
        follows_tool=follows_tool,
        expects_tool=expects_tool,
        next_tool=_name(next_tool, "vllm_xargs.next_tool", empty=True) if next_tool else None,
        expected_tool_s=expected_tool_s,
        agent=_name(xargs.get(wire.AGENT), "vllm_xargs.agent", empty=True) or "",
        task_id=_name(xargs.get(wire.TASK_ID), "vllm_xargs.task_id", empty=True),
        call_id=_name(xargs.get(wire.CALL_ID), "vllm_xargs.call_id", empty=True),
    )


def _session_hints(engine: LiveEngine, body: Mapping[str, Any], call: CallRequest) -> SessionHints:
    """What the call's session metadata says of its answer (``expects_tool`` None when
    the client did not say)."""
    said = wire.EXPECTS_TOOL in _xargs(body)
    expects = call.expects_tool if said else None
    return SessionHints(engine.next_turn(call), expects, call.next_tool)


def planned_reply(
    engine: LiveEngine, body: Mapping[str, Any], call: CallRequest, *, chat: bool
) -> Reply:
    """What the call's tokens will say; ``LiveError`` for a field the twin refuses."""
    refuse_logprobs(body, chat=chat)
    span = engine.check(call.prompt_tokens, call.max_tokens)
    tool_call = tool_call_for(body, _session_hints(engine, body, call)) if chat else None
    return reply_for(body, tool_call, span)


def _echo(body: Mapping[str, Any]) -> str:
    """The prompt as the answer echoes it: its text, or its token ids' words (the
    vocabulary's, as the answer's own ids map to them)."""
    prompt = _one_prompt(body)
    assert isinstance(prompt, str | list)  # call_request checked it
    return prompt if isinstance(prompt, str) else "".join(token_text(t) for t in prompt)


def _stream_usage(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(a usage chunk at the end, usage on every chunk), as vLLM reads
    ``stream_options``' ``include_usage`` and ``continuous_usage_stats``."""
    options = body.get("stream_options")
    if not isinstance(options, Mapping) or not options.get("include_usage"):
        return False, False
    return True, bool(options.get("continuous_usage_stats"))


# --- answers -----------------------------------------------------------------------------


def _usage(stream: CallStream, completion: int | None = None) -> dict[str, Any]:
    """The call's usage; ``completion``: the tokens sent so far (a stream's reader may
    lag behind the engine), else all it generated."""
    call = stream.call
    completion = call.output_tokens if completion is None else completion
    return {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": call.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": call.record.cached_tokens},
    }


class Answer:
    """One request's answer in the chat or the completions format."""

    def __init__(
        self, model: str, reply: Reply, *, chat: bool, token_ids: bool = False, echo: str = ""
    ) -> None:
        self.model = model
        self.reply = reply
        self.chat = chat
        self.token_ids = token_ids
        """Each choice carries its tokens' ids (vLLM's ``return_token_ids``)."""
        self.echo = echo
        """What the text starts with (the prompt, for the completions API's ``echo``)."""
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        if self.chat and chunk:
            kind += ".chunk"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(self, index: int | None, finish: str | None) -> dict[str, Any]:
        """Answer token ``index``'s chunk (None: the chat stream's opening role chunk)."""
        if not self.chat:
            text = "" if index is None else self.reply.piece(index)
            text = self.echo + text if index == 0 else text
            choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None}
            choice |= {"finish_reason": finish, "stop_reason": None}
        else:
            delta = {"role": "assistant", "content": ""} if index is None else self._delta(index)
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if self.token_ids:
            choice["token_ids"] = [] if index is None else [token_id(index)]
        return self._envelope([choice], chunk=True)

    def _delta(self, index: int) -> dict[str, Any]:
        """Token ``index``'s delta: content, or a piece of the tool call in OpenAI's
        chunk format (its id, type and name with the first piece of its arguments)."""
        call = self.reply.tool_call
        if call is None:
            return {"content": self.reply.piece(index)}
        piece: dict[str, Any] = {"index": 0, "function": {"arguments": self.reply.piece(index)}}
        if index == 0:
            piece |= {"id": call.id, "type": "function"}
            piece["function"] = {"name": call.name, **piece["function"]}
        return {"tool_calls": [piece]}

    def _message(self, said: str) -> dict[str, Any]:
        """The whole chat message: its content, or its tool call (arguments ``said``)."""
        call = self.reply.tool_call
        if call is None:
            return {"role": "assistant", "content": said, "tool_calls": []}
        function = {"name": call.name, "arguments": said}
        tool_call = {"id": call.id, "type": "function", "function": function}
        return {"role": "assistant", "content": None, "tool_calls": [tool_call]}

    def usage_chunk(self, stream: CallStream) -> dict[str, Any]:
        return {**self._envelope([], chunk=True), "usage": _usage(stream)}

    def whole(self, stream: CallStream) -> dict[str, Any]:
        produced = stream.call.output_tokens
        text = "".join(self.reply.piece(i) for i in range(produced))
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": self._message(text)}
        else:
            choice = {"index": 0, "text": self.echo + text, "stop_reason": None}
        choice["logprobs"] = None
        # vLLM's reason for a call cut short (only at shutdown: a client that leaves
        # reads no answer).
        finished = stream.status == "finished"
        choice["finish_reason"] = self.reply.finish_reason if finished else "abort"
        if self.token_ids:
            choice["token_ids"] = [token_id(i) for i in range(produced)]
        return {**self._envelope([choice], chunk=False), "usage": _usage(stream)}


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _stream_events(
    stream: CallStream, answer: Answer, usage: tuple[bool, bool]
) -> AsyncIterator[bytes]:
    """The SSE body of a chat or completions answer."""
    final_usage, continuous = usage
    if answer.chat:
        yield _sse(answer.chunk(None, None))
    reply = answer.reply
    async for index in stream.tokens():
        last = index + 1 == reply.length
        chunk = answer.chunk(index, reply.finish_reason if last else None)
        yield _sse({**chunk, "usage": _usage(stream, index + 1)} if continuous else chunk)
    if final_usage:
        yield _sse(answer.usage_chunk(stream))
    yield b"data: [DONE]\n\n"


def _streamed(engine: LiveEngine, stream: CallStream, events: AsyncIterator[bytes]) -> Response:
    """An SSE answer; leaving early (the client disconnected) aborts the call."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                yield event
        finally:
            if stream.status == "running":
                engine.abort(stream)

    return ClosingStreamingResponse(body(), media_type="text/event-stream")


class WholeAnswer(Protocol):
    def whole(self, stream: CallStream) -> dict[str, Any]: ...


async def _whole(
    engine: LiveEngine, request: Request, stream: CallStream, answer: WholeAnswer
) -> Response:
    async def drain() -> None:
        async for _ in stream.tokens():
            pass

    try:
        with ClientWatch(request) as watch:
            await watch.unless_gone(drain())
    except ClientGone:
        engine.abort(stream)
        return Response(status_code=499)  # nobody reads it: the client is gone
    return JSONResponse(answer.whole(stream))


# --- the app -----------------------------------------------------------------------------


def create_live_app(engine: LiveEngine, *, model: str | None = None) -> FastAPI:
    """The API over ``engine``; its lifespan runs the step loop. ``model``: the served
    model id (default: the profile's name)."""
    served = model or engine.profile.name
    metrics = TwinMetrics(engine, served)
    stored = responses_api.ResponseStore()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(engine.run())
        try:
            yield
        finally:
            engine.shutdown()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="agentmars simulated engine", lifespan=lifespan)

    async def checked_body(request: Request) -> dict[str, Any]:
        body = _json_object(await request.body())
        if not isinstance(body.get("model", ""), str):
            raise ApiError(400, "'model' must be a string", "model")
        if not isinstance(body.get("stream", False), bool):
            raise ApiError(400, "'stream' must be true or false", "stream")
        if body.get("model") not in (None, served):
            raise ApiError(404, f"The model `{body['model']}` does not exist.", "model")
        return body

    def planned(
        body: Mapping[str, Any], headers: Mapping[str, str], *, chat: bool
    ) -> tuple[CallRequest, Reply]:
        """The call a chat or completions body asks for, planned to end as its reply
        does (``LiveError`` for a field the twin refuses)."""
        call = call_request(body, headers, chat=chat, max_model_len=engine.profile.max_model_len)
        reply = planned_reply(engine, body, call, chat=chat)
        return replace(call, ends_after=reply.tokens, finish_reason=reply.finish_reason), reply

    async def complete(request: Request, *, chat: bool) -> Response:
        body = await checked_body(request)
        try:
            call, reply = planned(body, request.headers, chat=chat)
            echo = _echo(body) if echoes(body, chat=chat) else ""
            stream = engine.submit(call)
        except LiveError as exc:
            raise ApiError(400, str(exc), exc.param) from None
        token_ids = body.get("return_token_ids") is True
        answer = Answer(served, reply, chat=chat, token_ids=token_ids, echo=echo)
        if body.get("stream"):
            return _streamed(engine, stream, _stream_events(stream, answer, _stream_usage(body)))
        return await _whole(engine, request, stream, answer)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        """OpenAI chat completions from the simulated engine."""
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """OpenAI text completions from the simulated engine."""
        return await complete(request, chat=False)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        """OpenAI's Responses API from the simulated engine (``responses_api``)."""
        body = await checked_body(request)
        try:
            chat = responses_api.as_chat(body, stored)
            call, reply = planned(chat, request.headers, chat=True)
            stream = engine.submit(call)
        except responses_api.UnknownResponse as exc:
            message = f"Response with id '{exc}' not found."
            raise ApiError(404, message, "previous_response_id") from None
        except LiveError as exc:
            raise ApiError(400, str(exc), exc.param) from None
        answer = responses_api.ResponsesAnswer(served, reply, chat, body, stored)
        if body.get("stream"):
            return _streamed(engine, stream, answer.events(stream))
        return await _whole(engine, request, stream, answer)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        """Anthropic's Messages API from the simulated engine (``messages_api``)."""
        try:
            body = await checked_body(request)
            chat = messages_api.as_chat(body)
            call, reply = planned(chat, request.headers, chat=True)
            stream = engine.submit(call)
        except ApiError as exc:
            return messages_api.error_response(exc.status, exc.message)
        except LiveError as exc:
            return messages_api.error_response(400, str(exc))
        answer = messages_api.MessagesAnswer(served, reply, chat)
        if body.get("stream"):
            return _streamed(engine, stream, answer.events(stream))
        return await _whole(engine, request, stream, answer)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        """vLLM's tokenizer route, on the twin's synthetic tokens (``synthetic_ids``)."""
        body = await checked_body(request)
        if "messages" in body:
            text, _ = chat_prompt(body)
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise ApiError(400, "'prompt' must be a string, or give 'messages'", "prompt")
        ids, pieces = synthetic_ids(text)
        strs = pieces if body.get("return_token_strs") is True else None
        limit = engine.profile.max_model_len
        return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        """Token ids as the twin's vocabulary words (``replies.token_text``)."""
        body = await checked_body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(_is_int(t) and t >= 0 for t in tokens):
            raise ApiError(400, "'tokens' must be a list of token ids >= 0", "tokens")
        return {"prompt": "".join(token_text(token) for token in tokens)}

    @app.get("/version")
    async def version() -> dict[str, str]:
        """The vLLM API version the twin answers as."""
        return {"version": VLLM_API_VERSION}

    def card() -> dict[str, Any]:
        return {
            "id": served,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "agentmars",
            "root": served,
            "parent": None,
            "max_model_len": engine.profile.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """The one served model, with its context length."""
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str) -> dict[str, Any]:
        """The served model's card (``models.retrieve``); 404 for another."""
        if model_id != served:
            raise ApiError(404, f"The model `{model_id}` does not exist.", "model")
        return card()

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine serves (vLLM's route)."""
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus metrics of the engine."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    app.add_exception_handler(ApiError, api_error)
    # Bodies bounded as they arrive, as in front of the gateway (a chunked body too).
    app.add_middleware(RequestGuard, max_body_bytes=COMPLETION_BODY_BYTES)
    return app
