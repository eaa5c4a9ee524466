"""The side channel's inbound half: events of the information stream the gateway sends
into the engine process (tool enqueue / start / end, LLM call events, session ends), on
a ZMQ PULL socket the plugin binds (``AGENTMARS_HINTS_ADDR``).

A daemon thread receives and decodes them into a queue; the scheduler takes them out
at the top of its next ``schedule()`` (``drain``), or the idle ticker does for a policy
with a ``tick`` (under the scheduler's lock), so the policy and the pins are only ever
touched under that lock. Without a tick an idle engine does not schedule, so the events
then wait for the next step, which is before anything is allocated again.
Imports no vLLM (ZMQ is vLLM's dependency, and the gateway's).
"""

from __future__ import annotations

import logging
import queue
import threading

from agentmars.sdk.events import AnyEvent, EventError, decode_event
from agentmars.server.engines.vllm.kv_status import bind_socket

logger = logging.getLogger("vllm.agentmars.hints")

POLL_MS = 100
"""How long the receiving thread waits for a message before it checks for a stop."""


class HintInbox:
    """Events from the gateway, decoded and queued for the scheduler."""

    def __init__(self, address: str) -> None:
        # Bound here, so a bad or busy address stops the engine's start with ZMQ's
        # error; from then on only the thread uses the socket.
        self._socket = bind_socket("PULL", address)
        self._events: queue.SimpleQueue[AnyEvent] = queue.SimpleQueue()
        self.empty = self._events.empty
        """Whether no event waits (the queue's own check, in C: asked at every step)."""
        self.rejected = 0
        """Messages that were not events (logged, then dropped)."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentmars-hints", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._socket.poll(POLL_MS):
                    self._take(self._socket.recv())
        finally:
            self._socket.close(linger=0)

    def _take(self, message: bytes) -> None:
        try:
            self._events.put(decode_event(message))
        except EventError as error:
            self.rejected += 1
            logger.warning("agentmars: dropped a side-channel message that is no event: %s", error)

    def drain(self) -> list[AnyEvent]:
        """The events received since the last call, in arrival order."""
        # One reader (the scheduler): checking empty() first spares an exception.
        events = []
        while not self._events.empty():
            events.append(self._events.get_nowait())
        return events

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5.0)
