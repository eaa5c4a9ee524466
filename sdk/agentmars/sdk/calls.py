"""LLM calls and tool calls: the boundaries a session crosses, and the hints an agent
gives about the tool that follows an LLM call.

Each call is a ``Scope`` (context manager or decorator) bound to the current
session, or one given explicitly. The explicit methods (``submit`` /
``first_token`` / ``end`` and ``enqueue`` / ``start`` / ``end``) let code whose
boundaries are not a ``with`` block (a stream consumed later, a queued tool)
record them where they happen. Every method is idempotent where a repeat can
happen by accident, so an event is emitted at most once per boundary.
"""

from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar, Token
from typing import Any, Literal, Self

from agentmars.sdk import wire
from agentmars.sdk.events import (
    MAX_COUNT,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    as_count,
    check_id,
    clock,
    lone_surrogate,
)
from agentmars.sdk.events import new_id as _new_id
from agentmars.sdk.scope import Scope, outcome_of
from agentmars.sdk.session import Session, require_session

KV_BLOCK_SIZE = 16
"""Tokens per KV block used for ``projected_kv_blocks`` (vLLM's GPU default; our
choice for the client side, the engine side reports in its own block size)."""

Status = Literal["ok", "error", "cancelled"]
ToolStatus = Literal["ok", "error", "timeout", "killed", "cancelled"]

_HINTS: ContextVar[Hints | None] = ContextVar("agentmars_hints", default=None)


class Hints(Scope):
    """Scheduling hints for the LLM calls made inside it: the tool the agent expects to
    run once such a call ends (``next_tool``) and for how long (``expected_tool_s``),
    so a policy can judge whether the session's KV is worth keeping across that tool.

    ``with hints(next_tool="pytest", expected_tool_s=30): client.chat...``, also
    ``async with`` or as a decorator. The client integrations send the hints in
    ``vllm_xargs``; a block inside another replaces its hints (it does not merge).
    """

    def __init__(
        self, *, next_tool: str | None = None, expected_tool_s: float | None = None
    ) -> None:
        if next_tool is not None:
            check_id(next_tool, "next_tool")
        if expected_tool_s is not None and not _is_seconds(expected_tool_s):
            raise ValueError(
                f"expected_tool_s must be a finite number >= 0, got {expected_tool_s!r}"
            )
        self.next_tool = next_tool
        self.expected_tool_s = expected_tool_s
        self._token: Token[Hints | None] | None = None

    def fresh(self) -> Self:
        return type(self)(next_tool=self.next_tool, expected_tool_s=self.expected_tool_s)

    def as_xargs(self) -> dict[str, str | float]:
        """The hints given, as ``vllm_xargs`` entries."""
        given = {wire.NEXT_TOOL: self.next_tool, wire.EXPECTED_TOOL_S: self.expected_tool_s}
        return {name: value for name, value in given.items() if value is not None}

    def _open(self) -> None:
        if self._token is not None:
            raise RuntimeError("these hints are in use already; open new ones")
        self._token = _HINTS.set(self)

    def _close(self, exc: BaseException | None) -> None:
        assert self._token is not None
        # Closed from another context (as a session can be): nothing to restore there.
        with contextlib.suppress(ValueError):
            _HINTS.reset(self._token)
        self._token = None


def current_hints() -> Hints | None:
    """The hints of the innermost open ``hints`` block of this thread / task, or None."""
    return _HINTS.get()


