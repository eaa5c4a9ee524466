"""One trace per agent session, across processes, over real OTLP: an agent (the SDK's
``OTelSink``, an instrumented OpenAI client, the sandbox client) talks to
``agentmars serve --engine sim`` and ``agentmars sandbox serve``, each started as a user
starts it with the usual ``OTEL_*`` variables; everyone exports OTLP/HTTP to one
receiver, and every span lands in the session's trace, each under its caller's: the
KV that MARS pins for the session over its tool call included."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

import openai

from agentmars import sdk
from agentmars.sandbox.client import SandboxClient
from agentmars.sandbox.spec import ExecSpec
from agentmars.sdk.integrations.openai import instrument_openai
from agentmars.sdk.semconv import Semconv
from agentmars.server.web.serving import serve_in_subprocess
from tests.cli.serving import served_twin
from tests.otlp_receiver import ReceivedSpan, otlp_receiver, tree

SANDBOX_TOKEN = "traces-sandbox-token"
SPANS = 8
"""The agent's session, two chats and a tool call; the gateway's two calls; the
sandbox's run of the tool; the engine's pin of the session's KV over the tool call."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
"""Offered in the first chat: a call that may end in a tool call, which ``mars-paper``
pins."""
SHOWN = (
    "gen_ai.provider.name",
    "server.port",
    "gen_ai.response.model",
    "gen_ai.usage.output_tokens",
    "agentmars.admission.wait_s",
    "agentmars.sandbox.slot",
    "agentmars.sandbox.cores",
    "agentmars.kv.pinned_blocks",
    "agentmars.kv.release_reason",
    "agentmars.kv.held_s",
)
"""Attributes the printed trace shows (``pytest -s``)."""


def otel_env(traces_url: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms, not the default 5 s
        "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
    }


def run_agent(gateway: str, sandbox_url: str, sink: sdk.OTelSink) -> str:
    """A session: a streamed chat, a tool call in the sandbox, a second chat."""
    client = instrument_openai(openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused"))
    # Long enough to fill KV blocks, which a pin holds (a partial block is not kept).
    task = "fix the bug: the parser drops the last line of every file it reads. " * 8
    messages = [{"role": "user", "content": task}]
    with (
        sdk.session(agent="coder", emitter=sdk.Emitter([sink])) as session,
        SandboxClient(sandbox_url, SANDBOX_TOKEN) as sandbox,
    ):
        stream = client.chat.completions.create(
            model="cpu-tiny", messages=messages, max_tokens=8, stream=True, tools=TOOLS
        )
        assert list(stream)
        sandbox.open_session(session.session_id)
        with sdk.tool("terminal", call_id="t1"):
            result = sandbox.run(
                session.session_id,
                ExecSpec(command=[sys.executable, "-c", "print('ok')"]),
                tool="terminal",
                call_id="t1",
            )
        assert result.status == "ok"
        client.chat.completions.create(model="cpu-tiny", messages=messages, max_tokens=4)
    return session.session_id


def test_one_trace_per_session_from_the_sdk_through_the_gateway_to_the_sandbox(
    tmp_path: Path,
) -> None:
    with otlp_receiver() as (receiver, traces_url):
        env = otel_env(traces_url)
        sandbox_command = [sys.executable, "-m", "agentmars.cli.main", "sandbox", "serve",
                           "--workspace-root", str(tmp_path / "ws"), "--slots", "1"]  # fmt: skip
        with (
            # The paper's MARS pins the KV over the tool call; the default one sends it
            # to the twin's CPU tier while nobody waits for the blocks (docs/mars.md).
            served_twin(env=env, args=["--policy", "mars-paper"]) as twin,
            serve_in_subprocess(
                sandbox_command, env={**env, "AGENTMARS_SANDBOX_TOKEN": SANDBOX_TOKEN}
            ) as sandbox_url,
        ):
            sink = sdk.OTelSink.to_otlp_http(
                traces_url, service_name="coder-agent", semconv=Semconv.LATEST
            )
            session_id = run_agent(twin.base, sandbox_url, sink)
            sink.close()
            spans = receiver.wait_for(lambda received: len(received) >= SPANS)
    print(tree(spans, SHOWN))
    assert len(spans) == SPANS, sorted((s.service, s.name) for s in spans)
    by_id = {span.span_id: span for span in spans}

    def of(service: str, name: str) -> list[ReceivedSpan]:
        return [s for s in spans if (s.service, s.name) == (service, name)]

    (root,) = of("coder-agent", "invoke_agent coder")
    assert root.parent_span_id == ""
    assert {span.trace_id for span in spans} == {root.trace_id}  # one trace

    # The agent's chats, and the gateway's span of each under it.
    chats = of("coder-agent", "chat cpu-tiny")
    served = of("agentmars-gateway", "chat cpu-tiny")
    assert len(chats) == len(served) == 2
    gateway_port = urlsplit(twin.base).port
    for chat in chats:
        assert chat.kind == "CLIENT" and chat.parent_span_id == root.span_id
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert (chat.attributes["server.address"], chat.attributes["server.port"]) == (
            "127.0.0.1",
            gateway_port,
        )
        (gateway_side,) = [
            s
            for s in served
            if s.attributes["agentmars.call.id"] == chat.attributes["agentmars.call.id"]
        ]
        assert gateway_side.kind == "SERVER"
        assert gateway_side.parent_span_id == chat.span_id
        assert gateway_side.attributes["agentmars.session.id"] == session_id
        assert gateway_side.attributes["agentmars.admission.wait_s"] >= 0
        assert (
            gateway_side.attributes["gen_ai.response.id"] == chat.attributes["gen_ai.response.id"]
        )
        assert chat.start_ns <= gateway_side.start_ns <= gateway_side.end_ns <= chat.end_ns + 10**8

    # The tool call: the agent's span, and the sandbox's run of it under it.
    (tool_call,) = of("coder-agent", "execute_tool terminal")
    (run,) = of("agentmars-sandbox", "execute_tool terminal")
    assert tool_call.parent_span_id == root.span_id
    assert run.parent_span_id == tool_call.span_id
    assert run.attributes["agentmars.session.id"] == session_id
    assert run.attributes["agentmars.sandbox.slot"] == 0
    assert run.attributes["agentmars.sandbox.cores"]
    assert run.attributes["agentmars.tool.exit_status"] == 0

    # The KV MARS pinned at the end of the first chat (it offered tools), held over the
    # tool call until the second chat took it: under the gateway's span of the first.
    (pin,) = of("agentmars-gateway", "agentmars.kv.pin")
    first = min(served, key=lambda span: span.start_ns)
    assert pin.kind == "INTERNAL" and pin.parent_span_id == first.span_id
    assert pin.attributes["agentmars.session.id"] == session_id
    assert pin.attributes["agentmars.kv.pinned_blocks"] > 0
    assert "agentmars.kv.pin_ttl_s" not in pin.attributes  # MARS pins until released
    assert pin.attributes["agentmars.kv.release_reason"] == "next_call"
    assert pin.attributes["agentmars.kv.held_s"] > 0
    assert first.start_ns <= pin.start_ns <= pin.end_ns <= max(s.end_ns for s in served)
    (tool_run,) = of("agentmars-sandbox", "execute_tool terminal")
    assert pin.start_ns <= tool_run.start_ns and tool_run.end_ns <= pin.end_ns
    assert all(by_id[s.parent_span_id] for s in spans if s.parent_span_id)
