"""The SDK's events as OpenTelemetry spans: one agent session, one LLM call, one tool.

OTelSink turns the event stream into GenAI-convention spans (`invoke_agent coder`,
`chat <model>`, `execute_tool python`). By default they are printed by OTel's console
exporter; with --otlp-endpoint they go to a collector over OTLP/HTTP (Jaeger, Tempo,
the OTel collector: e.g. http://localhost:4318/v1/traces).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import openai
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter

from agentmars import sdk
from agentmars.sdk.integrations.openai import instrument_openai
from agentmars.sdk.sinks.otel import otlp_traces_url


def exporter_for(otlp_endpoint: str | None) -> SpanExporter:
    if otlp_endpoint is None:
        return ConsoleSpanExporter()
    # The sink's own check: a base URL such as http://localhost:4318 gets /v1/traces.
    return OTLPSpanExporter(endpoint=otlp_traces_url(otlp_endpoint))


# A decorated tool reports the returncode of the CompletedProcess it returns.
@sdk.tool("python")
def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="cpu-tiny")
    parser.add_argument("--api-key", default="unused", help="the gateway does not check it")
    parser.add_argument("--otlp-endpoint", help="OTLP/HTTP traces URL; default: print spans")
    args = parser.parse_args()

    # Our own provider, so its spans are flushed when we shut it down. (A one-liner for
    # OTLP alone: sdk.OTelSink.to_otlp_http(endpoint), which owns and closes its own.)
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "otel-export-example"}))
    # Simple (not batched) processing: each span is exported as it ends, fine for a demo.
    provider.add_span_processor(SimpleSpanProcessor(exporter_for(args.otlp_endpoint)))
    sdk.configure(sdk.OTelSink(provider))

    client = instrument_openai(openai.OpenAI(base_url=args.base_url, api_key=args.api_key))
    with sdk.session(agent="coder"):
        client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": "Write a one-line Python greeting."}],
            max_tokens=8,
        )
        run_python("print('hello from the tool')")

    sdk.configure()  # closes the sink: a span still open would be ended, marked unfinished
    provider.shutdown()  # flushes the exporter


if __name__ == "__main__":
    main()
