"""``agentmars sandbox serve`` as a process of its own, as it is run: what it does when
stopped mid-call, with its port taken, and how much memory floods of output cost it
(issue 38)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from agentmars.sandbox.client import SandboxClient, SandboxClientError
from agentmars.sandbox.spec import MAX_OUTPUT_CAP_BYTES, TRUNCATION_MARKER, ExecResult, ExecSpec
from agentmars.server.web.serving import free_loopback_port, live_group_members

TOKEN = "sandbox-cli-test-token"
PY = sys.executable
SERVE = [PY, "-m", "agentmars.cli.main", "sandbox", "serve"]
ENV = {**os.environ, "AGENTMARS_SANDBOX_TOKEN": TOKEN}
STOP_S = 10.0
"""How long the service may take to exit once told to stop: it kills its tools at once
(before the fix it waited for them, here 60 s)."""
MiB = 1024 * 1024


@contextlib.contextmanager
def sandbox_service(tmp_path: Path, *options: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The service in its own process group, once it answers ``/healthz``; at the end,
    if it is still running, stopped (SIGTERM: its workspaces are unmounted), else
    killed with its group."""
    port = free_loopback_port()
    argv = [*SERVE, "--workspace-root", str(tmp_path / "ws"), "--port", str(port), *options]
    with (tmp_path / "service.log").open("wb") as log:
        process = subprocess.Popen(argv, env=ENV, start_new_session=True, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthy(url):
            assert process.poll() is None, (tmp_path / "service.log").read_text()
            assert time.monotonic() < deadline, "the service did not start within 60 s"
            time.sleep(0.05)
        yield process, url
    finally:
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_S)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _processes_with(marker: str) -> dict[int, list[bytes]]:
    """The live processes whose command line holds ``marker``, with their argv."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z" and any(marker.encode() in arg for arg in argv):
            found[int(pid)] = argv
    return found


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_sigterm_kills_the_running_tools_and_the_service_exits_at_once(tmp_path: Path) -> None:
    """Two calls run tools that ignore SIGTERM, one answered whole and one streamed;
    SIGTERM to the service ends both calls ``cancelled`` (each caller gets that answer),
    leaves no process of either tool, and the service exits within seconds."""
    marker = f"agentmars-stop-{uuid.uuid4().hex}"
    stubborn = (
        f"import signal, time  # {marker}\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True: time.sleep(0.01)"
    )
    spec = ExecSpec(command=[PY, "-c", stubborn], timeout_s=60)
    answers: dict[str, ExecResult | BaseException] = {}
    with (
        sandbox_service(tmp_path, "--slots", "2") as (service, url),
        SandboxClient(url, TOKEN) as sandbox,
    ):
        sandbox.open_session("s1")

        def call(how: str) -> None:
            try:
                if how == "streamed":
                    answers[how] = sandbox.run_streaming("s1", spec, lambda stream, text: None)
                else:
                    answers[how] = sandbox.run("s1", spec)
            except SandboxClientError as exc:
                answers[how] = exc

        callers = [threading.Thread(target=call, args=(how,)) for how in ("whole", "streamed")]
        for caller in callers:
            caller.start()

        def tools() -> list[int]:
            return [pid for pid, argv in _processes_with(marker).items() if argv[0] == PY.encode()]

        assert _wait_until(lambda: len(tools()) == 2, 30), "the two tools did not start"
        # Every process of both calls (bubblewrap, the sandbox's init, the tool) and
        # their process groups.
        pids = set(_processes_with(marker))
        groups = {os.getpgid(pid) for pid in pids}
        stopped = time.monotonic()
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the service did not exit within {STOP_S:g} s of SIGTERM")
        took_s = time.monotonic() - stopped
        for caller in callers:
            caller.join(timeout=10)
    assert service.returncode == 0, (tmp_path / "service.log").read_text()
    assert took_s < STOP_S
    for how in ("whole", "streamed"):
        answer = answers[how]
        assert isinstance(answer, ExecResult), (how, answer)
        assert answer.status == "cancelled", (how, answer)
        assert answer.detail == "the sandbox backend was closed", (how, answer)
    assert _wait_until(lambda: not set(_processes_with(marker)) & pids, 5)
    assert all(live_group_members(group) == [] for group in groups)


def _memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak resident size since the last reset) of ``pid``, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024  # kB
    return fields


def test_two_floods_of_output_cost_the_service_a_bounded_memory(tmp_path: Path) -> None:
    """Two tools write 400 MB of NUL bytes each at once, under the largest cap; one call
    answered whole, one streamed. Each result keeps the cap and says it was truncated.

    The bound on the service's peak RSS growth: each call holds at most its kept bytes
    and their text (2 x cap: a NUL is one byte in both), the streamed one also its
    chunks not yet sent (1 x cap), and 32 MiB for the rest (the pieces of an answer
    being sent, the chunks being read, the allocator's slack): 5 x cap + 32 MiB = 112
    MiB. Before the answers were sent in pieces it grew by 240 MiB (a result as one
    JSON string: 6 bytes per NUL)."""
    flood_bytes = 400_000_000
    cap = MAX_OUTPUT_CAP_BYTES
    spec = ExecSpec(
        command=["head", "-c", str(flood_bytes), "/dev/zero"], output_cap_bytes=cap, timeout_s=120
    )
    results: dict[str, ExecResult] = {}
    streamed: list[int] = []
    with (
        sandbox_service(tmp_path, "--slots", "2") as (service, url),
        SandboxClient(url, TOKEN, timeout_s=60) as sandbox,
    ):
        sandbox.open_session("s1")
        sandbox.open_session("s2")
        before = _memory_mb(service.pid)["VmRSS"]
        Path(f"/proc/{service.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS

        def whole() -> None:
            results["whole"] = sandbox.run("s1", spec)

        def streaming() -> None:
            results["streamed"] = sandbox.run_streaming(
                "s2", spec, lambda stream, text: streamed.append(len(text))
            )

        callers = [threading.Thread(target=whole), threading.Thread(target=streaming)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(timeout=120)
        growth_mib = _memory_mb(service.pid)["VmHWM"] - before
    expected = "\0" * cap + TRUNCATION_MARKER.format(dropped=flood_bytes - cap)
    for how in ("whole", "streamed"):
        result = results[how]
        assert (result.status, result.stdout_truncated) == ("ok", True), result.detail
        assert result.stdout == expected
    assert sum(streamed) == len(expected)
    assert growth_mib < 5 * cap / MiB + 32, f"the service grew by {growth_mib:.0f} MiB"


def test_a_busy_port_is_refused_before_the_banner(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [*SERVE, "--workspace-root", str(tmp_path / "ws"), "--port", str(port)]
        done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"error: the sandbox service cannot listen on 127.0.0.1:{port}: " in done.stderr
    assert "Address already in use" in done.stderr
    assert "sandbox service on" not in done.stderr
