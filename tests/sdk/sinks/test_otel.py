"""OTelSink: real SDK events become GenAI-convention spans, in memory and over OTLP/HTTP."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentmars import sdk
from agentmars.sdk.events import (
    Event,
    KVStats,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    ToolStats,
    WindowUpdate,
)
from agentmars.sdk.sinks.otel import OTelSink, otlp_traces_url
from tests.otlp_receiver import otlp_receiver

E = TypeVar("E", bound=Event)


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(0.01)


@pytest.fixture
def sink(provider: TracerProvider) -> Iterator[OTelSink]:
    sink = OTelSink(provider)
    yield sink
    sink.close()


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), f"span names not unique: {[s.name for s in spans]}"
    return named


def one(events: list[Event], kind: type[E], **match: Any) -> E:
    """The single event of ``kind`` whose fields equal ``match``."""
    found = [
        e
        for e in events
        if isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items())
    ]
    assert len(found) == 1, (kind, match, found)
    return found[0]


def run_coder_session(emitter: sdk.Emitter) -> str:
    """A session with a streaming tool-calling LLM call, a tool call and a final LLM call."""
    with sdk.session(agent="coder", emitter=emitter, metadata={"task": "t1"}) as s:
        with sdk.llm_call(
            "m", expects_tool=True, stream=True, max_tokens=256, projected_prompt_tokens=100
        ) as c:
            c.first_token()
            c.record_usage(
                prompt_tokens=100,
                output_tokens=20,
                cached_tokens=64,
                finish_reason="tool_calls",
                ended_in_tool_call=True,
            )
        with sdk.tool("terminal", call_id="call_1") as t:
            t.set_exit_status(0)
        with sdk.llm_call("m2", operation="text_completion") as c:
            c.record_usage(prompt_tokens=130, output_tokens=7, finish_reason="stop")
    return s.session_id


# --- span tree, attributes and times -----------------------------------------------------


def test_session_with_two_llm_calls_and_a_tool_call(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    memory = sdk.MemorySink()
    session_id = run_coder_session(sdk.Emitter([sink, memory]))
    events = memory.events

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {
        "invoke_agent coder",
        "chat m",
        "execute_tool terminal",
        "text_completion m2",
    }
    root = spans["invoke_agent coder"]
    first, tool, second = (
        spans["chat m"],
        spans["execute_tool terminal"],
        spans["text_completion m2"],
    )

    # Tree: one trace, the session span is the root and the parent of every call.
    assert root.parent is None
    trace_id = root.context.trace_id
    for child in (first, tool, second):
        assert child.context.trace_id == trace_id
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id
    assert root.kind is SpanKind.INTERNAL
    assert first.kind is SpanKind.CLIENT and second.kind is SpanKind.CLIENT
    assert tool.kind is SpanKind.INTERNAL

    # Times are the events' wall clocks.
    start, end = one(events, SessionStart), one(events, SessionEnd)
    assert (root.start_time, root.end_time) == (start.wall_ns, end.wall_ns)
    submit1 = one(events, LLMSubmit, turn=0)
    end1 = one(events, LLMEnd, turn=0)
    assert (first.start_time, first.end_time) == (submit1.wall_ns, end1.wall_ns)
    submit2, end2 = one(events, LLMSubmit, turn=1), one(events, LLMEnd, turn=1)
    assert (second.start_time, second.end_time) == (submit2.wall_ns, end2.wall_ns)
    enqueue, tool_start, tool_end = (
        one(events, ToolEnqueue),
        one(events, ToolStart),
        one(events, ToolEnd),
    )
    assert (tool.start_time, tool.end_time) == (enqueue.wall_ns, tool_end.wall_ns)

    assert dict(root.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "coder",
        "gen_ai.conversation.id": session_id,
        "agentmars.session.id": session_id,
        "agentmars.session.metadata.task": "t1",
        "agentmars.session.status": "ok",
        "agentmars.session.turns": 2,
    }
    assert root.status.status_code is StatusCode.UNSET

    assert dict(first.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.request.max_tokens": 256,
        "gen_ai.conversation.id": session_id,
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 64,
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "agentmars.session.id": session_id,
        "agentmars.turn": 0,
        "agentmars.call.id": submit1.call_id,
        "agentmars.llm.stream": True,
        "agentmars.llm.follows_tool": False,
        "agentmars.llm.expects_tool": True,
        "agentmars.llm.projected_prompt_tokens": 100,
        "agentmars.llm.projected_kv_blocks": 7,
        "agentmars.llm.ended_in_tool_call": True,
        "agentmars.llm.ttft_s": one(events, LLMFirstToken).ttft_s,
    }
    (token_event,) = first.events
    assert token_event.name == "agentmars.llm.first_token"
    assert token_event.timestamp == one(events, LLMFirstToken).wall_ns
    assert dict(token_event.attributes or {}) == {
        "agentmars.llm.ttft_s": one(events, LLMFirstToken).ttft_s
    }

    # The second call: not streamed (no first-token event), follows the tool, no cache info.
    attributes = dict(second.attributes or {})
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.request.model"] == "m2"
    assert attributes["agentmars.turn"] == 1
    assert attributes["agentmars.llm.follows_tool"] is True
    assert attributes["agentmars.llm.expects_tool"] is False
    assert attributes["gen_ai.usage.input_tokens"] == 130
    assert attributes["gen_ai.usage.output_tokens"] == 7
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    for unknown in (
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.request.max_tokens",
        "agentmars.llm.projected_kv_blocks",
        "agentmars.llm.ttft_s",
    ):
        assert unknown not in attributes
    assert second.events == ()

    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "terminal",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.type": "function",
        "agentmars.session.id": session_id,
        "agentmars.turn": 0,
        "agentmars.tool.queue_wait_s": tool_start.queue_wait_s,
        "agentmars.tool.status": "ok",
        "agentmars.tool.exit_status": 0,
    }
    (start_event,) = tool.events
    assert start_event.name == "agentmars.tool.start"
    assert start_event.timestamp == tool_start.wall_ns
    assert tool.status.status_code is StatusCode.UNSET


def test_queued_tool_span_starts_at_enqueue(sink: OTelSink, exporter: InMemorySpanExporter) -> None:
    memory = sdk.MemorySink()
    with sdk.session(emitter=sdk.Emitter([sink, memory])):
        call = sdk.tool("python").enqueue()
        wait_until(lambda: time.time_ns() > memory.events[-1].wall_ns + 2_000_000)
        call.start()
        call.end(cpu_time_s=0.5)

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"invoke_agent", "execute_tool python"}  # no agent name: bare operation
    tool = spans["execute_tool python"]
    enqueue, start = one(memory.events, ToolEnqueue), one(memory.events, ToolStart)
    assert tool.start_time == enqueue.wall_ns
    assert start.queue_wait_s >= 0.002
    assert tool.attributes is not None
    assert tool.attributes["agentmars.tool.queue_wait_s"] == start.queue_wait_s
    assert tool.attributes["agentmars.tool.cpu_time_s"] == 0.5
    assert "agentmars.turn" not in tool.attributes  # before the first LLM call
    assert [(e.name, e.timestamp) for e in tool.events] == [("agentmars.tool.start", start.wall_ns)]


# --- failures ------------------------------------------------------------------------------


def test_failed_tool_calls_have_error_status(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    with sdk.session(agent="coder", emitter=sdk.Emitter([sink])):
        with sdk.tool("terminal") as t:
            t.set_exit_status(2)
        with pytest.raises(TimeoutError), sdk.tool("browser"):
            raise TimeoutError("page did not load")
        with sdk.tool("ok"):
            pass

    spans = by_name(exporter.get_finished_spans())
    terminal = spans["execute_tool terminal"]
    assert terminal.status.status_code is StatusCode.ERROR
    assert terminal.status.description == "tool terminal ended with status error (exit status 2)"
    assert terminal.attributes is not None
    assert terminal.attributes["agentmars.tool.exit_status"] == 2
    assert terminal.attributes["error.type"] == "error"

    browser = spans["execute_tool browser"]
    assert browser.status.status_code is StatusCode.ERROR
    assert browser.status.description == "TimeoutError: page did not load"
    assert browser.attributes is not None
    assert browser.attributes["error.type"] == "TimeoutError"

    assert spans["execute_tool ok"].status.status_code is StatusCode.UNSET
    assert spans["invoke_agent coder"].status.status_code is StatusCode.UNSET


def test_failed_llm_call_and_session_have_error_status(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    with (
        pytest.raises(ConnectionError),
        sdk.session(agent="coder", emitter=sdk.Emitter([sink])),
        sdk.llm_call("m"),
    ):
        raise ConnectionError("engine down")

    spans = by_name(exporter.get_finished_spans())
    for name in ("chat m", "invoke_agent coder"):
        span = spans[name]
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ConnectionError: engine down"
        assert span.attributes is not None
        assert span.attributes["error.type"] == "ConnectionError"
    assert (spans["invoke_agent coder"].attributes or {})["agentmars.session.status"] == "error"


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_sessions_do_not_mix(sink: OTelSink, exporter: InMemorySpanExporter) -> None:
    emitter = sdk.Emitter([sink])
    workers, rounds = 8, 5
    barrier = threading.Barrier(workers)
    session_ids: list[str] = []

    def agent(index: int) -> None:
        barrier.wait()  # all sessions open and interleave
        with sdk.session(agent=f"agent-{index}", emitter=emitter) as s:
            session_ids.append(s.session_id)
            for _ in range(rounds):
                with sdk.llm_call(f"model-{index}") as c:
                    c.first_token()
                    c.record_usage(prompt_tokens=10, output_tokens=1)
                # Same tool call id in every session: keyed per session, they stay apart.
                with sdk.tool(f"tool-{index}", call_id="call_0"):
                    pass

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert emitter.sink_errors == {}

    spans = exporter.get_finished_spans()
    assert len(spans) == workers * (1 + 2 * rounds)
    roots = {s.context.span_id: s for s in spans if s.parent is None}
    assert len(roots) == workers
    assert {r.attributes["agentmars.session.id"] for r in roots.values() if r.attributes} == set(
        session_ids
    )
    for span in spans:
        if span.parent is None:
            continue
        root = roots[span.parent.span_id]
        assert span.context.trace_id == root.context.trace_id
        assert span.attributes is not None and root.attributes is not None
        assert span.attributes["agentmars.session.id"] == root.attributes["agentmars.session.id"]
        index = str(root.attributes["gen_ai.agent.name"]).removeprefix("agent-")
        assert span.name in (f"chat model-{index}", f"execute_tool tool-{index}")
    assert len({s.context.trace_id for s in spans}) == workers


# --- partial streams and lifecycle -------------------------------------------------------------


def test_call_of_unknown_session_becomes_a_root_span(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    emitter = sdk.Emitter()
    with sdk.session(agent="coder", emitter=emitter):
        emitter.add(sink)  # attached mid-session: session_start was missed
        with sdk.llm_call("m") as c:
            c.record_usage(prompt_tokens=5, output_tokens=1)
    assert emitter.sink_errors == {}

    (span,) = exporter.get_finished_spans()  # the session_end orphan is ignored
    assert span.name == "chat m"
    assert span.parent is None
    assert span.attributes is not None
    assert span.attributes["gen_ai.usage.input_tokens"] == 5


def test_call_starting_after_its_session_ended_joins_its_trace(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    with sdk.session(emitter=sdk.Emitter([sink])) as s:
        late = sdk.tool("cleanup", session=s)
    with late:  # started in the background after the session closed
        pass
    spans = by_name(exporter.get_finished_spans())
    root, tool = spans["invoke_agent"], spans["execute_tool cleanup"]
    assert tool.parent is not None and tool.parent.span_id == root.context.span_id
    assert tool.context.trace_id == root.context.trace_id


def test_orphans_and_host_events_are_ignored(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    for event in (
        LLMEnd(session_id="s", call_id="c", turn=0),
        LLMFirstToken(session_id="s", call_id="c", turn=0, ttft_s=0.1),
        ToolEnd(session_id="s", call_id="c", tool="t"),
        SessionEnd(session_id="s"),
        KVStats(total_blocks=10, free_blocks=4, used_blocks=6),
        WindowUpdate(window=4, previous=8),
        ToolStats(active=2),
    ):
        sink.emit(event)
    sink.close()
    assert exporter.get_finished_spans() == ()


def test_tool_start_without_enqueue_opens_the_span(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    sink.emit(SessionStart(session_id="s", wall_ns=1_000))
    sink.emit(ToolStart(session_id="s", call_id="c", tool="t", queue_wait_s=0.25, wall_ns=2_000))
    sink.emit(ToolEnd(session_id="s", call_id="c", tool="t", wall_ns=3_000))
    sink.emit(SessionEnd(session_id="s", wall_ns=4_000))
    spans = by_name(exporter.get_finished_spans())
    tool = spans["execute_tool t"]
    assert (tool.start_time, tool.end_time) == (2_000, 3_000)
    assert tool.parent is not None and tool.parent.span_id == spans["invoke_agent"].context.span_id
    assert tool.attributes is not None
    assert tool.attributes["agentmars.tool.queue_wait_s"] == 0.25


def test_end_before_start_on_the_wall_clock_is_clamped(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    sink.emit(SessionStart(session_id="s", wall_ns=5_000))
    sink.emit(LLMSubmit(session_id="s", call_id="c", turn=0, wall_ns=6_000))
    sink.emit(LLMEnd(session_id="s", call_id="c", turn=0, wall_ns=5_500))  # clock stepped back
    sink.emit(SessionEnd(session_id="s", wall_ns=7_000))
    (llm,) = [s for s in exporter.get_finished_spans() if s.name == "chat"]
    assert (llm.start_time, llm.end_time) == (6_000, 6_000)


def test_close_ends_open_spans_as_unfinished(
    sink: OTelSink, exporter: InMemorySpanExporter
) -> None:
    emitter = sdk.Emitter([sink])
    with sdk.session(agent="coder", emitter=emitter):
        sdk.llm_call("m").submit()  # never ended
        emitter.close()  # closes the sink while the session is open
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"chat m", "invoke_agent coder"}
    for span in spans.values():
        assert span.attributes is not None
        assert span.attributes["agentmars.span.unfinished"] is True
        assert span.attributes["agentmars.span.unfinished_reason"] == "sink closed"

    sink.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        sink.emit(SessionStart(session_id="late"))


def test_global_provider_is_used_by_default() -> None:
    sink = OTelSink()  # a no-op / proxy provider unless the process set one: must not fail
    with sdk.session(emitter=sdk.Emitter([sink])), sdk.llm_call("m"):
        pass
    sink.close()


def test_sdk_imports_without_opentelemetry() -> None:
    code = (
        "import sys, agentmars.sdk, agentmars.sdk.sinks\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "from agentmars.sdk.sinks import OTelSink\n"
        "assert OTelSink.__module__ == 'agentmars.sdk.sinks.otel'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- OTLP/HTTP export --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/traces", ""])
def test_otlp_http_export(path: str) -> None:
    with otlp_receiver() as (receiver, traces_url):
        base = traces_url.removesuffix("/v1/traces")
        sink = OTelSink.to_otlp_http(
            f"{base}{path}", service_name="agentmars-test", headers={"x-test": "yes"}
        )
        session_id = run_coder_session(sdk.Emitter([sink]))
        sink.close()  # flushes the batch processor and shuts the owned provider down
        received = receiver.wait_for(lambda spans: len(spans) == 4)

    spans = {s.name: s for s in received}
    assert set(spans) == {
        "invoke_agent coder",
        "chat m",
        "execute_tool terminal",
        "text_completion m2",
    }
    root = spans["invoke_agent coder"]
    for span in spans.values():
        assert span.service == "agentmars-test"
        assert span.scope == "agentmars.sdk.sinks.otel"
        assert span.headers["x-test"] == "yes"
        assert span.trace_id == root.trace_id
        assert span.attributes["agentmars.session.id"] == session_id
        if span is not root:
            assert span.parent_span_id == root.span_id

    chat = spans["chat m"].attributes
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.request.model"] == "m"
    assert chat["gen_ai.usage.input_tokens"] == 100
    assert chat["gen_ai.usage.output_tokens"] == 20
    assert chat["gen_ai.usage.cache_read.input_tokens"] == 64
    assert chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chat["agentmars.turn"] == 0
    completion = spans["text_completion m2"].attributes
    assert completion["gen_ai.operation.name"] == "text_completion"
    assert completion["gen_ai.request.model"] == "m2"
    assert completion["gen_ai.usage.input_tokens"] == 130
    assert completion["gen_ai.usage.output_tokens"] == 7
    assert completion["agentmars.turn"] == 1
    tool = spans["execute_tool terminal"].attributes
    assert tool["gen_ai.operation.name"] == "execute_tool"
    assert tool["gen_ai.tool.name"] == "terminal"
    assert tool["agentmars.turn"] == 0
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == session_id


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "localhost:4318/v1/traces",
        "ftp://collector/v1/traces",
        "http://",
        "http:///v1/traces",
        "http://collector:99999/v1/traces",
        "http://collector:port/v1/traces",
        "http://coll ector:4318/v1/traces",
        "grpc://collector:4317",
    ],
)
def test_bad_endpoint_is_rejected(endpoint: str) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        OTelSink.to_otlp_http(endpoint)


def test_endpoint_normalisation_and_service_name() -> None:
    assert otlp_traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert otlp_traces_url("https://c/") == "https://c/v1/traces"
    assert otlp_traces_url("http://c:4318/custom/traces") == "http://c:4318/custom/traces"
    with pytest.raises(ValueError, match="service_name"):
        OTelSink.to_otlp_http("http://127.0.0.1:4318", service_name="")
