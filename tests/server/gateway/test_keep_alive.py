"""The gateway as ``agentmars serve`` serves it (``run_gateway`` on a socket bound
before the engine starts) answers keep-alive calls without Nagle's delay."""

from __future__ import annotations

import httpx
import pytest

from agentmars.server.gateway import app as gateway_app
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app, run_gateway
from agentmars.server.web.serving import listening_socket
from tests.connections import accepted_nodelay, serving_on_thread
from tests.server.gateway.conftest import MODEL, TOKEN, Engine


def test_a_keep_alive_connection_to_the_served_gateway_has_nagle_off(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without TCP_NODELAY on the accepted socket each call on a reused connection
    took ~44 ms instead of ~2: the response's body waited for the client's delayed
    ACK of its head."""
    app = create_gateway_app(GatewayConfig(upstream_url=engine.url, token=TOKEN))
    listener = listening_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    body = {"model": MODEL, "prompt": "one", "max_tokens": 1}
    with (
        serving_on_thread(monkeypatch, gateway_app, lambda: run_gateway(app, listener)),
        httpx.Client(base_url=f"http://127.0.0.1:{port}") as client,
    ):
        for _ in range(3):
            client.post("/v1/completions", json=body).raise_for_status()
        assert accepted_nodelay(port) == [True]
