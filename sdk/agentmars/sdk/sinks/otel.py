"""OpenTelemetry sink: the event stream as spans and metrics that follow the GenAI
semantic conventions (``agentmars.sdk.semconv`` says which version, and why).

One trace per agent session::

    invoke_agent coder         (session_start .. session_end, INTERNAL)
    ├── chat my-model          (llm_submit .. llm_end, CLIENT; event agentmars.llm.first_token)
    │   └── (the gateway's and the engine's spans, through ``trace_headers``)
    ├── execute_tool terminal  (tool_enqueue .. tool_end, INTERNAL; event agentmars.tool.start)
    └── chat my-model

Span times are the events' ``wall_ns``, passed explicitly, so the spans are right
even when the sink sees the events late (a relayed or replayed stream). Session
spans are always trace roots: the sink does not parent them under whatever OTel
span happens to be current in the emitting thread, because events are not
guaranteed to be emitted from the context the session ran in. ``trace_headers`` gives
the W3C trace context of a call's span, which the client integrations send with the
call, so the gateway's and the engine's spans join the session's trace.

Tool calls the sandbox pool runs (events of source ``sandbox``) get no span here: the
pool traces them itself, with their slot and cores, under the session's span
(``SandboxPool``). Events that belong to no session (``kv_stats``, ``window_update``,
``tool_stats``) are ignored: they describe the host, not a session.

Metrics (the GenAI client metrics of the version emitted, ``GenAIMetrics``) go to the
meter provider given, else the global one. Only this module imports OpenTelemetry, and
the sink itself needs only ``opentelemetry-api``; ``to_otlp_http`` and
``tracer_provider_from_env`` also need ``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http`` (the ``otel`` extra).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import Histogram, MeterProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from agentmars.sdk import semconv as sc
from agentmars.sdk.emitter import Emitter
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
from agentmars.sdk.otlp import traces_endpoint_from_env
from agentmars.sdk.semconv import Semconv

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

log = logging.getLogger("agentmars.sdk")

INSTRUMENTATION_SCOPE: Final = "agentmars.sdk.sinks.otel"
DEFAULT_TRACES_PATH: Final = "/v1/traces"

_RECENT_SESSIONS: Final = 1024
"""How many ended sessions keep their span context, so a call that starts after its
session ended (a tool finishing in the background) still joins the session's trace."""

_CallKind = Literal["llm", "tool"]
# Keyed by session too: a tool call id may come from the model ("call_0"), so it is
# only unique within its session; the kind keeps an LLM and a tool call apart.
_CallKey = tuple[_CallKind, str, str]
Attributes = dict[str, AttributeValue]


@dataclass(slots=True)
class _OpenSpan:
    """A started span, its start time (the API gives no portable way to read it back)
    and the attributes its metrics carry."""

    span: Span
    start_ns: int
    metric_attributes: Attributes = field(default_factory=dict)


