"""What every LLM-client integration does to a request, once.

``begin_call`` opens an ``LLMCall`` for the current session from the request's
keyword arguments (model, stream, max tokens, tools, messages or Responses input) and
writes the session metadata into them; ``RecordedStream`` / ``RecordedAsyncStream``
record first token and end while the caller consumes a stream. Answers are read in
both shapes: chat and text completions (``choices``, ``usage.prompt_tokens``) and
OpenAI's Responses API (``output``, ``usage.input_tokens``, typed stream events). The
OpenAI and LiteLLM integrations only adapt these to their client's call style.

Wire contract (vLLM 0.32 reads all three, see shared notes on the plugin):
header ``X-Session-ID``; body ``session_id``; body ``vllm_xargs`` with
``session_id``, ``call_id`` (the id the SDK's events give the call), ``turn``,
``follows_tool`` and ``expects_tool`` (0/1 ints: vLLM's extra_args take str /
int / float only), and, when known, the session's ``agent`` and ``task_id`` and
the ``hints`` block's ``next_tool`` and ``expected_tool_s``. Other values the
caller already put in ``vllm_xargs`` are kept, and so is a hint the caller gave
a call there itself (it is more specific than a session's or a block's); the
ids and markers are always the SDK's, so the wire and the events agree.

With the call go the trace context headers of its span (W3C ``traceparent``...), when
the session's emitter has a sink that traces it (``Emitter.trace_headers``): the
gateway's and the engine's spans join the session's trace. A ``traceparent`` the caller
put in ``extra_headers`` itself is kept.

The call's ``Target`` (the model as telemetry names it, the provider, the server) is the
integration's to say: each client knows where it sends a call.

The other way, the gateway answers with header ``X-Agentmars-Tool-Priority``: where
the session's tool calls go in the sandbox pool's queue (the policy's CPU side).
``remember_tool_priority`` keeps the newest for the current session, and its
``ToolCall``s take it when the caller gives no priority.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from agentmars.sdk import wire
from agentmars.sdk.calls import LLMCall, as_name, current_hints, read_field
from agentmars.sdk.events import as_count
from agentmars.sdk.scope import outcome_of
from agentmars.sdk.session import current_session
from agentmars.sdk.wire import SESSION_HEADER, TOOL_PRIORITY_HEADER

Operation = Literal["chat", "text_completion"]
IsStream = Callable[[Any], bool]
TRACEPARENT = "traceparent"
TOOL_PRIORITY_BOUNDS = (-(2**31), 2**31 - 1)
"""The sandbox pool's (``agentmars.sandbox.admission``), so a remembered priority
always goes to the pool as it is."""
_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")
_MAX_TOKENS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""Where chat, text completion and Responses requests bound the output."""
_RESPONSE_ENDED = ("completed", "incomplete", "failed", "cancelled")
_TOOL_CALL_ITEMS = ("function_call", "custom_tool_call")
_TOOL_RESULT_ITEMS = ("function_call_output", "custom_tool_call_output")
CHARS_PER_TOKEN = 4
"""Client-side prompt projection (our choice: ~4 characters per token for
English and code with BPE tokenizers); the gateway replaces it with the
engine tokenizer's exact count."""


@dataclass(frozen=True)
class Target:
    """Where a call goes, as its telemetry names it (``gen_ai.request.model``,
    ``gen_ai.provider.name``, ``server.address`` / ``server.port``)."""

    model: str | None
    provider: str | None = None
    server_address: str | None = None
    server_port: int | None = None

    @classmethod
    def of_url(cls, model: str | None, provider: str, url: object) -> Target:
        """A call to the API at ``url`` (a client's base URL): its host, and its port,
        the scheme's default when the URL gives none."""
        parts = urlsplit(str(url))
        try:
            port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
        except ValueError:
            port = None
        return cls(model, provider, as_name(parts.hostname), port)


Targeting = Callable[[Mapping[str, Any]], Target]
"""Says where a call with these keyword arguments goes."""


def project_prompt_tokens(kwargs: Mapping[str, Any]) -> int | None:
    """A cheap estimate of the prompt's tokens from messages, prompt text, or a
    Responses API request's instructions and input, with the tools offered (a chat
    template writes their schemas into the prompt); a prompt of token ids is counted
    exactly."""
    if "messages" in kwargs:
        text = json.dumps(kwargs["messages"], default=str, ensure_ascii=False)
    elif "input" in kwargs:
        instructions = str(kwargs.get("instructions") or "")
        text = instructions + json.dumps(kwargs["input"], default=str, ensure_ascii=False)
    elif "prompt" in kwargs:
        prompt = kwargs["prompt"]
        if _is_token_ids(prompt):
            return max(1, len(prompt))
        text = str(prompt)
    else:
        return None
    if kwargs.get("tools"):
        text += json.dumps(kwargs["tools"], default=str, ensure_ascii=False)
    return max(1, len(text) // CHARS_PER_TOKEN)


def _is_token_ids(prompt: object) -> bool:
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(token, int) and not isinstance(token, bool) for token in prompt)
    )


