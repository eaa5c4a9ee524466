"""An OTLP/HTTP traces receiver for tests: a real endpoint on loopback that decodes each
``ExportTraceServiceRequest`` (protobuf, gzip or not) with opentelemetry-proto and keeps
the spans, as a collector would receive them."""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from agentmars.server.web.serving import serve_in_thread

TRACES_PATH = "/v1/traces"


def value_of(value: AnyValue) -> Any:
    field_name = value.WhichOneof("value")
    if field_name == "array_value":
        return tuple(value_of(v) for v in value.array_value.values)
    return getattr(value, field_name) if field_name else None


def attributes_of(items: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in items if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived, ids as hex (``trace_id`` 32 digits, ``span_id`` 16)."""

    name: str
    kind: str
    """``SERVER``, ``CLIENT``, ``INTERNAL``..."""
    trace_id: str
    span_id: str
    parent_span_id: str
    """"" for a root span."""
    service: str
    scope: str
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    error: bool
    start_ns: int
    end_ns: int
    headers: dict[str, str] = field(default_factory=dict)
    """The export request's HTTP headers."""


class Receiver:
    """Keeps every span it is sent; ``wait_for`` polls them with a deadline."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.app = FastAPI()
        self.app.post(TRACES_PATH)(self._receive)

    async def _receive(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        headers = dict(request.headers)
        received = [
            _span(span, resource_spans, scope_spans.scope.name, headers)
            for resource_spans in message.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self._lock:
            self._spans.extend(received)
        return Response(
            content=ExportTraceServiceResponse().SerializeToString(),
            media_type="application/x-protobuf",
        )

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans received, once ``done`` says they are all there."""
        deadline = time.monotonic() + timeout_s
        while not done(spans := self.spans()):
            if time.monotonic() > deadline:
                names = sorted(s.name for s in spans)
                raise AssertionError(f"spans not all received within {timeout_s} s: {names}")
            time.sleep(0.05)
        return spans


def _span(span: Span, resource_spans: Any, scope: str, headers: dict[str, str]) -> ReceivedSpan:
    resource = attributes_of(resource_spans.resource.attributes)
    return ReceivedSpan(
        name=span.name,
        kind=Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        service=str(resource.get("service.name", "")),
        scope=scope,
        attributes=attributes_of(span.attributes),
        events=tuple((e.name, attributes_of(e.attributes)) for e in span.events),
        error=span.status.code == Status.STATUS_CODE_ERROR,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        headers=headers,
    )


def tree(spans: list[ReceivedSpan], shown: tuple[str, ...] = ()) -> str:
    """The spans as indented trees, one per trace root: name, service, kind, duration
    and the ``shown`` attributes each has (``pytest -s`` prints what a test prints)."""
    children: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span)
    lines: list[str] = []

    def add(span: ReceivedSpan, depth: int) -> None:
        took_ms = (span.end_ns - span.start_ns) / 1e6
        named = ", ".join(f"{k}={span.attributes[k]!r}" for k in shown if k in span.attributes)
        lines.append(
            f"{'    ' * depth}{span.name}  [{span.service}, {span.kind}, {took_ms:.1f} ms]"
            + (f"  {named}" if named else "")
        )
        for child in sorted(children.get(span.span_id, []), key=lambda s: s.start_ns):
            add(child, depth + 1)

    for root in children.get("", []):
        lines.append(f"trace {root.trace_id}")
        add(root, 0)
    return "\n".join(lines)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """A receiver served on loopback, and its traces URL."""
    receiver = Receiver()
    with serve_in_thread(receiver.app) as url:
        yield receiver, url + TRACES_PATH