class GenAIMetrics:
    """The GenAI metrics of one version of the conventions (``agentmars.sdk.semconv``):
    inference duration and token usage, time to first chunk and tool durations (the
    latter two exist in the latest version only). Whoever ends a span records the
    metric that goes with it, with the same duration."""

    def __init__(self, meter_provider: MeterProvider | None, semconv: Semconv) -> None:
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        meter = provider.get_meter(INSTRUMENTATION_SCOPE)
        self.semconv = semconv

        def seconds(name: str, description: str) -> Histogram:
            return meter.create_histogram(
                name, "s", description, explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS
            )

        def tokens(name: str, description: str) -> Histogram:
            return meter.create_histogram(
                name, "{token}", description, explicit_bucket_boundaries_advisory=sc.TOKEN_BUCKETS
            )

        if semconv is Semconv.V1_36:
            self._duration = seconds(sc.V1_36_OPERATION_DURATION, "GenAI operation duration.")
            self._token_usage = tokens(sc.V1_36_TOKEN_USAGE, "Input and output tokens used.")
            return
        self._duration = seconds(sc.INFERENCE_DURATION, "GenAI client inference duration.")
        self._first_chunk = seconds(sc.INFERENCE_TTFC, "Time to receive the first chunk.")
        self._usage = {
            name: meter.create_counter(name, "{token}", description)
            for name, description in (
                (sc.USAGE_INPUT_TOKENS, "Input tokens used, including cached tokens."),
                (sc.USAGE_OUTPUT_TOKENS, "Output tokens used."),
                (sc.USAGE_CACHE_READ_TOKENS, "Input tokens served from a cache."),
            )
        }
        self._per_operation = {
            sc.OPERATION_INPUT_TOKENS: tokens(
                sc.OPERATION_INPUT_TOKENS, "Input tokens of one inference operation."
            ),
            sc.OPERATION_OUTPUT_TOKENS: tokens(
                sc.OPERATION_OUTPUT_TOKENS, "Output tokens of one inference operation."
            ),
        }
        self._tool_duration = seconds(
            sc.EXECUTE_TOOL_DURATION, "The duration of a single tool execution."
        )

    def inference_ended(
        self, attributes: Attributes, duration_s: float, event: LLMEnd, error_type: str | None
    ) -> None:
        """An LLM call ended after ``duration_s`` (its span's duration)."""
        failed = {**attributes, sc.ERROR_TYPE: error_type} if error_type else attributes
        self._duration.record(duration_s, failed)
        if self.semconv is Semconv.V1_36:
            for kind, count in (("input", event.prompt_tokens), ("output", event.output_tokens)):
                if count is not None:  # unknown usage MUST NOT be reported in this version
                    self._token_usage.record(count, {**attributes, sc.TOKEN_TYPE: kind})
            return
        # The usage counters count every call, a failed one or one without usage as 0.
        counted = {**attributes, sc.TOKEN_MODALITY: sc.MODALITY_UNKNOWN}
        for name, count in (
            (sc.USAGE_INPUT_TOKENS, event.prompt_tokens),
            (sc.USAGE_OUTPUT_TOKENS, event.output_tokens),
            (sc.USAGE_CACHE_READ_TOKENS, event.cached_tokens),
        ):
            self._usage[name].add(count or 0, counted)
        for name, count in (
            (sc.OPERATION_INPUT_TOKENS, event.prompt_tokens),
            (sc.OPERATION_OUTPUT_TOKENS, event.output_tokens),
        ):
            if count is not None:
                self._per_operation[name].record(count, attributes)

    def first_chunk(self, attributes: Attributes, ttfc_s: float) -> None:
        """A streamed LLM call's first chunk arrived ``ttfc_s`` after the request."""
        if self.semconv is Semconv.LATEST:
            self._first_chunk.record(ttfc_s, attributes)

    def tool_ended(self, tool: str, duration_s: float, error_type: str | None) -> None:
        """A tool call's execution took ``duration_s`` (its ``execute_tool`` span's)."""
        if self.semconv is Semconv.LATEST:
            attributes: Attributes = {
                sc.OPERATION: "execute_tool",
                sc.TOOL_NAME: tool,
                sc.TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
            }
            if error_type:
                attributes[sc.ERROR_TYPE] = error_type
            self._tool_duration.record(duration_s, attributes)