def tool_priority_of(headers: Mapping[str, str] | None) -> int | None:
    """The tool priority an answer's headers carry (any case of the header's name);
    None without one, 0 for a value that is not an integer within the sandbox pool's
    bounds (the gateway's word is advice: a garbled one must not fail the agent)."""
    wanted = TOOL_PRIORITY_HEADER.lower()
    value = next((v for k, v in (headers or {}).items() if k.lower() == wanted), None)
    if value is None:
        return None
    if not isinstance(value, str) or not _INTEGER.fullmatch(value.strip()):
        return 0
    low, high = TOOL_PRIORITY_BOUNDS
    priority = int(value)
    return priority if low <= priority <= high else 0


def remember_tool_priority(headers: Mapping[str, str] | None) -> None:
    """Keep the tool priority of an LLM answer's ``headers`` for the current session
    (nothing without a session or a priority)."""
    session = current_session()
    priority = tool_priority_of(headers)
    if session is not None and priority is not None:
        session.tool_priority = priority


def _ends_in_tool_result(kwargs: Mapping[str, Any]) -> bool:
    """Whether the chat messages or the Responses input end with a tool's result."""
    items = kwargs.get("messages", kwargs.get("input"))
    if not items or isinstance(items, str):
        return False
    last = items[-1]
    return (
        read_field(last, "role") in ("tool", "function")
        or read_field(last, "type") in _TOOL_RESULT_ITEMS
    )


def _expects_tool(kwargs: Mapping[str, Any]) -> bool:
    """Tools offered (and not refused), or the caller's hints naming the tool that will
    follow (a call without ``tools``, e.g. a completion, can still end in one)."""
    if kwargs.get("tools") and kwargs.get("tool_choice") != "none":
        return True
    hints = current_hints()
    return hints is not None and hints.next_tool is not None


def _model_only(kwargs: Mapping[str, Any]) -> Target:
    return Target(str(kwargs["model"]) if kwargs.get("model") is not None else None)


def begin_call(
    kwargs: dict[str, Any], operation: Operation, target: Targeting = _model_only
) -> LLMCall | None:
    """Open (submit) an LLM call for the current session and inject its metadata into
    ``kwargs``; returns None, leaving ``kwargs`` untouched, outside any session.
    ``target`` says where the call goes (asked inside a session only)."""
    if current_session() is None:
        return None
    where = target(kwargs)
    max_tokens = next((kwargs[k] for k in _MAX_TOKENS if kwargs.get(k) is not None), None)
    call = LLMCall(
        where.model,
        provider=where.provider,
        server_address=where.server_address,
        server_port=where.server_port,
        operation=operation,
        stream=bool(kwargs.get("stream")),
        projected_prompt_tokens=project_prompt_tokens(kwargs),
        max_tokens=as_count(max_tokens),
        # A tool result at the end of the context is the authoritative marker;
        # without one the session's own tool bookkeeping decides.
        follows_tool=True if _ends_in_tool_result(kwargs) else None,
        expects_tool=_expects_tool(kwargs),
    ).submit()
    inject_metadata(kwargs, call)
    return call


def _hints(call: LLMCall) -> dict[str, str | float]:
    """The session's agent and task and the call's hints, those that are known."""
    assert call.session is not None
    known = {wire.AGENT: call.session.agent, wire.TASK_ID: call.session.task_id}
    hints = {name: value for name, value in known.items() if value is not None}
    return {**hints, **(call.hints.as_xargs() if call.hints is not None else {})}


def inject_metadata(kwargs: dict[str, Any], call: LLMCall) -> None:
    """Merge the call's session metadata into ``extra_headers`` / ``extra_body``."""
    assert call.session is not None and call.turn is not None
    session_id = call.session.session_id
    headers = dict(kwargs.get("extra_headers") or {})
    headers[SESSION_HEADER] = session_id
    if not any(name.lower() == TRACEPARENT for name in headers):
        headers.update(call.session.emitter.trace_headers(session_id, call.call_id))
    body = dict(kwargs.get("extra_body") or {})
    body[wire.SESSION_ID] = session_id
    body[wire.XARGS] = {
        **_hints(call),
        **(body.get(wire.XARGS) or {}),
        wire.SESSION_ID: session_id,
        wire.CALL_ID: call.call_id,
        wire.TURN: call.turn,
        wire.FOLLOWS_TOOL: int(call.follows_tool),
        wire.EXPECTS_TOOL: int(call.expects_tool),
    }
    kwargs["extra_headers"] = headers
    kwargs["extra_body"] = body


def _carries_output(chunk: Any) -> bool:
    """A chunk with generated content or a tool call marks the first token (a bare
    role chunk or a usage-only chunk does not); of the Responses API's typed stream
    events, the deltas do (text, tool arguments, reasoning), the others do not."""
    event_type = read_field(chunk, "type")
    if isinstance(event_type, str):
        return event_type.endswith(".delta") and bool(read_field(chunk, "delta"))
    for choice in read_field(chunk, "choices") or ():
        if read_field(choice, "text"):
            return True
        delta = read_field(choice, "delta")
        if any(read_field(delta, k) for k in ("content", "tool_calls", "reasoning_content")):
            return True
    return False


