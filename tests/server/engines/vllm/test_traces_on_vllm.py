"""vLLM's own spans in the agent's trace: vLLM CPU exports them over OTLP/HTTP
(``VllmServerConfig.otlp_traces_endpoint``, ``--otlp-traces-endpoint``) to the same
real receiver as the SDK, the gateway and the sandbox pool, and its ``llm_request``
span of each call is a child of the gateway's span of it (the ``traceparent`` the
gateway forwards)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import openai
import pytest

from agentmars import sdk
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecSpec
from agentmars.sandbox.tracing import PoolTracing
from agentmars.sdk.integrations.openai import instrument_openai
from agentmars.sdk.semconv import Semconv
from agentmars.sdk.sinks.otel import tracer_provider_from_env
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME, VllmServerConfig, serve_vllm
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.web.serving import serve_in_thread
from tests.otlp_receiver import ReceivedSpan, otlp_receiver, tree

MESSAGES = [{"role": "user", "content": "list the files"}]
SHOWN = (
    "gen_ai.provider.name",
    "agentmars.admission.wait_s",
    "agentmars.sandbox.cores",
    "gen_ai.usage.completion_tokens",
    "gen_ai.latency.time_to_first_token",
)
"""Attributes the printed trace shows (``pytest -s``)."""


async def agent(gateway: str, pool: SandboxPool) -> str:
    """A session: a streamed call, a tool in the pool, a whole call."""
    client = instrument_openai(openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="unused"))
    async with sdk.session(agent="coder", emitter=pool.emitter) as session:
        stream = await client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=MESSAGES, max_tokens=8, stream=True
        )
        assert [chunk async for chunk in stream]
        pool.open_session(session.session_id)
        ran = await pool.run(
            session.session_id, ExecSpec(command=[sys.executable, "-c", "print(1)"]), tool="ls"
        )
        assert ran.status == "ok"
        await client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=MESSAGES, max_tokens=4
        )
    return session.session_id


def requests_of(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """vLLM's spans of requests."""
    return [s for s in spans if s.service == "vllm" and s.name == "llm_request"]


@pytest.mark.slow
def test_vllm_spans_join_the_session_s_trace(vllm_python: Path, tmp_path: Path) -> None:
    model = tiny_model_made_by(vllm_python)
    with otlp_receiver() as (receiver, traces_url):
        exporting = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_url}
        config = VllmServerConfig(
            python=vllm_python,
            model=model,
            max_model_len=1024,
            num_blocks=32,
            otlp_traces_endpoint=traces_url,
        )
        gateway_provider = tracer_provider_from_env("agentmars-gateway", exporting)
        pool_provider = tracer_provider_from_env("agentmars-sandbox", exporting)
        assert gateway_provider is not None and pool_provider is not None
        sink = sdk.OTelSink.to_otlp_http(traces_url, service_name="coder", semconv=Semconv.LATEST)
        # The agent's emitter, its sink included: the pool's spans join the session's.
        pool = SandboxPool(
            SandboxConfig(workspace_root=tmp_path / "ws", slots=1),
            emitter=sdk.Emitter([sink]),
            tracing=PoolTracing(pool_provider),
        )
        # vLLM exports in batches: every 100 ms here rather than every 5 s.
        with serve_vllm(
            config, tmp_path / "vllm.log", env={"OTEL_BSP_SCHEDULE_DELAY": "100"}
        ) as engine_url:
            gateway_config = GatewayConfig(
                upstream_url=engine_url, token="traces-token", tracer_provider=gateway_provider
            )
            with serve_in_thread(create_gateway_app(gateway_config)) as gateway:

                async def run() -> str:
                    async with pool:
                        return await agent(gateway, pool)

                session_id = asyncio.run(run())
            sink.close()
            gateway_provider.shutdown()
            pool_provider.shutdown()
            spans = receiver.wait_for(
                lambda received: len(requests_of(received)) >= 2, timeout_s=60
            )

    def of(service: str) -> list[ReceivedSpan]:
        return [s for s in spans if s.service == service]

    (root,) = [s for s in of("coder") if s.name == "invoke_agent coder"]
    engine = requests_of(spans)
    print(tree([s for s in spans if s.service != "vllm"] + engine, SHOWN))
    # One trace: the agent's, the gateway's, the pool's and vLLM's spans of the calls
    # (vLLM's start-up, "Load model"..., is traced too, in traces of its own).
    session = [s for s in spans if s.service != "vllm"] + engine
    assert {s.trace_id for s in session} == {root.trace_id}
    served = {s.span_id: s for s in of("agentmars-gateway")}
    assert len(served) == len(engine) == 2
    for span in engine:
        assert span.kind == "SERVER"
        gateway_side = served[span.parent_span_id]  # the gateway's span is vLLM's parent
        assert gateway_side.attributes["agentmars.session.id"] == session_id
        assert span.attributes["gen_ai.usage.completion_tokens"] in (4, 8)
    chats = {s.span_id for s in of("coder") if s.name == f"chat {SERVED_MODEL_NAME}"}
    assert {s.parent_span_id for s in served.values()} == chats
    (tool,) = of("agentmars-sandbox")
    assert tool.parent_span_id == root.span_id
    assert tool.attributes["agentmars.sandbox.cores"]
