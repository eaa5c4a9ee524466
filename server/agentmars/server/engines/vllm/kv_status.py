"""The plugin's KV figures out of the engine process: free, pinned and used blocks, the
total and the number of pins, a few times a second, to a JSON file and/or a ZMQ PUB
socket (vLLM's own ``SchedulerStats`` has fixed fields, so they need a side channel;
notes/vllm-plugin.md "Telemetry").

A daemon thread samples and writes at a fixed rate, so the figures stay fresh while
the engine is idle (vLLM does not call ``schedule()`` then). Sampling reads a few
integers the scheduler thread updates; the GIL makes each read whole.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("vllm.agentmars.kv_status")

ZMQ_TOPIC = b"agentmars.kv"
"""The topic frame of each ZMQ message (the second frame is the JSON figures)."""

Snapshot = Callable[[], dict[str, Any]]


def bind_socket(kind: str, address: str) -> Any:
    """A ZMQ socket of ``kind`` (``"PUB"``, ``"PULL"``) bound to ``address``."""
    import zmq  # vLLM's dependency: the engine has it

    socket: Any = zmq.Context.instance().socket(getattr(zmq, kind))
    socket.bind(address)
    return socket


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path``'s content in one step, so a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(path)


class KVStatusPublisher:
    """Publishes ``snapshot()`` every ``1 / hz`` seconds until ``stop()``."""

    def __init__(
        self, snapshot: Snapshot, *, path: str | None, address: str | None, hz: float
    ) -> None:
        self._snapshot = snapshot
        self._path = Path(path) if path else None
        # Bound here, so a bad or busy address stops the engine's start with vLLM's
        # error; from then on only the thread uses the socket (ZMQ allows handing a
        # socket to another thread once).
        self._socket = bind_socket("PUB", address) if address else None
        self._interval_s = 1.0 / hz
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentmars-kv-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                self.publish_once()
                if self._stopping.wait(self._interval_s):
                    break
            self.publish_once()
        finally:
            if self._socket is not None:
                self._socket.close(linger=0)

    def publish_once(self) -> None:
        figures = {"time": time.time(), **self._snapshot()}
        payload = json.dumps(figures)
        if self._path is not None:
            try:
                write_atomically(self._path, payload)
            except OSError as error:
                # Keep publishing on the socket; say once why the file stays stale.
                logger.warning(
                    "agentmars: cannot write %s (%s); stopped writing it", self._path, error
                )
                self._path = None
        if self._socket is not None:
            self._socket.send_multipart([ZMQ_TOPIC, payload.encode()])

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Publish the last figures and end the thread."""
        self._stopping.set()
        self._thread.join(timeout=5.0)
