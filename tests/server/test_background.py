"""Servers started for demos, benchmarks and tests stop completely."""

from __future__ import annotations

import sys

import httpx
import pytest

from agentmars.server.background import serve_in_subprocess
from agentmars.server.ingest import TOKEN_ENV


def test_subprocess_server_serves_then_leaves_no_process() -> None:
    command = [sys.executable, "-m", "agentmars.server.ingest"]
    with serve_in_subprocess(command, env={TOKEN_ENV: "t0ken"}) as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok", "events": 0}
        unauthorised = httpx.post(f"{url}/v1/events", content=b"")
        assert unauthorised.status_code == 401
        port = int(url.rsplit(":", 1)[1])
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz")


def test_subprocess_that_cannot_start_reports_why() -> None:
    command = ["env", "-u", TOKEN_ENV, sys.executable, "-m", "agentmars.server.ingest"]
    with pytest.raises(RuntimeError, match=TOKEN_ENV), serve_in_subprocess(command):
        pass