def recorded_call(
    create: Callable[..., Any],
    kwargs: dict[str, Any],
    operation: Operation,
    is_stream: IsStream,
    target: Targeting = _model_only,
) -> Any:
    """Run a client's sync ``create(**kwargs)`` as a recorded LLM call of the current
    session (untouched outside one); a stream comes back wrapped to record as read."""
    call = begin_call(kwargs, operation, target)
    if call is None:
        return create(**kwargs)
    try:
        response = create(**kwargs)
    except BaseException as exc:
        finish_call(call, exc)
        raise
    return RecordedStream(response, call) if is_stream(response) else _whole(call, response)


async def recorded_acall(
    create: Callable[..., Awaitable[Any]],
    kwargs: dict[str, Any],
    operation: Operation,
    is_stream: IsStream,
    target: Targeting = _model_only,
) -> Any:
    """The async counterpart of ``recorded_call``."""
    call = begin_call(kwargs, operation, target)
    if call is None:
        return await create(**kwargs)
    try:
        response = await create(**kwargs)
    except BaseException as exc:
        finish_call(call, exc)
        raise
    return RecordedAsyncStream(response, call) if is_stream(response) else _whole(call, response)


def _whole(call: LLMCall, response: Any) -> Any:
    # A whole response shows no first-token time to the client: none is recorded.
    record_answer(call, response)
    call.end()
    return response


def observe_chunk(call: LLMCall, chunk: Any) -> None:
    if _carries_output(chunk):
        call.first_token()
    record_answer(call, chunk)


def record_answer(call: LLMCall, answer: Any) -> None:
    """Record the usage, finish and tool calls of a whole answer or a stream chunk: a
    chat or text completion's through ``LLMCall.record_response``; a Responses API
    response's (whole, or in the event of its life that carries it, such as the
    ``response.completed`` ending a stream) here, its fields having other names. Read as
    the gateway reads them (``server/gateway/llm_apis.py``), so both report one finish."""
    is_response = read_field(answer, "object") == "response"
    response = answer if is_response else read_field(answer, "response")
    if read_field(response, "object") != "response":
        call.record_response(answer)
        return
    usage = read_field(response, "usage")
    details = read_field(usage, "input_tokens_details")
    call.record_usage(
        prompt_tokens=as_count(read_field(usage, "input_tokens")),
        output_tokens=as_count(read_field(usage, "output_tokens")),
        cached_tokens=as_count(read_field(details, "cached_tokens")),
        response_id=as_name(read_field(response, "id")),
        response_model=as_name(read_field(response, "model")),
    )
    status = read_field(response, "status")
    if status in _RESPONSE_ENDED:
        output = read_field(response, "output") or ()
        calls = any(read_field(item, "type") in _TOOL_CALL_ITEMS for item in output)
        reason = read_field(read_field(response, "incomplete_details"), "reason") or status
        call.record_usage(finish_reason=str(reason), ended_in_tool_call=calls)


def finish_call(call: LLMCall, exc: BaseException | None) -> None:
    status, error = outcome_of(exc)
    call.end(status, error)  # type: ignore[arg-type]


class RecordedStream:
    """Wraps a client's sync stream: the first content chunk records the first token,
    exhaustion records the end (with the usage the chunks carried), an error or an
    early ``close()`` records it as error / cancelled. Everything else is delegated."""

    def __init__(self, stream: Any, call: LLMCall) -> None:
        self._stream = stream
        self._iterator: Iterator[Any] = iter(stream)
        self._call = call

    def __iter__(self) -> RecordedStream:
        return self

    def __next__(self) -> Any:
        try:
            chunk = next(self._iterator)
        except StopIteration:
            self._call.end()
            raise
        except BaseException as exc:
            finish_call(self._call, exc)
            raise
        observe_chunk(self._call, chunk)
        return chunk

    def close(self) -> None:
        self._call.end("cancelled", "stream closed before its end")
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> RecordedStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class RecordedAsyncStream:
    """The async counterpart of ``RecordedStream``."""

    def __init__(self, stream: Any, call: LLMCall) -> None:
        self._stream = stream
        self._iterator: AsyncIterator[Any] = stream.__aiter__()
        self._call = call

    def __aiter__(self) -> RecordedAsyncStream:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._iterator.__anext__()
        except StopAsyncIteration:
            self._call.end()
            raise
        except BaseException as exc:
            finish_call(self._call, exc)
            raise
        observe_chunk(self._call, chunk)
        return chunk

    async def close(self) -> None:
        self._call.end("cancelled", "stream closed before its end")
        for name in ("close", "aclose"):
            close = getattr(self._stream, name, None)
            if close is not None:
                await close()
                return

    async def __aenter__(self) -> RecordedAsyncStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
