"""The pool's spans: one ``execute_tool`` span per call, with its slot and cores, in
its session's trace, in process and behind the sandbox service."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agentmars import sdk
from agentmars.sandbox.client import SandboxClient
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.service import create_sandbox_app
from agentmars.sandbox.spec import ExecSpec
from agentmars.sandbox.tracing import PoolTracing
from agentmars.sdk.semconv import Semconv
from agentmars.server.web.serving import serve_in_thread

TOKEN = "sandbox-tracing-token"
ECHO = ExecSpec(command=[sys.executable, "-c", "print('hi')"])
FAIL = ExecSpec(command=[sys.executable, "-c", "raise SystemExit(3)"])


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_a_call_s_span_joins_its_session_s_trace_in_process(
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    sink = sdk.OTelSink(provider, semconv=Semconv.LATEST)
    emitter = sdk.Emitter([sink])
    metrics = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[metrics])
    tracing = PoolTracing(provider, meters, Semconv.LATEST)
    config = SandboxConfig(workspace_root=tmp_path / "ws", slots=1)
    async with (
        SandboxPool(config, emitter=emitter, tracing=tracing) as pool,
        sdk.session(agent="coder", emitter=emitter) as s,
    ):
        pool.open_session(s.session_id)
        ok = await pool.run(s.session_id, ECHO, tool="terminal", call_id="c1", priority=4)
        failed = await pool.run(s.session_id, FAIL, tool="terminal", call_id="c2")
    sink.close()
    assert (ok.status, failed.status) == ("ok", "error")

    (root,) = named(exporter, "invoke_agent coder")
    calls = {
        (s.attributes or {})["gen_ai.tool.call.id"]: s
        for s in named(exporter, "execute_tool terminal")
    }
    assert set(calls) == {"c1", "c2"}  # one span a call: the sink leaves the pool's alone
    for span in calls.values():
        assert span.context.trace_id == root.context.trace_id
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.instrumentation_scope is not None
        assert span.instrumentation_scope.name == "agentmars.sandbox"
    attributes = dict(calls["c1"].attributes or {})
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.type"] == "function"
    assert attributes["agentmars.session.id"] == s.session_id
    assert attributes["agentmars.tool.priority"] == 4
    assert attributes["agentmars.sandbox.slot"] == ok.slot
    assert list(attributes["agentmars.sandbox.cores"]) == ok.cores
    assert attributes["agentmars.sandbox.backend"] == ok.backend
    assert attributes["agentmars.tool.queue_wait_s"] == pytest.approx(ok.queue_wait_s)
    assert attributes["agentmars.tool.exit_status"] == 0
    assert [event.name for event in calls["c1"].events] == ["agentmars.tool.start"]
    assert calls["c1"].status.status_code is StatusCode.UNSET
    assert calls["c2"].status.status_code is StatusCode.ERROR
    assert (calls["c2"].attributes or {})["agentmars.tool.exit_status"] == 3

    data = metrics.get_metrics_data()
    assert data is not None
    (durations,) = [
        m
        for r in data.resource_metrics
        for scope in r.scope_metrics
        for m in scope.metrics
        if m.name == "gen_ai.execute_tool.duration"
    ]
    outcomes = sorted(str(p.attributes.get("error.type")) for p in durations.data.data_points)
    assert outcomes == ["None", "error"]
    meters.shutdown()


async def test_the_span_current_where_the_call_is_made_is_its_parent(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    config = SandboxConfig(workspace_root=tmp_path / "ws", slots=1)
    async with SandboxPool(config, emitter=sdk.Emitter(), tracing=PoolTracing(provider)) as pool:
        pool.open_session("s")
        with provider.get_tracer("test").start_as_current_span("agent step") as step:
            await pool.run("s", ECHO, tool="python")
        given = trace.set_span_in_context(step)
        await pool.run("s", ECHO, tool="python", trace_parent=given)
        await pool.run("s", ECHO, tool="python")  # outside any span, no sink: a root
    first, second, third = named(exporter, "execute_tool python")
    for child in (first, second):
        assert child.parent is not None and child.parent.span_id == step.get_span_context().span_id
    assert third.parent is None


def test_the_service_s_span_is_a_child_of_the_client_s_tool_call(
    tmp_path: Path, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    pool = SandboxPool(SandboxConfig(workspace_root=tmp_path / "ws", slots=1))
    sink = sdk.OTelSink(provider)
    with (
        serve_in_thread(create_sandbox_app(pool, TOKEN, tracer_provider=provider)) as url,
        SandboxClient(url, TOKEN) as client,
        sdk.session(emitter=sdk.Emitter([sink])) as s,
    ):
        client.open_session(s.session_id)
        with sdk.tool("terminal", call_id="t1"):
            result = client.run(s.session_id, ECHO, tool="terminal", call_id="t1")
        streamed = client.run_streaming(s.session_id, ECHO, lambda stream, text: None)
    sink.close()
    assert result.status == streamed.status == "ok"
    (root,) = named(exporter, "invoke_agent")
    agent_side = [
        s
        for s in named(exporter, "execute_tool terminal")
        if s.instrumentation_scope and s.instrumentation_scope.name == "agentmars.sdk.sinks.otel"
    ]
    (tool_call,) = agent_side
    served = [
        s
        for s in exporter.get_finished_spans()
        if s.instrumentation_scope and s.instrumentation_scope.name == "agentmars.sandbox"
    ]
    by_tool = {(s.attributes or {})["gen_ai.tool.name"]: s for s in served}
    assert set(by_tool) == {"terminal", "tool"}
    for span in served:
        assert span.context.trace_id == root.context.trace_id
    # Inside the SDK's tool call, under its span; outside any, under the session's.
    assert by_tool["terminal"].parent is not None
    assert by_tool["terminal"].parent.span_id == tool_call.context.span_id
    assert by_tool["tool"].parent is not None
    assert by_tool["tool"].parent.span_id == root.context.span_id
