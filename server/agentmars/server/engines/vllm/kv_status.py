"""The plugin's outbound side channel: the KV figures out of the engine process, a
``kv_stats`` event (free, pinned and used blocks, the total, the pins and their
releases) a few times a second, to a JSON file and/or a ZMQ PUB socket (vLLM's own
``SchedulerStats`` has fixed fields, so they need a side channel; notes/vllm-plugin.md
"Telemetry"); and, on the same socket under ``EVENT_TOPIC``, the events the engine
half publishes (``session_pause``...), for the gateway's admission half.

A daemon thread samples and writes at a fixed rate, so the figures stay fresh while
the engine is idle (vLLM does not call ``schedule()`` then). Sampling reads a few
integers the scheduler thread updates; the GIL makes each read whole. Events are
queued by the scheduler's thread and sent by this one (a ZMQ socket belongs to one
thread), which is woken for them; the ones queued as their making (``send_made``) are
made here too, off ``schedule()``'s path.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentmars.sdk.events import AnyEvent, Event, KVStats
from agentmars.sdk.wire import EVENT_TOPIC, KV_TOPIC

logger = logging.getLogger("vllm.agentmars.kv_status")


Snapshot = Callable[[], KVStats]


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
        self._events: queue.SimpleQueue[AnyEvent | Callable[[], AnyEvent]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentmars-kv-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            due = 0.0
            while not self._stopping.is_set():
                self._send_events()
                if time.monotonic() >= due:
                    self.publish_once()
                    due = time.monotonic() + self._interval_s
                self._wake.wait(max(due - time.monotonic(), 0.0))
                self._wake.clear()
            self._send_events()
            self.publish_once()
        finally:
            if self._socket is not None:
                self._socket.close(linger=0)

    def send_event(self, event: AnyEvent) -> None:
        """Queue an event for the socket (any thread; dropped without a socket)."""
        if self._socket is not None:
            self._events.put(event)
            self._wake.set()

    def send_made(self, make: Callable[[], AnyEvent]) -> None:
        """Queue the making of an event: this thread makes and sends it (dropped
        without a socket)."""
        if self._socket is not None:
            self._events.put(make)
            self._wake.set()

    def _send_events(self) -> None:
        while not self._events.empty():
            item = self._events.get_nowait()
            event = item if isinstance(item, Event) else item()
            assert self._socket is not None
            self._socket.send_multipart([EVENT_TOPIC, event.to_json().encode()])

    def publish_once(self) -> None:
        payload = self._snapshot().to_json()
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
            self._socket.send_multipart([KV_TOPIC, payload.encode()])

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Publish the last figures and end the thread."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=5.0)
