"""OTelSink and the GenAI conventions' versions: v1.36.0's names by default, the latest
with ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``; the metrics of each;
the trace context it hands to the requests of a call; the spans it leaves to the pool."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentmars import sdk
from agentmars.sdk.events import SessionStart, ToolEnd, ToolEnqueue, ToolStart
from agentmars.sdk.semconv import Semconv
from agentmars.sdk.sinks.otel import OTelSink, tracer_provider_from_env


@dataclass
class Telemetry:
    sink: OTelSink
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader

    def span(self, name: str) -> ReadableSpan:
        (found,) = [s for s in self.spans.get_finished_spans() if s.name == name]
        return found

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """Each data point of ``metric``: its attributes and its value (a histogram's
        count and sum, a counter's value)."""
        data = self.metrics.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name != metric:
                        continue
                    for point in item.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = (point.count, point.sum)
                        found.append((dict(point.attributes), value))
        return found

    def names(self) -> set[str]:
        data = self.metrics.get_metrics_data()
        return {
            item.name
            for resource in (data.resource_metrics if data else ())
            for scope in resource.scope_metrics
            for item in scope.metrics
        }


@contextlib.contextmanager
def telemetry(semconv: Semconv | None) -> Iterator[Telemetry]:
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[metrics])
    sink = OTelSink(tracer_provider, meter_provider=meter_provider, semconv=semconv)
    yield Telemetry(sink, spans, metrics)
    sink.close()
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def latest() -> Iterator[Telemetry]:
    with telemetry(Semconv.LATEST) as found:
        yield found


@pytest.fixture
def v1_36() -> Iterator[Telemetry]:
    with telemetry(Semconv.V1_36) as found:
        yield found


def streamed_call(emitter: sdk.Emitter, *, fail: bool = False) -> None:
    """A session with one streamed call to an OpenAI-compatible server and one tool."""
    with sdk.session(agent="coder", emitter=emitter):
        call = sdk.llm_call(
            "tiny", stream=True, provider="openai", server_address="gw.local", server_port=8080
        )
        with call:
            call.first_token()
            call.record_response(
                {
                    "id": "chatcmpl-1",
                    "model": "tiny-0613",
                    "choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}],
                    "usage": {
                        "prompt_tokens": 100,
                        "completion_tokens": 9,
                        "prompt_tokens_details": {"cached_tokens": 64},
                    },
                }
            )
        if fail:
            with pytest.raises(TimeoutError), sdk.tool("pytest"):
                raise TimeoutError("too slow")
        else:
            with sdk.tool("pytest"):
                pass


# --- which version ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opt_in", "expected"),
    [
        (None, Semconv.V1_36),
        ("", Semconv.V1_36),
        ("http", Semconv.V1_36),
        ("gen_ai_latest_experimental", Semconv.LATEST),
        ("http/dup, gen_ai_latest_experimental ,database", Semconv.LATEST),
        ("gen_ai_latest_experimental_typo", Semconv.V1_36),
    ],
)
def test_the_opt_in_variable_chooses_the_version(opt_in: str | None, expected: Semconv) -> None:
    environ = {} if opt_in is None else {"OTEL_SEMCONV_STABILITY_OPT_IN": opt_in}
    assert Semconv.from_env(environ) is expected


def test_the_sink_reads_the_opt_in_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    assert OTelSink(TracerProvider()).semconv is Semconv.LATEST
    monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN")
    assert OTelSink(TracerProvider()).semconv is Semconv.V1_36


# --- spans ----------------------------------------------------------------------------------


def test_latest_inference_span(latest: Telemetry) -> None:
    streamed_call(sdk.Emitter([latest.sink]))
    span = latest.span("chat tiny")
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.provider.name"] == "openai"
    assert "gen_ai.system" not in attributes
    assert attributes["server.address"] == "gw.local"
    assert attributes["server.port"] == 8080
    assert attributes["gen_ai.request.stream"] is True
    assert attributes["gen_ai.response.id"] == "chatcmpl-1"
    assert attributes["gen_ai.response.model"] == "tiny-0613"
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 64
    ttft = attributes["agentmars.llm.ttft_s"]
    assert attributes["gen_ai.response.time_to_first_chunk"] == ttft
    # Our own event, in our own namespace: gen_ai.* is the conventions'.
    assert [event.name for event in span.events] == ["agentmars.llm.first_token"]
    tool = dict(latest.span("execute_tool pytest").attributes or {})
    assert tool["gen_ai.tool.type"] == "function"


def test_v1_36_inference_span(v1_36: Telemetry) -> None:
    streamed_call(sdk.Emitter([v1_36.sink]))
    attributes = dict(v1_36.span("chat tiny").attributes or {})
    assert attributes["gen_ai.system"] == "openai"
    for latest_only in (
        "gen_ai.provider.name",
        "gen_ai.request.stream",
        "gen_ai.response.time_to_first_chunk",
    ):
        assert latest_only not in attributes
    # What both versions name alike is there in this one too.
    assert attributes["server.address"] == "gw.local"
    assert attributes["gen_ai.response.id"] == "chatcmpl-1"
    assert attributes["gen_ai.response.model"] == "tiny-0613"


@pytest.mark.parametrize(
    ("semconv", "provider", "expected"),
    [
        (Semconv.LATEST, "x_ai", "x_ai"),
        (Semconv.V1_36, "x_ai", "xai"),
        (Semconv.V1_36, "azure.ai.openai", "az.ai.openai"),
        (Semconv.V1_36, "hosted_vllm", "hosted_vllm"),
    ],
)
def test_providers_are_spelled_as_the_version_does(
    semconv: Semconv, provider: str, expected: str
) -> None:
    with telemetry(semconv) as found:
        emitter = sdk.Emitter([found.sink])
        with sdk.session(emitter=emitter), sdk.llm_call("m", provider=provider):
            pass
        attributes = dict(found.span("chat m").attributes or {})
    assert attributes[semconv.provider_key] == expected


