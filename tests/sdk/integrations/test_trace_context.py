"""What the client integrations tell the telemetry about a call, through a real
OpenAI-compatible server: the model as it is named (not LiteLLM's routing string), the
provider, the server, the answer's id and model; and the W3C trace context of the
call's span, sent with the request so the server's spans join the session's trace."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentmars import sdk
from agentmars.sdk.events import LLMEnd, LLMSubmit
from agentmars.sdk.integrations import litellm as agentmars_litellm
from agentmars.sdk.integrations.openai import instrument_openai
from agentmars.sdk.semconv import Semconv

from .conftest import LLMServer

MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def traced(exporter: InMemorySpanExporter, events: sdk.MemorySink) -> Iterator[sdk.Emitter]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = sdk.OTelSink(provider, semconv=Semconv.LATEST)
    yield sdk.Emitter([sink, events])
    sink.close()
    provider.shutdown()


def submit_and_end(events: sdk.MemorySink, session_id: str) -> tuple[LLMSubmit, LLMEnd]:
    (submit,) = [e for e in events.of_session(session_id) if isinstance(e, LLMSubmit)]
    (end,) = [e for e in events.of_session(session_id) if isinstance(e, LLMEnd)]
    return submit, end


def assert_request_in_span(server: LLMServer, exporter: InMemorySpanExporter, name: str) -> None:
    """The server got the traceparent of the call's span: version 00, the span's trace
    id, span id and flags."""
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    context = span.get_span_context()
    assert server.requests[-1].headers["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client(
    llm_server: LLMServer,
    traced: sdk.Emitter,
    events: sdk.MemorySink,
    exporter: InMemorySpanExporter,
    stream: bool,
) -> None:
    client = instrument_openai(openai.OpenAI(base_url=f"{llm_server.url}/v1", api_key="unused"))
    with sdk.session(emitter=traced) as s:
        reply = client.chat.completions.create(
            model="scripted", messages=MESSAGES, max_tokens=4, stream=stream
        )
        if stream:
            first, *_ = reply  # read whole: the stream's end ends the call
            answer_id = first.id
        else:
            answer_id = reply.id
    submit, end = submit_and_end(events, s.session_id)
    port = urlsplit(llm_server.url).port
    assert (submit.model, submit.provider) == ("scripted", "openai")
    assert (submit.server_address, submit.server_port) == ("127.0.0.1", port)
    assert (end.response_id, end.response_model) == (answer_id, "scripted")
    assert_request_in_span(llm_server, exporter, "chat scripted")
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "chat scripted"]
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["server.port"] == port
    assert attributes["gen_ai.response.id"] == end.response_id


def test_a_traceparent_the_caller_sends_is_kept(llm_server: LLMServer, traced: sdk.Emitter) -> None:
    client = instrument_openai(openai.OpenAI(base_url=f"{llm_server.url}/v1", api_key="unused"))
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with sdk.session(emitter=traced):
        client.chat.completions.create(
            model="scripted", messages=MESSAGES, max_tokens=2, extra_headers={"traceparent": own}
        )
    assert llm_server.requests[-1].headers["traceparent"] == own


def test_no_trace_context_without_a_tracing_sink(
    llm_server: LLMServer, emitter: sdk.Emitter
) -> None:
    client = instrument_openai(openai.OpenAI(base_url=f"{llm_server.url}/v1", api_key="unused"))
    with sdk.session(emitter=emitter):
        client.chat.completions.create(model="scripted", messages=MESSAGES, max_tokens=2)
    assert "traceparent" not in llm_server.requests[-1].headers


@pytest.mark.parametrize("stream", [False, True])
def test_litellm_calls_are_named_after_the_model(
    llm_server: LLMServer,
    traced: sdk.Emitter,
    events: sdk.MemorySink,
    exporter: InMemorySpanExporter,
    stream: bool,
) -> None:
    with sdk.session(emitter=traced) as s:
        reply = agentmars_litellm.completion(
            model="openai/scripted",
            api_base=f"{llm_server.url}/v1",
            api_key="unused",
            messages=MESSAGES,
            max_tokens=3,
            stream=stream,
        )
        if stream:
            list(reply)
    submit, end = submit_and_end(events, s.session_id)
    # LiteLLM's routing string is provider/model: the span is the model's.
    assert (submit.model, submit.provider) == ("scripted", "openai")
    assert submit.server_address == "127.0.0.1"
    assert end.response_model == "scripted"
    names = [span.name for span in exporter.get_finished_spans()]
    assert "chat scripted" in names and "chat openai/scripted" not in names
    assert_request_in_span(llm_server, exporter, "chat scripted")
