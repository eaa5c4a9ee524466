"""The gateway's spans: one SERVER span per LLM call it forwards, in the caller's trace.

``CallTracing`` is ASGI middleware around the LLM routes (``llm_apis``). It takes the
caller's W3C trace context (``traceparent``, read by the globally configured
propagator, W3C's by default) and starts the call's span under it, current for the
request's whole life, a stream's included: it ends when the answer's last byte is
sent (or the request fails). The span is named ``POST <route>`` until the handler
knows the call (``call_known``), then as the GenAI conventions name an inference
span, ``{gen_ai.operation.name} {gen_ai.request.model}``.

The handler annotates the current span through the functions here: the call
(``call_known``), its wait for admission (``admitted``) and its end as the gateway's
``llm_end`` event records it (``call_ended``). ``proxy.forwarded_headers`` injects the
current span's context into the request to the engine, so vLLM's own spans
(``--otlp-traces-endpoint``) are its children. With tracing off these are no-ops on
a non-recording span.

The engine's pins of a session's KV (``kv_pin`` .. ``kv_unpin`` on the event hub)
become INTERNAL spans ``agentmars.kv.pin`` (``PinSpans``) in the session's trace, under
the gateway's span of the session's latest LLM call (the call whose end pinned it).

The tracer provider is the gateway's own (``GatewayConfig.tracer_provider``, else one
built from the ``OTEL_EXPORTER_OTLP_*`` variables: ``tracer_provider_from_env``); no
global provider is set.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from opentelemetry import context, propagate, trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TracerProvider
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentmars.sdk import semconv as sc
from agentmars.sdk.events import AnyEvent, KVPin, KVUnpin, LLMEnd, SessionEnd
from agentmars.sdk.sinks.otel import Attributes, set_outcome
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.web.ingest import EventHub

INSTRUMENTATION_SCOPE: Final = "agentmars.server.gateway"
SERVICE_NAME: Final = "agentmars-gateway"
"""The service the gateway's spans name, unless ``OTEL_SERVICE_NAME`` names another."""
SESSION_MEMORY: Final = 4096
"""Sessions whose latest call span, and pins whose open span, the gateway remembers at
most (the least recently used are forgotten; an open pin span is then ended, marked
unfinished)."""
_PIN_SPANS = context.create_key("agentmars-pin-spans")
"""Where a call's context holds the ``PinSpans`` that ``call_known`` tells of it."""


@dataclass(slots=True)
class _OpenPin:
    span: Span
    start_ns: int


class PinSpans:
    """The engine's KV pins as spans: each ``kv_pin`` starts one under the latest call
    span of its session (none if the gateway traced no call of it), its ``kv_unpin``
    ends it; so does the session's end (the engine releases the pin then too) and the
    gateway's shutdown (marked unfinished). Thread-safe: calls are known on the event
    loop, events arrive on the hub's publishing threads."""

    def __init__(self, tracer: trace.Tracer, memory: int = SESSION_MEMORY) -> None:
        self._tracer = tracer
        self._memory = memory
        self._lock = threading.Lock()
        self._calls: OrderedDict[str, SpanContext] = OrderedDict()
        self._pins: OrderedDict[str, _OpenPin] = OrderedDict()

    def call_started(self, session_id: str, call: SpanContext) -> None:
        """The session's latest LLM call has this span: its next pins go under it."""
        with self._lock:
            self._calls[session_id] = call
            self._calls.move_to_end(session_id)
            if len(self._calls) > self._memory:
                self._calls.popitem(last=False)

    def observe(self, events: Sequence[AnyEvent]) -> None:
        """A batch of the hub's events (a hub subscriber)."""
        for event in events:
            if isinstance(event, KVPin):
                self._pinned(event)
            elif isinstance(event, KVUnpin):
                self._end(event.session_id, event.wall_ns, event.reason, event.held_s)
            elif isinstance(event, SessionEnd):
                with self._lock:
                    self._calls.pop(event.session_id, None)
                self._end(event.session_id, event.wall_ns, "session_end")

    def close(self) -> None:
        """End the spans of the pins still held, as unfinished (the gateway stops)."""
        with self._lock:
            pins, self._pins = list(self._pins.values()), OrderedDict()
        for pin in pins:
            _end_unfinished(pin, "gateway shutdown")

    def _pinned(self, event: KVPin) -> None:
        attributes: Attributes = {
            sc.SESSION_ID: event.session_id,
            sc.KV_PINNED_BLOCKS: event.blocks,
        }
        if event.ttl_s is not None:
            attributes[sc.KV_PIN_TTL] = event.ttl_s
        with self._lock:
            call = self._calls.get(event.session_id)
            if call is None:
                return
            span = self._tracer.start_span(
                sc.KV_PIN_SPAN,
                context=trace.set_span_in_context(NonRecordingSpan(call)),
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=event.wall_ns,
            )
            displaced = self._pins.pop(event.session_id, None)
            self._pins[event.session_id] = _OpenPin(span, event.wall_ns)
            forgotten = (
                self._pins.popitem(last=False)[1] if len(self._pins) > self._memory else None
            )
        for pin, why in ((displaced, "replaced by a newer pin"), (forgotten, "forgotten")):
            if pin is not None:
                _end_unfinished(pin, why)

    def _end(self, session_id: str, end_ns: int, reason: str, held_s: float | None = None) -> None:
        with self._lock:
            pin = self._pins.pop(session_id, None)
        if pin is None:
            return
        end_ns = max(end_ns, pin.start_ns)
        held = held_s if held_s is not None else (end_ns - pin.start_ns) / 1e9
        pin.span.set_attributes({sc.KV_RELEASE_REASON: reason, sc.KV_HELD: held})
        pin.span.end(end_time=end_ns)


