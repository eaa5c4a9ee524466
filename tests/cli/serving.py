"""What the tests of commands that start servers (``serve``, the vLLM benches) share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from agentmars.server.web.serving import free_loopback_port

TWIN_TOKEN = "test-token"


@dataclass(frozen=True)
class Twin:
    base: str
    """The gateway's URL."""
    engine: str
    """The engine's own URL, behind the gateway."""
    token: str = TWIN_TOKEN
    pid: int = 0
    """The process serving both (``agentmars serve``)."""


@contextlib.contextmanager
def served_twin(env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> Iterator[Twin]:
    """``agentmars serve --engine sim --profile cpu-tiny`` on a free loopback port, as a
    user starts it (``env``: variables on top of this process's; ``args``: more
    options); stopped (SIGTERM) and checked to exit cleanly after."""
    port = free_loopback_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentmars.cli.main", "serve", "--engine", "sim",
         "--profile", "cpu-tiny", "--port", str(port), *args],
        env={**os.environ, "AGENTMARS_GATEWAY_TOKEN": TWIN_TOKEN, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(base + "/healthz", process, timeout_s=30)
        assert process.stdout is not None
        # "agentmars: gateway on ..., simulated engine (...) <engine URL>"
        yield Twin(base, engine=process.stdout.readline().split()[-1], pid=process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""


def wait_for(
    url: str,
    process: subprocess.Popen[str],
    timeout_s: float,
    stderr: Callable[[], str] | None = None,
) -> None:
    """Wait until ``url`` answers 200; fail with the server's error output if it exits
    (``stderr``: where to read it when the process's goes to a file)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = stderr() if stderr else process.stderr.read() if process.stderr else ""
            raise AssertionError(f"exited with {process.returncode}: {output[-3000:]}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


def vllm_children(process: subprocess.Popen[Any]) -> list[psutil.Process]:
    """The vLLM processes ``process`` has started."""
    children = psutil.Process(process.pid).children(recursive=True)
    return [p for p in children if "vllm" in " ".join(p.cmdline())]


def sigterm_once_vllm_starts(
    process: subprocess.Popen[Any], while_starting: Callable[[], None] | None = None
) -> None:
    """Send SIGTERM as soon as ``process`` has started vLLM (after ``while_starting``,
    a check made then); then nothing it started may be left running."""
    deadline = time.monotonic() + 120
    while not (started := vllm_children(process)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert started, "vLLM was never started"
    if while_starting is not None:
        while_starting()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [], f"left running: {[p.pid for p in alive]}"
