"""vLLM's tracing flags: its spans exported over OTLP/HTTP where asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmars.server.engines.vllm.launch import VllmServerConfig, server_argv, server_env

TRACES = "http://127.0.0.1:4318/v1/traces"


def test_an_endpoint_turns_vllm_s_tracing_on_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    config = VllmServerConfig(python=Path("/p"), model=Path("/m"), otlp_traces_endpoint=TRACES)
    argv = server_argv(config)
    assert argv[argv.index("--otlp-traces-endpoint") + 1] == TRACES
    assert server_env(config) == {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # vLLM's default is gRPC
        "OTEL_SERVICE_NAME": "vllm",
    }
    monkeypatch.setenv("OTEL_SERVICE_NAME", "engine-7")  # the caller's name stays
    assert "OTEL_SERVICE_NAME" not in server_env(config)
    untraced = VllmServerConfig(python=Path("/p"), model=Path("/m"))
    assert "--otlp-traces-endpoint" not in server_argv(untraced)