def _end_unfinished(pin: _OpenPin, reason: str) -> None:
    pin.span.set_attributes({sc.UNFINISHED: True, sc.UNFINISHED_REASON: reason})
    pin.span.end(end_time=max(time.time_ns(), pin.start_ns))


class CallTracing:
    """ASGI middleware: a SERVER span for each request to one of ``routes`` (module
    docstring); other requests pass untouched. ``hub``: the event hub whose ``kv_pin``
    / ``kv_unpin`` become pin spans (``PinSpans``) while the app runs. ``shutdown``:
    called once the app has shut down (to flush and shut down a provider the gateway
    owns)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tracer_provider: TracerProvider,
        routes: Collection[str],
        hub: EventHub | None = None,
        shutdown: Callable[[], object] = lambda: None,
    ) -> None:
        self.app = app
        self._tracer = tracer_provider.get_tracer(INSTRUMENTATION_SCOPE)
        self._routes = frozenset(routes)
        self._hub = hub
        self._pins = PinSpans(self._tracer)
        self._unsubscribe: Callable[[], None] = lambda: None
        self._shutdown = shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._on_shutdown(send))
            return
        if scope["type"] != "http" or scope["path"] not in self._routes:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        span = self._tracer.start_span(
            f"{scope['method']} {scope['path']}",
            context=propagate.extract(headers),
            kind=SpanKind.SERVER,
            attributes={
                sc.HTTP_METHOD: scope["method"],
                sc.HTTP_ROUTE: scope["path"],
            },
        )

        async def answered(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set_attribute(sc.HTTP_STATUS, status)
                # A 4xx is the client's error, not the server's (HTTP conventions).
                if status >= 500 and not _failed(span):
                    span.set_status(trace.StatusCode.ERROR)
            await send(message)

        token = context.attach(
            trace.set_span_in_context(span, context.set_value(_PIN_SPANS, self._pins))
        )
        try:
            await self.app(scope, receive, answered)
        except BaseException as exc:
            span.record_exception(exc)
            set_outcome(span, "error", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            context.detach(token)
            span.end()

    def _on_shutdown(self, send: Send) -> Send:
        async def sent(message: Message) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete" and self._hub is not None:
                self._unsubscribe = self._hub.subscribe(self._pins.observe)
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self._unsubscribe()
                self._pins.close()
                self._shutdown()

        return sent


def _failed(span: trace.Span) -> bool:
    """Whether the span is marked failed already (by ``call_ended``, with the call's
    error, which a bare HTTP status would replace): an SDK span tells, through its
    ``status``; the API's spans do not."""
    status = getattr(span, "status", None)
    return status is not None and status.status_code is trace.StatusCode.ERROR


def call_known(meta: CallMeta, operation: str, model: str | None) -> None:
    """Name the current span after the call and say whose it is."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.update_name(f"{operation} {model}" if model else operation)
    attributes: Attributes = {
        sc.OPERATION: operation,
        sc.SESSION_ID: meta.session_id,
        sc.CALL_ID: meta.call_id,
    }
    if model is not None:
        attributes[sc.REQUEST_MODEL] = model
    if not meta.ephemeral:  # a one-call session has no conversation to name, no pins
        attributes[sc.CONVERSATION_ID] = meta.session_id
        pins = context.get_value(_PIN_SPANS)
        if isinstance(pins, PinSpans):
            pins.call_started(meta.session_id, span.get_span_context())
    span.set_attributes(attributes)


def admitted(policy: str, turn: int, wait_s: float) -> None:
    """The call's session was admitted after ``wait_s`` (0 if it already was)."""
    span = trace.get_current_span()
    span.add_event(sc.ADMITTED_EVENT, {sc.ADMISSION_WAIT: wait_s})
    span.set_attributes({sc.ADMISSION_WAIT: wait_s, sc.ADMISSION_POLICY: policy, sc.TURN: turn})


def call_ended(ended: LLMEnd | None, http_status: int | None = None) -> None:
    """The call's end as the gateway recorded it (its ``llm_end`` event; None: it was
    recorded before), answered with ``http_status`` when it is an error answer. A 4xx
    is the client's error, not the server's: the span's status stays unset and it has
    no ``error.type`` (OpenTelemetry's HTTP conventions for server spans), as for the
    gateway's own 4xx."""
    span = trace.get_current_span()
    if ended is None or not span.is_recording():
        return
    reasons = None if ended.finish_reason is None else (ended.finish_reason,)
    figures = {
        sc.USAGE_INPUT: ended.prompt_tokens,
        sc.USAGE_OUTPUT: ended.output_tokens,
        sc.USAGE_CACHE_READ: ended.cached_tokens,
        sc.FINISH_REASONS: reasons,
        sc.RESPONSE_ID: ended.response_id,
        sc.RESPONSE_MODEL: ended.response_model,
    }
    span.set_attributes({k: v for k, v in figures.items() if v is not None})
    if http_status is None or not 400 <= http_status < 500:
        set_outcome(span, ended.status, ended.error)
