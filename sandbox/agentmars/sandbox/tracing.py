"""The sandbox pool's spans: one ``execute_tool {tool}`` span per call it runs, from
its enqueueing to its end, with what only the pool knows (the slot, its cores, the
queue wait) and the ``gen_ai.execute_tool.duration`` metric that goes with it.

A call's span is a child of the context its caller gives (``run(trace_parent=...)``:
the sandbox service gives the W3C ``traceparent`` of the request), else of the span
current where the call was made (the OpenHands runtime's tool span), else of the
session's span in the trace of the pool emitter's ``OTelSink`` (``parent_context``).
So a session's tool calls join its trace wherever the pool runs. The SDK's sink
leaves the pool's own tool events alone for this reason (one span per call).
"""

from __future__ import annotations

from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, SpanKind, TracerProvider

from agentmars.sandbox.backends.base import Slot
from agentmars.sandbox.spec import ExecResult
from agentmars.sdk import semconv as sc
from agentmars.sdk.semconv import Semconv
from agentmars.sdk.sinks.otel import (
    GenAIMetrics,
    set_outcome,
    tool_attributes,
    tool_failure,
    tool_span_name,
)

INSTRUMENTATION_SCOPE: Final = "agentmars.sandbox"
SERVICE_NAME: Final = "agentmars-sandbox"
"""The service the sandbox service's spans name, unless ``OTEL_SERVICE_NAME`` does."""


class ToolSpan:
    """The span of one call of the pool, from its enqueueing to its end."""

    def __init__(self, span: Span, tool: str, metrics: GenAIMetrics, start_ns: int) -> None:
        self.span = span
        self._tool = tool
        self._metrics = metrics
        self._start_ns = start_ns

    def started(self, slot: Slot, backend: str, queue_wait_s: float) -> None:
        """The call got ``slot`` after ``queue_wait_s`` in the queue."""
        self.span.add_event(sc.TOOL_START_EVENT, {sc.QUEUE_WAIT: queue_wait_s})
        self.span.set_attributes(
            {
                sc.QUEUE_WAIT: queue_wait_s,
                sc.SANDBOX_SLOT: slot.index,
                sc.SANDBOX_CORES: list(slot.cores),
                sc.SANDBOX_BACKEND: backend,
            }
        )

    def ended(self, result: ExecResult | None, end_ns: int) -> None:
        """The call ended with ``result`` (None: the backend failed)."""
        status = result.status if result is not None else "error"
        detail = result.detail if result is not None else "sandbox failure"
        exit_status = result.exit_status if result is not None else None
        attributes: dict[str, str | int | float] = {sc.TOOL_STATUS: status}
        if exit_status is not None:
            attributes[sc.TOOL_EXIT_STATUS] = exit_status
        if result is not None and result.cpu_s is not None:
            attributes[sc.TOOL_CPU_TIME] = result.cpu_s
        self.span.set_attributes(attributes)
        failure = tool_failure(self._tool, status, exit_status, detail)
        error_type = set_outcome(self.span, status, failure)
        self.span.end(end_time=end_ns)
        self._metrics.tool_ended(self._tool, (end_ns - self._start_ns) / 1e9, error_type)


class PoolTracing:
    """Where the pool's spans and metric go: the providers given, else the global
    ones; ``semconv`` as ``OTEL_SEMCONV_STABILITY_OPT_IN`` says unless given."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        semconv: Semconv | None = None,
    ) -> None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer(INSTRUMENTATION_SCOPE)
        self._metrics = GenAIMetrics(meter_provider, semconv or Semconv.from_env())

    def enqueued(
        self,
        *,
        tool: str,
        call_id: str,
        session_id: str,
        turn: int | None,
        priority: int,
        parent: Context,
        start_ns: int,
    ) -> ToolSpan:
        """Open the span of a call the pool just enqueued."""
        attributes = tool_attributes(tool, call_id, session_id, turn)
        attributes[sc.TOOL_PRIORITY] = priority
        span = self._tracer.start_span(
            tool_span_name(tool),
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start_ns,
        )
        return ToolSpan(span, tool, self._metrics, start_ns)
