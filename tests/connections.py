"""A server's accepted connections, looked at from inside the process that serves them:
run a command's own serving function on a thread, then read the socket options of the
connections it accepted."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from agentmars.sdk import http_guard

if TYPE_CHECKING:
    import uvicorn


@contextlib.contextmanager
def serving_on_thread(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, serve: Callable[[], None]
) -> Iterator[uvicorn.Server]:
    """Run ``serve`` (a function that serves until its ``guarded_server`` is told to
    exit, as ``run_gateway`` does) on a thread; yields the server once it serves, and
    stops it after. The server ``serve`` builds is kept, to be stopped (signals reach
    the main thread only): ``guarded_server`` is wrapped where it is defined and in
    ``module``, if ``serve``'s module imported it by name."""
    built: list[uvicorn.Server] = []
    guarded_server = http_guard.guarded_server

    def keeping(*args: Any, **kwargs: Any) -> uvicorn.Server:
        built.append(guarded_server(*args, **kwargs))
        return built[-1]

    for place in (http_guard, module):
        if hasattr(place, "guarded_server"):
            monkeypatch.setattr(place, "guarded_server", keeping)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (built and built[0].started):
        assert thread.is_alive(), "the server stopped before it served"
        assert time.monotonic() < deadline, "the server did not start within 30 s"
        time.sleep(0.01)
    try:
        yield built[0]
    finally:
        built[0].should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop within 30 s"


def accepted_nodelay(port: int) -> list[bool]:
    """TCP_NODELAY of each connection this process accepted on ``port`` (its open TCP
    sockets whose local port is ``port`` and which have a peer; the listener has none,
    the connections this process opened to ``port`` have it as their peer's)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            copy = os.dup(int(fd))
        except OSError:  # closed meanwhile
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:  # not a socket
            os.close(copy)
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if sock.type != socket.SOCK_STREAM or sock.getsockname()[1] != port:
                continue
            try:
                sock.getpeername()
            except OSError:  # the listener
                continue
            found.append(bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
    return found