def _is_seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def read_field(obj: Any, name: str) -> Any:
    """Read a field from a response object or a plain dict alike."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def as_name(value: object) -> str | None:
    """An id or a name read off a response, if an event can carry it."""
    if not isinstance(value, str) or not 1 <= len(value) <= 256:
        return None
    return value if lone_surrogate(value) is None else None


def _ns_to_s(ns: int) -> float:
    return max(ns, 0) / 1e9


_COUNT_FIELDS = ("prompt_tokens", "cached_tokens", "output_tokens")


class LLMCall(Scope):
    """One LLM call of the session: ``llm_submit`` -> ``llm_first_token`` -> ``llm_end``.

    The turn index and the ``follows_tool`` marker are assigned at submit time
    from the session; ``expects_tool`` says whether the caller expects the call
    to end in a tool call (integrations set it when tools are offered).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        operation: Literal["chat", "text_completion"] = "chat",
        stream: bool = False,
        projected_prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        follows_tool: bool | None = None,
        expects_tool: bool = False,
        provider: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
        session: Session | None = None,
    ) -> None:
        for name, value in (("projected_prompt_tokens", projected_prompt_tokens),
                            ("max_tokens", max_tokens)):  # fmt: skip
            if value is not None and as_count(value) is None:
                raise ValueError(f"{name} must be an integer from 0 to {MAX_COUNT}")
        for name, text in (("provider", provider), ("server_address", server_address)):
            if text is not None:
                check_id(text, name)
        if server_port is not None and not (
            isinstance(server_port, int) and not isinstance(server_port, bool)
            and 1 <= server_port <= 65535
        ):  # fmt: skip
            raise ValueError(f"server_port must be a port number, got {server_port!r}")
        self.model = model
        self.operation = operation
        self.stream = stream
        self.projected_prompt_tokens = projected_prompt_tokens
        self.max_tokens = max_tokens
        self._given_follows_tool = follows_tool
        self.expects_tool = expects_tool
        self.provider = provider
        """The GenAI provider as the client sees it (``openai``...)."""
        self.server_address = server_address
        self.server_port = server_port
        self._given_session = session
        self.session: Session | None = None
        self.call_id = _new_id()[:16]
        self.turn: int | None = None
        self.hints: Hints | None = None
        """The ``hints`` block open when the call was submitted."""
        self.follows_tool = bool(follows_tool)
        self._submit_ns: int | None = None
        self._first_token_ns: int | None = None
        self._ended = False
        self.usage: dict[str, Any] = {}

    def fresh(self) -> Self:
        return type(self)(
            self.model,
            operation=self.operation,
            stream=self.stream,
            projected_prompt_tokens=self.projected_prompt_tokens,
            max_tokens=self.max_tokens,
            follows_tool=self._given_follows_tool,
            expects_tool=self.expects_tool,
            provider=self.provider,
            server_address=self.server_address,
            server_port=self.server_port,
            session=self._given_session,
        )

    # --- boundaries ---------------------------------------------------------------

    def submit(self) -> Self:
        if self._submit_ns is not None:
            return self
        self.session = self._given_session or require_session("an LLM call")
        self.hints = current_hints()
        self.turn, pending_tool = self.session.begin_llm_call()
        self.follows_tool = pending_tool if self._given_follows_tool is None else self.follows_tool
        projected = self.projected_prompt_tokens
        event = LLMSubmit(
            session_id=self.session.session_id,
            call_id=self.call_id,
            turn=self.turn,
            model=self.model,
            operation=self.operation,
            stream=self.stream,
            projected_prompt_tokens=projected,
            projected_kv_blocks=None if projected is None else math.ceil(projected / KV_BLOCK_SIZE),
            max_tokens=self.max_tokens,
            follows_tool=self.follows_tool,
            expects_tool=self.expects_tool,
            provider=self.provider,
            server_address=self.server_address,
            server_port=self.server_port,
        )
        self._submit_ns = event.mono_ns
        self.session.emit(event)
        return self

    def first_token(self) -> None:
        if self._first_token_ns is not None or self._submit_ns is None or self._ended:
            return
        stamps = clock()
        self._first_token_ns = stamps["mono_ns"]
        assert self.session is not None and self.turn is not None
        self.session.emit(
            LLMFirstToken(
                session_id=self.session.session_id,
                call_id=self.call_id,
                turn=self.turn,
                **stamps,
                ttft_s=_ns_to_s(self._first_token_ns - self._submit_ns),
            )
        )

    def record_usage(
        self,
        *,
        prompt_tokens: int | None = None,
        cached_tokens: int | None = None,
        output_tokens: int | None = None,
        finish_reason: str | None = None,
        ended_in_tool_call: bool | None = None,
        response_id: str | None = None,
        response_model: str | None = None,
    ) -> None:
        """Remember what the response reported; later values override earlier ones.

        Raises ``ValueError`` here, at the call site, for a value ``llm_end`` could
        not carry (a negative or non-integer count, a non-string finish reason, an id
        or model name that is not 1-256 characters)."""
        given = {
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens,
            "output_tokens": output_tokens,
            "finish_reason": finish_reason,
            "ended_in_tool_call": ended_in_tool_call,
            "response_id": response_id,
            "response_model": response_model,
        }
        for name in ("response_id", "response_model"):
            if given[name] is not None:
                check_id(given[name], name)
        for name in _COUNT_FIELDS:
            if given[name] is not None and as_count(given[name]) is None:
                raise ValueError(f"{name} must be an integer >= 0, got {given[name]!r}")
        if finish_reason is not None and not isinstance(finish_reason, str):
            raise ValueError(f"finish_reason must be a string, got {finish_reason!r}")
        if ended_in_tool_call is not None and not isinstance(ended_in_tool_call, bool):
            raise ValueError(f"ended_in_tool_call must be a bool, got {ended_in_tool_call!r}")
        self.usage.update({k: v for k, v in given.items() if v is not None})

    def record_response(self, response: Any) -> None:
        """Take usage, finish reason and tool calls from an OpenAI-style response or
        stream chunk (object or dict); anything missing is left as it was, and so is
        anything unusable (the response is the provider's data: it must never make
        the agent's call fail)."""
        self.record_usage(
            response_id=as_name(read_field(response, "id")),
            response_model=as_name(read_field(response, "model")),
        )
        usage = read_field(response, "usage")
        if usage is not None:
            self.record_usage(
                prompt_tokens=as_count(read_field(usage, "prompt_tokens")),
                output_tokens=as_count(read_field(usage, "completion_tokens")),
                cached_tokens=as_count(
                    read_field(read_field(usage, "prompt_tokens_details"), "cached_tokens")
                ),
            )
        for choice in read_field(response, "choices") or ():
            message = read_field(choice, "message") or read_field(choice, "delta")
            reason = read_field(choice, "finish_reason")
            if not isinstance(reason, str):
                reason = None
            self.record_usage(
                finish_reason=reason,
                ended_in_tool_call=True if read_field(message, "tool_calls") else None,
            )
            if reason == "tool_calls":
                self.record_usage(ended_in_tool_call=True)

    def end(self, status: Status = "ok", error: str | None = None) -> None:
        if self._ended or self._submit_ns is None:
            return
        self._ended = True
        assert self.session is not None and self.turn is not None
        stamps = clock()
        usage = dict(self.usage)
        prompt, cached = usage.get("prompt_tokens"), usage.get("cached_tokens")
        if prompt is not None and cached is not None and cached > prompt:
            # Inconsistent reports (e.g. from different chunks): llm_end would reject
            # them and the call's end would be lost; keep the prompt size, drop the rest.
            del usage["cached_tokens"]
        self.session.emit(
            LLMEnd(
                session_id=self.session.session_id,
                call_id=self.call_id,
                turn=self.turn,
                **stamps,
                status=status,
                error=error,
                duration_s=_ns_to_s(stamps["mono_ns"] - self._submit_ns),
                **usage,
            )
        )

    @property
    def ended(self) -> bool:
        return self._ended

    # --- Scope --------------------------------------------------------------------

    def _open(self) -> None:
        self.submit()

    def _close(self, exc: BaseException | None) -> None:
        status, error = outcome_of(exc)
        self.end(status, error)  # type: ignore[arg-type]

    def _on_result(self, result: Any) -> None:
        self.record_response(result)