class OTelSink:
    """Turns agentmars events into OpenTelemetry spans and metrics (see the module
    docstring).

    ``tracer_provider`` / ``meter_provider`` default to the global providers (read once,
    at construction; a proxy provider picks up a global set later). A provider passed
    in stays the caller's to flush and shut down; one built by ``to_otlp_http`` belongs
    to the sink and is flushed and shut down by ``close()``. ``semconv``: the version
    of the GenAI conventions to emit (default: ``OTEL_SEMCONV_STABILITY_OPT_IN``'s).

    Thread-safe: open spans live in dicts keyed by session / call id under one lock.
    A call whose session span is unknown (the sink was attached mid-session) becomes
    a root span; an end without a start is ignored; ``close()`` ends spans that are
    still open, marked with ``agentmars.span.unfinished``. Emitting after ``close()``
    raises ``ValueError`` (the ``Emitter`` counts and logs it).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        meter_provider: MeterProvider | None = None,
        semconv: Semconv | None = None,
    ) -> None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
        self.semconv = semconv if semconv is not None else Semconv.from_env()
        self._metrics = GenAIMetrics(meter_provider, self.semconv)
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
        semconv: Semconv | None = None,
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
        provider = _exporting_provider(service_name, endpoint=url, headers=headers)
        sink = cls(provider, semconv=semconv)
        sink._owned = provider
        return sink

    def trace_headers(self, session_id: str, call_id: str | None = None) -> dict[str, str]:
        """W3C trace context headers (``traceparent``, and ``tracestate`` / baggage
        when there are any: the globally configured propagator's) of the call's span,
        else of its session's, for a request made on the call's behalf; empty if the
        sink knows neither."""
        with self._lock:
            found = None
            if call_id is not None:
                found = self._calls.get(("llm", session_id, call_id)) or self._calls.get(
                    ("tool", session_id, call_id)
                )
            context = (
                trace.set_span_in_context(found.span, Context())
                if found is not None
                else self._parent(session_id)
            )
        headers: dict[str, str] = {}
        propagate.inject(headers, context=context)
        return headers

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
            case ToolEnqueue() | ToolStart() | ToolEnd() if event.source == "sandbox":
                self._check_open()  # the pool traces its own calls
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
        attributes: Attributes,
        start_ns: int,
        metric_attributes: Attributes | None = None,
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
        self._calls[key] = _OpenSpan(span, start_ns, metric_attributes or {})
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
        set_outcome(found.span, event.status, event.error)
        _end(found, event.wall_ns)

    # --- LLM calls -----------------------------------------------------------------

    def _llm_submit(self, event: LLMSubmit) -> None:
        name = f"{event.operation} {event.model}" if event.model else event.operation
        attributes = self._llm_submit_attributes(event)
        key: _CallKey = ("llm", event.session_id, event.call_id)
        measured = _metric_attributes(attributes)
        with self._state():
            displaced = self._open_call(
                key, name, SpanKind.CLIENT, attributes, event.wall_ns, measured
            )
        if displaced is not None:
            _end_unfinished(displaced, event.wall_ns, "superseded by a new llm_submit")

    def _llm_first_token(self, event: LLMFirstToken) -> None:
        with self._state():
            # Under the lock: another thread may be ending this span right now.
            found = self._calls.get(("llm", event.session_id, event.call_id))
            if found is None:
                return
            found.span.add_event(
                sc.FIRST_TOKEN_EVENT,
                {sc.TTFT: event.ttft_s},
                timestamp=_not_before(event, found),
            )
            found.span.set_attribute(sc.TTFT, event.ttft_s)
            if self.semconv is Semconv.LATEST:
                found.span.set_attribute(sc.RESPONSE_TTFC, event.ttft_s)
            measured = found.metric_attributes
        self._metrics.first_chunk(measured, event.ttft_s)

    def _llm_end(self, event: LLMEnd) -> None:
        found = self._pop_call(("llm", event.session_id, event.call_id))
        if found is None:
            return
        found.span.set_attributes(_llm_end_attributes(event))
        error_type = set_outcome(found.span, event.status, event.error)
        end_ns = _end(found, event.wall_ns)
        measured = _present({**found.metric_attributes, sc.RESPONSE_MODEL: event.response_model})
        self._metrics.inference_ended(measured, (end_ns - found.start_ns) / 1e9, event, error_type)

    # --- tool calls ----------------------------------------------------------------

    def _tool_enqueue(self, event: ToolEnqueue) -> None:
        attributes = tool_attributes(event.tool, event.call_id, event.session_id, event.turn)
        if event.priority is not None:
            attributes[sc.TOOL_PRIORITY] = event.priority
        key: _CallKey = ("tool", event.session_id, event.call_id)
        with self._state():
            displaced = self._open_call(
                key, tool_span_name(event.tool), SpanKind.INTERNAL, attributes, event.wall_ns
            )
        if displaced is not None:
            _end_unfinished(displaced, event.wall_ns, "superseded by a new tool_enqueue")

    def _tool_start(self, event: ToolStart) -> None:
        key: _CallKey = ("tool", event.session_id, event.call_id)
        attributes = tool_attributes(event.tool, event.call_id, event.session_id, event.turn)
        with self._state():
            found = self._calls.get(key)
            if found is None:
                # The enqueue was missed (sink attached late): the span starts here.
                self._open_call(
                    key, tool_span_name(event.tool), SpanKind.INTERNAL, attributes, event.wall_ns
                )
                found = self._calls[key]
            found.span.add_event(
                sc.TOOL_START_EVENT,
                {sc.QUEUE_WAIT: event.queue_wait_s},
                timestamp=_not_before(event, found),
            )
            found.span.set_attribute(sc.QUEUE_WAIT, event.queue_wait_s)

    def _tool_end(self, event: ToolEnd) -> None:
        found = self._pop_call(("tool", event.session_id, event.call_id))
        if found is None:
            return
        found.span.set_attributes(
            _present(
                {
                    sc.TOOL_STATUS: event.status,
                    sc.TOOL_EXIT_STATUS: event.exit_status,
                    sc.TOOL_CPU_TIME: event.cpu_time_s,
                }
            )
        )
        failure = tool_failure(event.tool, event.status, event.exit_status, event.error)
        error_type = set_outcome(found.span, event.status, failure)
        end_ns = _end(found, event.wall_ns)
        self._metrics.tool_ended(event.tool, (end_ns - found.start_ns) / 1e9, error_type)

    # --- attributes -------------------------------------------------------------------

    def _llm_submit_attributes(self, event: LLMSubmit) -> Attributes:
        attributes = _present(
            {
                sc.OPERATION: event.operation,
                sc.REQUEST_MODEL: event.model,
                sc.REQUEST_MAX_TOKENS: event.max_tokens,
                sc.CONVERSATION_ID: event.session_id,
                sc.SERVER_ADDRESS: event.server_address,
                sc.SERVER_PORT: event.server_port,
                sc.SESSION_ID: event.session_id,
                sc.TURN: event.turn,
                sc.CALL_ID: event.call_id,
                "agentmars.llm.stream": event.stream,
                "agentmars.llm.follows_tool": event.follows_tool,
                "agentmars.llm.expects_tool": event.expects_tool,
                "agentmars.llm.projected_prompt_tokens": event.projected_prompt_tokens,
                "agentmars.llm.projected_kv_blocks": event.projected_kv_blocks,
            }
        )
        if event.provider is not None:
            attributes[self.semconv.provider_key] = self.semconv.provider_value(event.provider)
        if self.semconv is Semconv.LATEST and event.stream:
            attributes[sc.REQUEST_STREAM] = True  # set if and only if streaming
        return attributes


# --- attributes -------------------------------------------------------------------------


def _present(attributes: Mapping[str, AttributeValue | None]) -> Attributes:
    """Drop unknown values: OTel attributes cannot be None."""
    return {key: value for key, value in attributes.items() if value is not None}


def _metric_attributes(span_attributes: Attributes) -> Attributes:
    """The inference metrics' attributes, out of the call's span attributes (the
    conventions' ``metric_attributes.gen_ai``: low cardinality, no ids)."""
    keys = (
        sc.OPERATION, sc.SYSTEM, sc.PROVIDER_NAME, sc.REQUEST_MODEL, sc.SERVER_ADDRESS,
        sc.SERVER_PORT,
    )  # fmt: skip
    return {key: span_attributes[key] for key in keys if key in span_attributes}


def _session_attributes(event: SessionStart) -> Attributes:
    attributes = _present(
        {
            sc.OPERATION: "invoke_agent",
            sc.AGENT_NAME: event.agent,
            sc.CONVERSATION_ID: event.session_id,
            sc.SESSION_ID: event.session_id,
        }
    )
    for key, value in event.metadata.items():
        attributes[f"agentmars.session.metadata.{key}"] = value
    return attributes


def _llm_end_attributes(event: LLMEnd) -> Attributes:
    reasons = None if event.finish_reason is None else (event.finish_reason,)
    return _present(
        {
            sc.USAGE_INPUT: event.prompt_tokens,
            sc.USAGE_OUTPUT: event.output_tokens,
            sc.USAGE_CACHE_READ: event.cached_tokens,
            sc.FINISH_REASONS: reasons,
            sc.RESPONSE_ID: event.response_id,
            sc.RESPONSE_MODEL: event.response_model,
            "agentmars.llm.ended_in_tool_call": event.ended_in_tool_call,
            "agentmars.llm.freed_blocks": event.freed_blocks,
        }
    )


def tool_attributes(tool: str, call_id: str, session_id: str, turn: int | None) -> Attributes:
    """An ``execute_tool`` span's attributes at its start (the sink's and the pool's)."""
    return _present(
        {
            sc.OPERATION: "execute_tool",
            sc.TOOL_NAME: tool,
            sc.TOOL_CALL_ID: call_id,
            sc.TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
            sc.SESSION_ID: session_id,
            sc.TURN: turn,
        }
    )


def tool_span_name(tool: str) -> str:
    return f"execute_tool {tool}"


def tool_failure(tool: str, status: str, exit_status: int | None, error: str | None) -> str | None:
    """What went wrong with a tool call, for its span's status: its error, else a
    sentence naming its status and exit status (None: it went right)."""
    if error is not None or status == "ok":
        return error
    description = f"tool {tool} ended with status {status}"
    if exit_status is not None:
        description += f" (exit status {exit_status})"
    return description


# --- outcome and timing ------------------------------------------------------------------


def _error_type(status: str, error: str | None) -> str:
    """``error.type`` must be low-cardinality: the exception class name the SDK puts
    before ``": "`` in error messages, else the status itself."""
    if error:
        head = error.split(":", 1)[0].strip()
        if head and all(part.isidentifier() for part in head.split(".")):
            return head
    return status


def set_outcome(span: Span, status: str, error: str | None) -> str | None:
    """Anything but ``ok`` (error, timeout, killed, cancelled) is an ERROR status with
    an ``error.type``; returns that type (None for ``ok``)."""
    if status == "ok":
        return None
    error_type = _error_type(status, error)
    span.set_attribute(sc.ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, error or status))
    return error_type


def _not_before(event: Event, open_span: _OpenSpan) -> int:
    """Wall clocks can step backwards; never place anything before its span's start."""
    return max(event.wall_ns, open_span.start_ns)


def _end(open_span: _OpenSpan, end_ns: int) -> int:
    """End the span at ``end_ns`` (not before its start); returns the end used."""
    end_ns = max(end_ns, open_span.start_ns)
    open_span.span.end(end_time=end_ns)
    return end_ns


def _end_unfinished(open_span: _OpenSpan, end_ns: int, reason: str) -> None:
    open_span.span.set_attributes({sc.UNFINISHED: True, sc.UNFINISHED_REASON: reason})
    _end(open_span, end_ns)


# --- providers -------------------------------------------------------------------------------


def _exporting_provider(
    service_name: str,
    *,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    name_from_env: bool = False,
) -> SdkTracerProvider:
    """A ``TracerProvider`` of its own exporting over OTLP/HTTP through a
    ``BatchSpanProcessor``: to ``endpoint``, else where the ``OTEL_EXPORTER_OTLP_*``
    variables say (the exporter reads them). Its resource names ``service_name``, or
    with ``name_from_env`` the service ``OTEL_SERVICE_NAME`` /
    ``OTEL_RESOURCE_ATTRIBUTES`` name, if they do."""
    # Imported here: the sink itself only needs the OTel API.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: service_name})
    if name_from_env:
        detected = Resource.create()  # "unknown_service:<python>" when nothing names it
        if not str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = detected
    provider = SdkTracerProvider(resource=resource)
    exporter = OTLPSpanExporter(
        endpoint=endpoint, headers=None if headers is None else dict(headers)
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def tracer_provider_from_env(
    service_name: str, environ: Mapping[str, str] = os.environ
) -> SdkTracerProvider | None:
    """A provider of a server's own (the gateway's, the sandbox service's) exporting
    over OTLP/HTTP where the usual variables say (``agentmars.sdk.otlp``), or None when
    they give no endpoint. Nothing global is set."""
    endpoint = traces_endpoint_from_env(environ)
    if endpoint is None:
        return None
    return _exporting_provider(service_name, endpoint=endpoint, name_from_env=True)


def parent_context(emitter: Emitter, session_id: str, call_id: str | None = None) -> Context:
    """The context to start a span of the session's work in, from another part (the
    sandbox pool, the OpenHands runtime): the current one if a span is current there
    (the caller's own, the more specific), else the call's or the session's span in
    the trace of the emitter's ``OTelSink``, else none (a root)."""
    if trace.get_current_span().get_span_context().is_valid:
        return context.get_current()
    return propagate.extract(emitter.trace_headers(session_id, call_id))


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
