"""OpenTelemetry sink: the event stream as spans that follow the GenAI semantic conventions.

One trace per agent session::

    invoke_agent coder                (session_start .. session_end, INTERNAL)
    ├── chat my-model                 (llm_submit .. llm_end, CLIENT; event gen_ai.first_token)
    ├── execute_tool terminal         (tool_enqueue .. tool_end, INTERNAL; event tool.start)
    └── chat my-model

Span times are the events' ``wall_ns``, passed explicitly, so the spans are right
even when the sink sees the events late (a relayed or replayed stream). Session
spans are always trace roots: the sink does not parent them under whatever OTel
span happens to be current in the emitting thread, because events are not
guaranteed to be emitted from the context the session ran in.

Events that belong to no session (``kv_stats``, ``window_update``, ``tool_stats``)
are ignored: they describe the host, not a session, and have no span to hang on;
export them as metrics instead.

Only this module imports OpenTelemetry, and the sink itself needs only
``opentelemetry-api``; ``to_otlp_http`` also needs ``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http`` (the ``otel`` extra).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from agentmars.sdk.events import (
    Event,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

log = logging.getLogger("agentmars.sdk")

INSTRUMENTATION_SCOPE: Final = "agentmars.sdk.sinks.otel"
DEFAULT_TRACES_PATH: Final = "/v1/traces"

# Attribute names. GenAI ones come from the (incubating) semantic conventions;
# they are spelled out rather than imported from opentelemetry-semantic-conventions'
# private ``_incubating`` package, whose layout may change between releases.
OPERATION: Final = "gen_ai.operation.name"
AGENT_NAME: Final = "gen_ai.agent.name"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
USAGE_INPUT: Final = "gen_ai.usage.input_tokens"
USAGE_OUTPUT: Final = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ: Final = "gen_ai.usage.cache_read.input_tokens"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
ERROR_TYPE: Final = "error.type"
SESSION_ID: Final = "agentmars.session.id"
TURN: Final = "agentmars.turn"
CALL_ID: Final = "agentmars.call.id"
TTFT: Final = "agentmars.llm.ttft_s"
QUEUE_WAIT: Final = "agentmars.tool.queue_wait_s"
UNFINISHED: Final = "agentmars.span.unfinished"
UNFINISHED_REASON: Final = "agentmars.span.unfinished_reason"

FIRST_TOKEN_EVENT: Final = "gen_ai.first_token"
TOOL_START_EVENT: Final = "tool.start"

_RECENT_SESSIONS: Final = 1024
"""How many ended sessions keep their span context, so a call that starts after its
session ended (a tool finishing in the background) still joins the session's trace."""

_CallKind = Literal["llm", "tool"]
# Keyed by session too: a tool call id may come from the model ("call_0"), so it is
# only unique within its session; the kind keeps an LLM and a tool call apart.
_CallKey = tuple[_CallKind, str, str]
_Attributes = dict[str, AttributeValue]


@dataclass(slots=True)
class _OpenSpan:
    """A started span and its start time (the API gives no portable way to read it back)."""

    span: Span
    start_ns: int


