"""Stand up real HTTP servers on loopback for the demo, the benchmarks and the tests.

``serve_in_thread`` runs an ASGI app with uvicorn on a background thread (a
``guarded_server``: slow clients time out, ``agentmars.sdk.http_guard``);
``serve_in_subprocess`` runs a server command in its own process group (its
own GIL and core). Both wait until the server answers and always stop it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentmars.sdk.http_guard import guarded_server


@contextlib.contextmanager
def serve_in_thread(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    startup_timeout_s: float = 10.0,
    listener: socket.socket | None = None,
    **server_config: Any,
) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://host:port``).
    With ``listener`` (``listening_socket``) it serves on that socket, as ``agentmars
    serve`` does, and ``host`` and ``port`` are the listener's. ``server_config`` goes
    to ``guarded_server`` (e.g. ``header_timeout_s``)."""
    server_config = {"access_log": False, "lifespan": "on", **server_config}
    if listener is not None:
        host, port = listener.getsockname()[:2]
    server = guarded_server(app, host=host, port=port, **server_config)
    sockets = None if listener is None else [listener]
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": sockets}, name=f"uvicorn-{host}:{port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=5)
            raise RuntimeError(f"server on {host}:{port} did not start")
        time.sleep(0.005)
    bound_port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (an address, or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CannotListen(OSError):
    """A server could not listen where it was asked to; the message says why."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, for a server to take over
    (uvicorn's ``sockets=``). Binding before anything slow starts (vLLM takes a minute)
    refuses a busy port at once and holds the port meanwhile, so nothing started later
    (vLLM's own ports are any free ones) can take it. Binds as uvicorn does
    (``SO_REUSEADDR``), so a port left in TIME_WAIT counts as free."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as error:
        raise CannotListen(f"cannot resolve {host!r} ({error.strerror})") from None
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(2048)  # uvicorn's default backlog
    except OSError as error:
        listener.close()
        raise CannotListen(error.strerror or str(error)) from None
    return listener


def free_loopback_port() -> int:
    """A port nothing listens on right now (the caller binds it soon after)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class ServerCommand:
    """A server process to run: ``argv`` plus ``--port N`` (``port``, else a free one),
    healthy once ``health_path`` answers 200; ``env`` on top of this process's; its
    output to ``log_path`` (see ``serve_in_subprocess``)."""

    argv: list[str]
    env: dict[str, str] | None = None
    health_path: str = "/healthz"
    log_path: Path | None = None
    port: int | None = None


@contextlib.contextmanager
def serve_in_subprocess(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    health_path: str = "/healthz",
    startup_timeout_s: float = 30.0,
    log_path: Path | None = None,
    stop_grace_s: float = 5.0,
    port: int | None = None,
) -> Iterator[str]:
    """Run a server process (``argv`` plus ``--port N``: ``port``, else a free one) in its
    own process group until the block ends; yields its base URL once ``health_path``
    answers 200. On exit the whole group gets SIGTERM, then SIGKILL if it lingers
    ``stop_grace_s``, so nothing is orphaned. With ``log_path`` the server's stdout and
    stderr go to that file (a chatty server such as vLLM would fill an unread pipe and
    block); else stdout is dropped and stderr piped, read only to report a failed
    start."""
    command = ServerCommand(argv, env, health_path, log_path, port)
    with serve_in_subprocesses([command], startup_timeout_s, stop_grace_s) as (url,):
        yield url


@contextlib.contextmanager
def serve_in_subprocesses(
    commands: Sequence[ServerCommand], startup_timeout_s: float = 30.0, stop_grace_s: float = 5.0
) -> Iterator[list[str]]:
    """Run several servers as ``serve_in_subprocess`` runs one, all started before any
    is waited for (so N slow starts take the time of one); yields their base URLs, in
    order, once each is healthy. If one fails to start, all are stopped."""
    with contextlib.ExitStack() as stack:
        started = [_start(stack, command, stop_grace_s) for command in commands]
        for command, (process, url) in zip(commands, started, strict=True):
            _wait_healthy(process, url + command.health_path, startup_timeout_s, command.log_path)
        yield [url for _, url in started]


def _start(
    stack: contextlib.ExitStack, command: ServerCommand, stop_grace_s: float
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``command``'s process group, stopped when ``stack`` closes."""
    port = free_loopback_port() if command.port is None else command.port
    log = stack.enter_context(command.log_path.open("wb")) if command.log_path else None
    with _stop_signals_held():
        process = subprocess.Popen(
            [*command.argv, "--port", str(port)],
            env={**os.environ, **(command.env or {})},
            start_new_session=True,
            stdout=log or subprocess.DEVNULL,
            stderr=log or subprocess.PIPE,
        )
        stack.callback(_stop_group, process, stop_grace_s)
    return process, f"http://127.0.0.1:{port}"


def run_as_group(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end in a process group of its own, its output captured as
    text. If this returns early (its timeout: ``TimeoutExpired``; a stop signal; any
    error), the whole group is stopped first, as a server's is: a measurement left
    running would go on loading the machine the next one runs on."""
    with _stop_signals_held():
        process = subprocess.Popen(
            list(argv), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except BaseException:
        _stop_group(process)
        raise
    return subprocess.CompletedProcess(
        process.args, process.returncode, stdout.decode(errors="replace"),
        stderr.decode(errors="replace"),
    )  # fmt: skip


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block take effect at its end.

    A stop signal raises (KeyboardInterrupt) wherever the main thread is: inside
    ``Popen`` after the fork it would leave a child nobody knows of, and inside
    ``_stop_group`` a group half stopped. Signals reach Python's main thread only, so
    elsewhere there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {stop: signal.getsignal(stop) for stop in STOP_SIGNALS}
    for stop in STOP_SIGNALS:
        signal.signal(stop, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)
        if arrived:  # one stop is enough; it takes effect as it would have
            handler = previous[signal.Signals(arrived[0])]
            if callable(handler):
                handler(arrived[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(arrived[0])


def _wait_healthy(
    process: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: Path | None
) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                error = _error_output(process, log_path)
                raise RuntimeError(f"server exited with {process.returncode}: {error[-2000:]}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise RuntimeError(f"server did not answer {url} within {timeout_s:.0f} s")


def _error_output(process: subprocess.Popen[bytes], log_path: Path | None) -> str:
    if log_path is not None:
        return log_path.read_text(errors="replace")
    return process.stderr.read().decode(errors="replace") if process.stderr else ""


def live_group_members(pgid: int) -> list[int]:
    """Pids of the running processes of process group ``pgid`` (zombies excluded), from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # After "(command name)": state, ppid, pgrp, ...
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process ended while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


_KILL_WAIT_S = 5.0


def _stop_group(process: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the group, wait for every member (not only the leader: children may
    outlive it, e.g. a resource tracker cleaning up), then SIGKILL whatever is left.
    A stop signal meanwhile takes effect once the group is stopped."""
    with _stop_signals_held():
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
        while live_group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.poll() is None or live_group_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            # SIGKILL is delivered asynchronously: an orphaned member may still be
            # running for a moment after killpg returns, so wait until none is.
            kill_deadline = time.monotonic() + _KILL_WAIT_S
            while live_group_members(process.pid) and time.monotonic() < kill_deadline:
                time.sleep(0.01)
        if process.stderr:
            process.stderr.close()
