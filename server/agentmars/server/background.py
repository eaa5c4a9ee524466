"""Run an ASGI app with uvicorn on a background thread (loopback, ephemeral port).

Used by the demo, the benchmarks and the tests to stand up real HTTP servers
in-process; ``serve_in_thread`` waits until the socket accepts and always stops
the server on exit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


@contextlib.contextmanager
def serve_in_thread(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 10.0
) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://host:port``)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{host}:{port}", daemon=True)
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
