"""The sandbox service as ``agentmars sandbox serve`` serves it (``serve_sandbox`` on a
socket bound before the pool starts) answers keep-alive calls without Nagle's delay."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmars.sandbox import service
from agentmars.sandbox.client import SandboxClient
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecSpec
from agentmars.server.web.serving import listening_socket
from tests.connections import accepted_nodelay, serving_on_thread

TOKEN = "sandbox-test-token"


def test_a_keep_alive_connection_to_the_served_sandbox_has_nagle_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's client reuses its connection; without TCP_NODELAY on the accepted
    socket a response's body waits for the client's delayed ACK of its head (~40 ms)."""
    pool = SandboxPool(SandboxConfig(workspace_root=tmp_path / "ws", slots=1))
    app = service.create_sandbox_app(pool, TOKEN)
    listener = listening_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    with (
        serving_on_thread(monkeypatch, service, lambda: service.serve_sandbox(app, listener)),
        SandboxClient(f"http://127.0.0.1:{port}", TOKEN) as sandbox,
    ):
        sandbox.open_session("s1")
        for _ in range(2):
            assert sandbox.run("s1", ExecSpec(command=["true"])).status == "ok"
        assert accepted_nodelay(port) == [True]