class ToolCall(Scope):
    """One tool call: ``tool_enqueue`` -> ``tool_start`` -> ``tool_end``.

    As a context manager it is enqueued and started on entry (an in-process tool
    has no queue); a pool that queues calls uses ``enqueue()`` and ``start()``.
    Without a ``priority`` it takes, at ``enqueue``, the one the gateway last sent
    the session (``Session.tool_priority``): pass ``call.priority`` on to the
    sandbox pool.
    """

    def __init__(
        self,
        tool: str,
        *,
        call_id: str | None = None,
        priority: int | None = None,
        session: Session | None = None,
    ) -> None:
        check_id(tool, "tool")
        if call_id is not None:
            check_id(call_id, "call_id")
        self.tool = tool
        self._given_call_id = call_id
        self.call_id = call_id or _new_id()[:16]
        self._given_priority = priority
        self.priority = priority
        self._given_session = session
        self.session: Session | None = None
        self.turn: int | None = None
        self._enqueue_ns: int | None = None
        self._start_ns: int | None = None
        self._ended = False
        self.exit_status: int | None = None

    def fresh(self) -> Self:
        return type(self)(
            self.tool,
            call_id=self._given_call_id,
            priority=self._given_priority,
            session=self._given_session,
        )

    def _ids(self) -> dict[str, Any]:
        assert self.session is not None
        return {
            "session_id": self.session.session_id,
            "call_id": self.call_id,
            "turn": self.turn,
            "tool": self.tool,
        }

    def enqueue(self) -> Self:
        if self._enqueue_ns is not None:
            return self
        self.session = self._given_session or require_session("a tool call")
        self.turn = self.session.current_turn()
        if self.priority is None:
            self.priority = self.session.tool_priority
        event = ToolEnqueue(**self._ids(), priority=self.priority)
        self._enqueue_ns = event.mono_ns
        self.session.emit(event)
        return self

    def start(self) -> Self:
        self.enqueue()
        if self._start_ns is not None:
            return self
        assert self.session is not None and self._enqueue_ns is not None
        stamps = clock()
        self._start_ns = stamps["mono_ns"]
        self.session.emit(
            ToolStart(
                **self._ids(),
                **stamps,
                queue_wait_s=_ns_to_s(self._start_ns - self._enqueue_ns),
            )
        )
        return self

    def set_exit_status(self, code: int) -> None:
        """The tool's exit status; non-zero ends the call with status ``error``."""
        self.exit_status = code

    def end(
        self,
        status: ToolStatus | None = None,
        error: str | None = None,
        cpu_time_s: float | None = None,
    ) -> None:
        if self._ended or self.session is None:
            return
        self._ended = True
        stamps = clock()
        now = stamps["mono_ns"]
        if status is None:
            status = "ok" if not self.exit_status else "error"
        started = self._start_ns if self._start_ns is not None else now
        self.session.emit(
            ToolEnd(
                **self._ids(),
                **stamps,
                status=status,
                exit_status=self.exit_status,
                error=error,
                duration_s=_ns_to_s(now - started),
                cpu_time_s=cpu_time_s,
            )
        )
        self.session.note_tool_result()

    @property
    def ended(self) -> bool:
        return self._ended

    def _open(self) -> None:
        self.start()

    def _close(self, exc: BaseException | None) -> None:
        status, error = outcome_of(exc)
        self.end(None if status == "ok" else status, error)  # type: ignore[arg-type]

    def _on_result(self, result: Any) -> None:
        # A decorated tool returning a process result (subprocess.CompletedProcess,
        # an OpenHands observation) reports its exit status through it.
        for name in ("returncode", "exit_code"):
            code = getattr(result, name, None)
            if isinstance(code, int):
                self.set_exit_status(code)
                return


llm_call = LLMCall
tool = ToolCall
hints = Hints
