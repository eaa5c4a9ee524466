"""The gateway's spans: a SERVER span per forwarded LLM call, in the caller's trace
(its ``traceparent``), annotated with the call and its admission, and the engine asked
under it (the ``traceparent`` the engine gets is the gateway span's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentmars.sdk.events import KVPin, KVUnpin, SessionEnd
from agentmars.server.web.serving import free_loopback_port
from tests.server.gateway.conftest import AUTH, MODEL, Engine, Gateway, GatewayFactory
from tests.server.gateway.test_admission import WindowOfOne

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CALLER = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}


@pytest.fixture
def traced(
    engine: Engine, make_gateway: GatewayFactory, provider: TracerProvider
) -> Iterator[Gateway]:
    with make_gateway(engine.url, tracer_provider=provider) as gw:
        yield gw


def chat(session: str | None = "s1", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 3,
        **extra,
    }
    if session is not None:
        body["session_id"] = session
    return body


def finished(exporter: InMemorySpanExporter, count: int = 1) -> list[ReadableSpan]:
    """The spans ended, once ``count`` have: the server ends a span after the client
    has the last byte of its answer."""
    deadline = time.monotonic() + 10
    while len(spans := exporter.get_finished_spans()) < count:
        assert time.monotonic() < deadline, f"{len(spans)} of {count} spans ended"
        time.sleep(0.01)
    return list(spans)


def engine_parent(engine: Engine) -> tuple[str, str]:
    """The trace and parent span ids of the engine's last request's traceparent."""
    _, trace_id, span_id, _ = engine.requests[-1].headers["traceparent"].split("-")
    return trace_id, span_id


def test_a_call_is_a_server_span_in_the_caller_s_trace(
    traced: Gateway, engine: Engine, exporter: InMemorySpanExporter
) -> None:
    reply = httpx.post(f"{traced.url}/v1/chat/completions", json=chat(), headers=CALLER)
    assert reply.status_code == 200
    (span,) = finished(exporter)
    assert span.name == f"chat {MODEL}" and span.kind is SpanKind.SERVER
    context = span.get_span_context()
    assert f"{context.trace_id:032x}" == CALLER_TRACE
    assert span.parent is not None and f"{span.parent.span_id:016x}" == CALLER_SPAN
    # The engine is asked under the gateway's span: vLLM's own spans are its children.
    assert engine_parent(engine) == (CALLER_TRACE, f"{context.span_id:016x}")
    attributes = dict(span.attributes or {})
    answer = reply.json()
    usage = answer["usage"]
    assert attributes == {
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": MODEL,
        "gen_ai.conversation.id": "s1",
        "gen_ai.response.id": answer["id"],
        "gen_ai.response.model": MODEL,
        "gen_ai.response.finish_reasons": (answer["choices"][0]["finish_reason"],),
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "gen_ai.usage.cache_read.input_tokens": 0,
        "agentmars.session.id": "s1",
        "agentmars.call.id": engine.requests[-1].body["vllm_xargs"]["call_id"],
        "agentmars.turn": 0,
        "agentmars.admission.policy": "fcfs",
        "agentmars.admission.wait_s": attributes["agentmars.admission.wait_s"],
    }
    (admitted,) = span.events
    assert admitted.name == "agentmars.admission.admitted"
    assert span.status.status_code is StatusCode.UNSET


def test_a_stream_s_span_lasts_until_its_last_chunk(
    traced: Gateway, exporter: InMemorySpanExporter
) -> None:
    with httpx.stream(
        "POST",
        f"{traced.url}/v1/chat/completions",
        json=chat(stream=True, max_tokens=20, stream_options={"include_usage": True}),
    ) as reply:
        chunks = [line for line in reply.iter_lines() if line.startswith("data:")]
    assert chunks[-1] == "data: [DONE]"
    (span,) = finished(exporter)
    assert span.parent is None  # no caller's trace: the gateway's span is its root
    assert span.end_time is not None and span.start_time is not None
    # 20 tokens at 10 ms each: the span covers the stream, not just its start.
    assert span.end_time - span.start_time >= 0.2e9
    assert (span.attributes or {})["gen_ai.usage.output_tokens"] == 20


def test_errors(
    traced: Gateway,
    exporter: InMemorySpanExporter,
    make_gateway: GatewayFactory,
    provider: TracerProvider,
) -> None:
    unknown = httpx.post(f"{traced.url}/v1/chat/completions", json={**chat(), "model": "nope"})
    assert unknown.status_code == 404
    (span,) = finished(exporter)
    assert span.name == "chat nope"
    assert (span.attributes or {})["http.response.status_code"] == 404
    assert span.status.status_code is StatusCode.UNSET  # the client's error, not ours
    exporter.clear()
    # The engine's 4xx (a bad max_tokens) is the client's error too: one rule for both.
    refused = httpx.post(f"{traced.url}/v1/chat/completions", json={**chat(), "max_tokens": "x"})
    assert refused.status_code == 400
    (span,) = finished(exporter)
    assert (span.attributes or {})["http.response.status_code"] == 400
    assert span.status.status_code is StatusCode.UNSET
    assert "error.type" not in (span.attributes or {})
    exporter.clear()
    with make_gateway(f"http://127.0.0.1:{free_loopback_port()}", tracer_provider=provider) as down:
        reply = httpx.post(f"{down.url}/v1/chat/completions", json=chat(), timeout=10)
    assert reply.status_code == 503
    (span,) = finished(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["http.response.status_code"] == 503
    exporter.clear()
    # The scripted engine crashes (500) on a text completion with "messages" not a list.
    crash = {"model": MODEL, "prompt": "x", "messages": 5}
    reply = httpx.post(f"{traced.url}/v1/completions", json=crash)
    assert reply.status_code == 502
    (span,) = finished(exporter)
    assert span.status.status_code is StatusCode.ERROR
    # The call's own error (the engine's answer) stays the span's message: the 502
    # does not replace it.
    assert span.status.description == "Internal Server Error"


def test_other_routes_are_not_traced(traced: Gateway, exporter: InMemorySpanExporter) -> None:
    assert httpx.get(f"{traced.url}/v1/models").status_code == 200
    assert httpx.get(f"{traced.url}/healthz").status_code == 200
    assert exporter.get_finished_spans() == ()


def test_the_wait_for_admission_is_on_the_span(
    engine: Engine,
    make_gateway: GatewayFactory,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    with make_gateway(engine.url, policy=WindowOfOne.name, tracer_provider=provider) as gw:
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=chat("first")).status_code == 200
        waiting = threading.Thread(
            target=httpx.post,
            args=(f"{gw.url}/v1/chat/completions",),
            kwargs={"json": chat("second"), "timeout": 30},
        )
        waiting.start()
        wait_until(lambda: "second" in gw.app.state.gateway.admission.waiting)
        held_from = time.monotonic()
        ended = SessionEnd(session_id="first").to_json()
        # It waits at least until "first" ends: from when it was seen waiting to now.
        held_for = time.monotonic() - held_from
        httpx.post(f"{gw.url}/v1/events", content=ended, headers=AUTH).raise_for_status()
        waiting.join(timeout=30)
        spans = finished(exporter, 2)
    attributes = [dict(span.attributes or {}) for span in spans]
    waits = {a["agentmars.session.id"]: a["agentmars.admission.wait_s"] for a in attributes}
    assert waits["first"] < 0.1
    assert waits["second"] >= held_for
    assert waits["second"] > waits["first"]


def test_without_tracing_the_caller_s_trace_context_goes_on(
    gateway: Gateway, engine: Engine
) -> None:
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(), headers=CALLER)
    assert reply.status_code == 200
    assert engine.requests[-1].headers["traceparent"] == CALLER["traceparent"]


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# --- the engine's KV pins ----------------------------------------------------------------


def pin_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    spans = finished(exporter, count + 1)
    return [span for span in spans if span.name == "agentmars.kv.pin"]


def test_an_engine_s_pin_is_a_span_under_the_session_s_latest_call(
    traced: Gateway, exporter: InMemorySpanExporter
) -> None:
    assert httpx.post(f"{traced.url}/v1/chat/completions", json=chat()).status_code == 200
    (call,) = finished(exporter)
    traced.hub.publish([KVPin(session_id="never-called", blocks=2, source="engine")])
    pin = KVPin(session_id="s1", blocks=4, ttl_s=30.0, source="engine")
    unpin = KVUnpin(session_id="s1", blocks=4, reason="expired", held_s=2.5, source="engine")
    traced.hub.publish([pin, unpin])
    (span,) = pin_spans(exporter, 1)  # none for the session the gateway traced no call of
    assert span.kind is SpanKind.INTERNAL and span.parent is not None
    assert span.parent.span_id == call.get_span_context().span_id
    assert span.get_span_context().trace_id == call.get_span_context().trace_id
    assert (span.start_time, span.end_time) == (pin.wall_ns, unpin.wall_ns)
    assert dict(span.attributes or {}) == {
        "agentmars.session.id": "s1",
        "agentmars.kv.pinned_blocks": 4,
        "agentmars.kv.pin_ttl_s": 30.0,
        "agentmars.kv.release_reason": "expired",
        "agentmars.kv.held_s": 2.5,
    }


def test_a_pin_span_ends_with_its_session_or_unfinished_with_the_gateway(
    engine: Engine,
    make_gateway: GatewayFactory,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    with make_gateway(engine.url, tracer_provider=provider) as gw:
        for session in ("ends", "stays"):
            reply = httpx.post(f"{gw.url}/v1/chat/completions", json=chat(session))
            assert reply.status_code == 200
        finished(exporter, 2)
        gw.hub.publish([KVPin(session_id=s, blocks=1, source="engine") for s in ("ends", "stays")])
        gw.hub.publish([SessionEnd(session_id="ends")])
        (ended,) = pin_spans(exporter, 2)
        attributes = dict(ended.attributes or {})
        assert attributes["agentmars.kv.release_reason"] == "session_end"
        assert attributes["agentmars.kv.held_s"] >= 0
    (_, stays) = pin_spans(exporter, 3)
    assert dict(stays.attributes or {})["agentmars.span.unfinished"] is True