# --- metrics --------------------------------------------------------------------------------


def test_latest_metrics(latest: Telemetry) -> None:
    streamed_call(sdk.Emitter([latest.sink]))
    span = latest.span("chat tiny")
    common = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "tiny",
        "server.address": "gw.local",
        "server.port": 8080,
    }
    assert span.end_time is not None and span.start_time is not None
    ((attributes, (count, total)),) = latest.points("gen_ai.client.inference.duration")
    assert attributes == {**common, "gen_ai.response.model": "tiny-0613"}
    assert count == 1 and total == pytest.approx((span.end_time - span.start_time) / 1e9)
    ((attributes, (count, total)),) = latest.points("gen_ai.client.inference.time_to_first_chunk")
    assert attributes == common
    assert total == (span.attributes or {})["agentmars.llm.ttft_s"]
    counted = {**common, "gen_ai.response.model": "tiny-0613", "gen_ai.token.modality": "unknown"}
    assert latest.points("gen_ai.client.inference.usage.input_tokens") == [(counted, 100)]
    assert latest.points("gen_ai.client.inference.usage.output_tokens") == [(counted, 9)]
    assert latest.points("gen_ai.client.inference.usage.cache_read.input_tokens") == [(counted, 64)]
    ((_, (count, total)),) = latest.points("gen_ai.client.inference.operation.input_tokens")
    assert (count, total) == (1, 100)
    tool = latest.span("execute_tool pytest")
    assert tool.end_time is not None and tool.start_time is not None
    ((attributes, (count, total)),) = latest.points("gen_ai.execute_tool.duration")
    assert attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "pytest",
        "gen_ai.tool.type": "function",
    }
    assert total == pytest.approx((tool.end_time - tool.start_time) / 1e9)
    for old in ("gen_ai.client.operation.duration", "gen_ai.client.token.usage"):
        assert old not in latest.names()


def test_v1_36_metrics(v1_36: Telemetry) -> None:
    streamed_call(sdk.Emitter([v1_36.sink]))
    assert v1_36.names() == {"gen_ai.client.operation.duration", "gen_ai.client.token.usage"}
    ((attributes, (count, _)),) = v1_36.points("gen_ai.client.operation.duration")
    assert attributes["gen_ai.system"] == "openai" and count == 1
    usage = {
        point[0]["gen_ai.token.type"]: point[1]
        for point in v1_36.points("gen_ai.client.token.usage")
    }
    assert usage == {"input": (1, 100), "output": (1, 9)}


def test_failures_carry_their_error_type(latest: Telemetry) -> None:
    emitter = sdk.Emitter([latest.sink])
    with pytest.raises(ConnectionError), sdk.session(emitter=emitter), sdk.llm_call("m"):
        raise ConnectionError("engine down")
    streamed_call(emitter, fail=True)
    failed = [
        attributes
        for attributes, _ in latest.points("gen_ai.client.inference.duration")
        if "error.type" in attributes
    ]
    assert failed == [{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                       "error.type": "ConnectionError"}]  # fmt: skip
    # A failed call without usage still counts, as 0 tokens.
    assert ({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
             "gen_ai.token.modality": "unknown"}, 0) in latest.points(
        "gen_ai.client.inference.usage.input_tokens"
    )  # fmt: skip
    tools = latest.points("gen_ai.execute_tool.duration")
    assert [a.get("error.type") for a, _ in tools] == ["TimeoutError"]


# --- trace context for the call's requests -----------------------------------------------------


def test_trace_headers_name_the_call_span_then_the_session_span(latest: Telemetry) -> None:
    propagator = TraceContextTextMapPropagator()
    emitter = sdk.Emitter([latest.sink])
    assert emitter.trace_headers("unknown") == {}
    with sdk.session(emitter=emitter) as s:
        call = sdk.llm_call("m").submit()
        during = emitter.trace_headers(s.session_id, call.call_id)
        call.end()
        after = emitter.trace_headers(s.session_id, call.call_id)
    chat, root = latest.span("chat m"), latest.span("invoke_agent")
    for headers, span in ((during, chat), (after, root)):
        (context,) = [
            value.get_span_context()
            for value in propagator.extract(headers).values()
            if hasattr(value, "get_span_context")
        ]
        assert (context.trace_id, context.span_id) == (span.context.trace_id, span.context.span_id)
    # An ended session is remembered: late work still joins its trace.
    assert emitter.trace_headers(s.session_id) == after


def test_the_pool_s_tool_events_get_no_span_here(latest: Telemetry) -> None:
    ids = {"session_id": "s", "call_id": "c", "tool": "t", "source": "sandbox"}
    for event in (
        SessionStart(session_id="s"),
        ToolEnqueue(**ids),
        ToolStart(**ids),
        ToolEnd(**ids),
    ):
        latest.sink.emit(event)
    latest.sink.close()
    assert [s.name for s in latest.spans.get_finished_spans()] == ["invoke_agent"]


# --- a server's own provider --------------------------------------------------------------------


def test_servers_trace_only_where_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tracer_provider_from_env("agentmars-x", {}) is None
    off = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}
    assert tracer_provider_from_env("agentmars-x", off) is None
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    provider = tracer_provider_from_env("agentmars-x", on)
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "agentmars-x"
    provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-eu-1")
    provider = tracer_provider_from_env("agentmars-x", on)
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "gateway-eu-1"
    provider.shutdown()