class OTelSink:
    """Turns agentmars events into OpenTelemetry spans (see the module docstring).

    ``tracer_provider`` defaults to the global provider (read once, at construction;
    a proxy provider picks up a global set later). A provider passed in stays the
    caller's to flush and shut down; one built by ``to_otlp_http`` belongs to the
    sink and is flushed and shut down by ``close()``.

    Thread-safe: open spans live in dicts keyed by session / call id under one lock.
    A call whose session span is unknown (the sink was attached mid-session) becomes
    a root span; an end without a start is ignored; ``close()`` ends spans that are
    still open, marked with ``agentmars.span.unfinished``. Emitting after ``close()``
    raises ``ValueError`` (the ``Emitter`` counts and logs it).
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
        self._owned: SdkTracerProvider | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._sessions: dict[str, _OpenSpan] = {}
        self._ended_sessions: OrderedDict[str, Context] = OrderedDict()
        self._calls: dict[_CallKey, _OpenSpan] = {}

    @classmethod
    def to_otlp_http(
        cls,
        endpoint: str,
        *,
        service_name: str = "agentmars",
        headers: Mapping[str, str] | None = None,
    ) -> Self:
        """A sink exporting over OTLP/HTTP (protobuf) to ``endpoint`` through its own
        ``TracerProvider`` (resource ``service.name``) and ``BatchSpanProcessor``.

        ``endpoint`` is the traces URL, e.g. ``http://localhost:4318/v1/traces``; a
        bare base URL (no path) gets ``/v1/traces`` appended, as OTLP does for
        ``OTEL_EXPORTER_OTLP_ENDPOINT``. Raises ``ValueError`` for anything that is
        not an http(s) URL with a host.
        """
        url = otlp_traces_url(endpoint)
        if not isinstance(service_name, str) or not service_name.strip():
            raise ValueError("service_name must be a non-empty string")
        # Imported here: the sink itself only needs the OTel API.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = SdkTracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
        exporter = OTLPSpanExporter(
            endpoint=url, headers=None if headers is None else dict(headers)
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
        sink = cls(provider)
        sink._owned = provider
        return sink

    # --- Sink protocol -----------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Open, annotate or end the span the event belongs to."""
        match event:
            case SessionStart():
                self._session_start(event)
            case SessionEnd():
                self._session_end(event)
            case LLMSubmit():
                self._llm_submit(event)
            case LLMFirstToken():
                self._llm_first_token(event)
            case LLMEnd():
                self._llm_end(event)
            case ToolEnqueue():
                self._tool_enqueue(event)
            case ToolStart():
                self._tool_start(event)
            case ToolEnd():
                self._tool_end(event)
            case _:
                self._check_open()  # host-level events: ignored by design

    def close(self) -> None:
        """End the spans still open (marked unfinished), then flush and shut down the
        provider if the sink owns it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            # Children first: exporters then receive each call before its session.
            leftovers = [*self._calls.values(), *self._sessions.values()]
            self._calls.clear()
            self._sessions.clear()
            self._ended_sessions.clear()
        now = time.time_ns()
        for open_span in leftovers:
            _end_unfinished(open_span, now, "sink closed")
        if self._owned is not None:
            self._owned.force_flush()
            self._owned.shutdown()

    # --- state ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("OTelSink is closed")

    @contextlib.contextmanager
    def _state(self) -> Iterator[None]:
        """Hold the lock over the dicts; refuse events once closed."""
        with self._lock:
            self._check_open()
            yield

    def _parent(self, session_id: str) -> Context:
        """The context to start a call span in (lock held): its session's span if the
        sink has seen it, else an empty context, making the call a trace root rather
        than a child of whatever span is current in the emitting thread."""
        open_session = self._sessions.get(session_id)
        if open_session is not None:
            return trace.set_span_in_context(open_session.span, Context())
        return self._ended_sessions.get(session_id, Context())

    def _remember_ended(self, session_id: str, span: Span) -> None:
        """Keep only the span context (not the span, with its attributes) of recent sessions."""
        context = trace.set_span_in_context(
            trace.NonRecordingSpan(span.get_span_context()), Context()
        )
        self._ended_sessions[session_id] = context
        self._ended_sessions.move_to_end(session_id)
        while len(self._ended_sessions) > _RECENT_SESSIONS:
            self._ended_sessions.popitem(last=False)

    def _open_call(
        self,
        key: _CallKey,
        name: str,
        kind: SpanKind,
        attributes: _Attributes,
        start_ns: int,
    ) -> _OpenSpan | None:
        """Start a call span (lock held); returns a span it displaced (same key reused)."""
        span = self._tracer.start_span(
            name,
            context=self._parent(key[1]),
            kind=kind,
            attributes=attributes,
            start_time=start_ns,
        )
        displaced = self._calls.pop(key, None)
        self._calls[key] = _OpenSpan(span, start_ns)
        return displaced

    def _pop_call(self, key: _CallKey) -> _OpenSpan | None:
        with self._state():
            found = self._calls.pop(key, None)
        if found is None:
            log.debug("OTelSink: end of unknown %s call %s ignored", key[0], key[2])
        return found

    # --- sessions ------------------------------------------------------------------

    def _session_start(self, event: SessionStart) -> None:
        name = f"invoke_agent {event.agent}" if event.agent else "invoke_agent"
        attributes = _session_attributes(event)
        with self._state():
            span = self._tracer.start_span(
                name,
                context=Context(),
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=event.wall_ns,
            )
            displaced = self._sessions.pop(event.session_id, None)
            self._sessions[event.session_id] = _OpenSpan(span, event.wall_ns)
            self._ended_sessions.pop(event.session_id, None)
        if displaced is not None:
            _end_unfinished(displaced, event.wall_ns, "superseded by a new session_start")

    def _session_end(self, event: SessionEnd) -> None:
        with self._state():
            found = self._sessions.pop(event.session_id, None)
            if found is not None:
                self._remember_ended(event.session_id, found.span)
        if found is None:
            log.debug("OTelSink: end of unknown session %s ignored", event.session_id)
            return
        found.span.set_attributes(
            {"agentmars.session.status": event.status, "agentmars.session.turns": event.turns}
        )
        _set_outcome(found.span, event.status, event.error)
        _end(found, event.wall_ns)

    # --- LLM calls -----------------------------------------------------------------

    def _llm_submit(self, event: LLMSubmit) -> None:
        name = f"{event.operation} {event.model}" if event.model else event.operation
        attributes = _llm_submit_attributes(event)
        key: _CallKey = ("llm", event.session_id, event.call_id)
        with self._state():
            displaced = self._open_call(key, name, SpanKind.CLIENT, attributes, event.wall_ns)
        if displaced is not None:
            _end_unfinished(displaced, event.wall_ns, "superseded by a new llm_submit")

    def _llm_first_token(self, event: LLMFirstToken) -> None:
        with self._state():
            # Under the lock: another thread may be ending this span right now.
            found = self._calls.get(("llm", event.session_id, event.call_id))
            if found is None:
                return
            found.span.add_event(
                FIRST_TOKEN_EVENT, {TTFT: event.ttft_s}, timestamp=_not_before(event, found)
            )
            found.span.set_attribute(TTFT, event.ttft_s)

    def _llm_end(self, event: LLMEnd) -> None:
        found = self._pop_call(("llm", event.session_id, event.call_id))
        if found is None:
            return
        found.span.set_attributes(_llm_end_attributes(event))
        _set_outcome(found.span, event.status, event.error)
        _end(found, event.wall_ns)

    # --- tool calls ----------------------------------------------------------------

    def _tool_enqueue(self, event: ToolEnqueue) -> None:
        attributes = _tool_attributes(event)
        if event.priority is not None:
            attributes["agentmars.tool.priority"] = event.priority
        key: _CallKey = ("tool", event.session_id, event.call_id)
        with self._state():
            displaced = self._open_call(
                key, _tool_span_name(event), SpanKind.INTERNAL, attributes, event.wall_ns
            )
        if displaced is not None:
            _end_unfinished(displaced, event.wall_ns, "superseded by a new tool_enqueue")

    def _tool_start(self, event: ToolStart) -> None:
        key: _CallKey = ("tool", event.session_id, event.call_id)
        attributes = _tool_attributes(event)
        with self._state():
            found = self._calls.get(key)
            if found is None:
                # The enqueue was missed (sink attached late): the span starts here.
                self._open_call(
                    key, _tool_span_name(event), SpanKind.INTERNAL, attributes, event.wall_ns
                )
                found = self._calls[key]
            found.span.add_event(
                TOOL_START_EVENT,
                {QUEUE_WAIT: event.queue_wait_s},
                timestamp=_not_before(event, found),
            )
            found.span.set_attribute(QUEUE_WAIT, event.queue_wait_s)

    def _tool_end(self, event: ToolEnd) -> None:
        found = self._pop_call(("tool", event.session_id, event.call_id))
        if found is None:
            return
        found.span.set_attributes(_tool_end_attributes(event))
        description = event.error
        if description is None and event.status != "ok":
            description = f"tool {event.tool} ended with status {event.status}"
            if event.exit_status is not None:
                description += f" (exit status {event.exit_status})"
        _set_outcome(found.span, event.status, description)
        _end(found, event.wall_ns)


# --- attributes -------------------------------------------------------------------------


def _present(attributes: Mapping[str, AttributeValue | None]) -> _Attributes:
    """Drop unknown values: OTel attributes cannot be None."""
    return {key: value for key, value in attributes.items() if value is not None}


def _session_attributes(event: SessionStart) -> _Attributes:
    attributes = _present(
        {
            OPERATION: "invoke_agent",
            AGENT_NAME: event.agent,
            CONVERSATION_ID: event.session_id,
            SESSION_ID: event.session_id,
        }
    )
    for key, value in event.metadata.items():
        attributes[f"agentmars.session.metadata.{key}"] = value
    return attributes


def _llm_submit_attributes(event: LLMSubmit) -> _Attributes:
    return _present(
        {
            OPERATION: event.operation,
            REQUEST_MODEL: event.model,
            REQUEST_MAX_TOKENS: event.max_tokens,
            CONVERSATION_ID: event.session_id,
            SESSION_ID: event.session_id,
            TURN: event.turn,
            CALL_ID: event.call_id,
            "agentmars.llm.stream": event.stream,
            "agentmars.llm.follows_tool": event.follows_tool,
            "agentmars.llm.expects_tool": event.expects_tool,
            "agentmars.llm.projected_prompt_tokens": event.projected_prompt_tokens,
            "agentmars.llm.projected_kv_blocks": event.projected_kv_blocks,
        }
    )


def _llm_end_attributes(event: LLMEnd) -> _Attributes:
    reasons = None if event.finish_reason is None else (event.finish_reason,)
    return _present(
        {
            USAGE_INPUT: event.prompt_tokens,
            USAGE_OUTPUT: event.output_tokens,
            USAGE_CACHE_READ: event.cached_tokens,
            FINISH_REASONS: reasons,
            "agentmars.llm.ended_in_tool_call": event.ended_in_tool_call,
            "agentmars.llm.freed_blocks": event.freed_blocks,
        }
    )


def _tool_attributes(event: ToolEnqueue | ToolStart) -> _Attributes:
    return _present(
        {
            OPERATION: "execute_tool",
            TOOL_NAME: event.tool,
            TOOL_CALL_ID: event.call_id,
            SESSION_ID: event.session_id,
            TURN: event.turn,
        }
    )


def _tool_end_attributes(event: ToolEnd) -> _Attributes:
    return _present(
        {
            "agentmars.tool.status": event.status,
            "agentmars.tool.exit_status": event.exit_status,
            "agentmars.tool.cpu_time_s": event.cpu_time_s,
        }
    )


def _tool_span_name(event: ToolEnqueue | ToolStart) -> str:
    return f"execute_tool {event.tool}"


# --- outcome and timing ------------------------------------------------------------------


def _error_type(status: str, error: str | None) -> str:
    """``error.type`` must be low-cardinality: the exception class name the SDK puts
    before ``": "`` in error messages, else the status itself."""
    if error:
        head = error.split(":", 1)[0].strip()
        if head and all(part.isidentifier() for part in head.split(".")):
            return head
    return status


def _set_outcome(span: Span, status: str, error: str | None) -> None:
    """Anything but ``ok`` (error, timeout, killed, cancelled) is an ERROR status."""
    if status == "ok":
        return
    span.set_attribute(ERROR_TYPE, _error_type(status, error))
    span.set_status(Status(StatusCode.ERROR, error or status))


def _not_before(event: Event, open_span: _OpenSpan) -> int:
    """Wall clocks can step backwards; never place anything before its span's start."""
    return max(event.wall_ns, open_span.start_ns)


def _end(open_span: _OpenSpan, end_ns: int) -> None:
    open_span.span.end(end_time=max(end_ns, open_span.start_ns))


def _end_unfinished(open_span: _OpenSpan, end_ns: int, reason: str) -> None:
    open_span.span.set_attributes({UNFINISHED: True, UNFINISHED_REASON: reason})
    _end(open_span, end_ns)


# --- endpoint ------------------------------------------------------------------------------


def otlp_traces_url(endpoint: str) -> str:
    """Validate an OTLP/HTTP traces endpoint; a URL without a path gets ``/v1/traces``."""
    example = "e.g. http://localhost:4318/v1/traces"
    if not isinstance(endpoint, str) or not endpoint or any(c.isspace() for c in endpoint):
        raise ValueError(
            f"OTLP/HTTP endpoint must be a URL without spaces ({example}), got {endpoint!r}"
        )
    parts = urlsplit(endpoint)
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise ValueError(f"OTLP/HTTP endpoint {endpoint!r} has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"OTLP/HTTP endpoint must be an http:// or https:// URL with a host ({example}), "
            f"got {endpoint!r}"
        )
    if parts.path in ("", "/"):
        parts = parts._replace(path=DEFAULT_TRACES_PATH)
    return urlunsplit(parts)
