"""What the ``agentmars serve`` tests share."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_for(url: str, process: subprocess.Popen[str], timeout_s: float) -> None:
    """Wait until ``url`` answers 200; fail with the server's error output if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")
