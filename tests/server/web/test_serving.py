"""Servers started for demos, benchmarks and tests stop completely."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.server.web.ingest import TOKEN_ENV
from agentmars.server.web.serving import (
    free_loopback_port,
    live_group_members,
    run_as_group,
    serve_in_subprocess,
)


def test_subprocess_server_serves_then_leaves_no_process() -> None:
    command = [sys.executable, "-m", "agentmars.server.web.ingest"]
    with serve_in_subprocess(command, env={TOKEN_ENV: "t0ken"}) as url:
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{url}/healthz").json() == {"status": "ok", "events": 0}
        unauthorised = httpx.post(f"{url}/v1/events", content=b"")
        assert unauthorised.status_code == 401
        port = int(url.rsplit(":", 1)[1])
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz")


def test_subprocess_server_comes_back_on_the_port_it_is_given() -> None:
    """A restarted server on the same port, where its clients expect it."""
    command = [sys.executable, "-m", "agentmars.server.web.ingest"]
    port = free_loopback_port()
    for _ in range(2):
        with serve_in_subprocess(command, env={TOKEN_ENV: "t0ken"}, port=port) as url:
            assert url == f"http://127.0.0.1:{port}"
            assert httpx.get(f"{url}/healthz").status_code == 200


def test_subprocess_that_cannot_start_reports_why() -> None:
    command = ["env", "-u", TOKEN_ENV, sys.executable, "-m", "agentmars.server.web.ingest"]
    with pytest.raises(RuntimeError, match=TOKEN_ENV), serve_in_subprocess(command):
        pass


def test_subprocess_output_goes_to_the_log_file_and_explains_a_failed_start(
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    script = "import sys; print('to stdout'); sys.exit('to stderr')"
    with (
        pytest.raises(RuntimeError, match="exited with 1: to stdout\nto stderr"),
        serve_in_subprocess([sys.executable, "-c", script], log_path=log),
    ):
        pass
    assert log.read_text() == "to stdout\nto stderr\n"


def test_group_members_include_this_process() -> None:
    assert os.getpid() in live_group_members(os.getpgrp())


def test_subprocess_children_that_outlive_the_server_are_stopped_too(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    # The server leaves a child behind that ignores SIGTERM (inherited SIG_IGN).
    script = f'(trap "" TERM; exec sleep 60) & echo $! > {child_pid_file}; exec "$0" "$@"'
    command = ["sh", "-c", script, sys.executable, "-m", "agentmars.server.web.ingest"]
    with serve_in_subprocess(command, env={TOKEN_ENV: "t0ken"}, stop_grace_s=1.0):
        group = os.getpgid(int(child_pid_file.read_text()))
        assert len(live_group_members(group)) == 2
    assert live_group_members(group) == []


def test_a_command_run_as_a_group_gives_its_output_and_status() -> None:
    done = run_as_group(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_a_command_past_its_timeout_is_stopped_with_its_children(tmp_path: Path) -> None:
    group_file = tmp_path / "group"
    # A child that ignores SIGTERM, and the leader waiting for it.
    script = f'echo $$ > {group_file}; (trap "" TERM; exec sleep 60) & wait'
    with pytest.raises(subprocess.TimeoutExpired):
        run_as_group(["sh", "-c", script], timeout_s=1.0)
    assert live_group_members(int(group_file.read_text())) == []


STOPS = (signal.SIGINT, signal.SIGTERM)


@pytest.mark.parametrize("stop", STOPS, ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_during_the_start_still_stops_the_server(
    stop: signal.Signals, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop that lands just after the fork (a CI run once left a starting vLLM
    behind this way) takes effect once the server is known, and stops its group."""
    started: list[subprocess.Popen[bytes]] = []

    def popen_then_signal(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))
        os.kill(os.getpid(), stop)  # real and synchronous: it arrives before we return
        return started[0]

    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)
    # The way `agentmars serve` stops on SIGTERM: it raises as SIGINT does. SIGINT's
    # own handler is set too: a process started in the background by a shell without
    # job control (`make test &`) starts with SIGINT ignored.
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in STOPS}
    try:
        command = [sys.executable, "-m", "agentmars.server.web.ingest"]
        with (
            pytest.raises(KeyboardInterrupt),
            serve_in_subprocess(command, env={TOKEN_ENV: "t0ken"}, startup_timeout_s=30),
        ):
            pytest.fail("the server must not be served after a stop")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert started and started[0].poll() is not None
    assert live_group_members(started[0].pid) == []
