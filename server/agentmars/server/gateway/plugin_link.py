"""The gateway's end of the side channel to the scheduler plugin inside vLLM
(notes/vllm-plugin.md "Telemetry"; the plugin's end is ``engines/vllm/kv_status`` and
``engines/vllm/hints``).

- Out, the hints: every event the gateway records, ingests or its admission half
  publishes (LLM call events, tool events, session start and end, ``window_update``...)
  goes to the plugin's PULL socket as its JSON line, so the engine half inside vLLM
  learns what the admission half learns and a session's end releases its pin. Events
  that came from the engine itself are not sent back. The PUSH socket queues up to
  ``HINT_QUEUE`` events while the engine is not (yet) listening; past that, events are
  dropped and counted rather than stall the gateway.
- In, on the plugin's PUB socket, read by a thread: the KV figures, a ``kv_stats``
  event 10 times a second (the link keeps the newest: it is the gateway's
  ``KVSource``), and the events the engine half publishes (``session_pause``...),
  handed to ``on_events`` (the gateway's hub) as they come.

ZMQ sockets are not thread-safe: the PUSH socket is used on the event loop only (the
app calls ``forward`` from its event handler there), the SUB socket by its thread only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from agentmars.sdk.events import AnyEvent, EventError, KVStats, decode_event
from agentmars.sdk.wire import EVENT_TOPIC, KV_TOPIC

log = logging.getLogger("agentmars.server")

HINT_QUEUE = 10_000
POLL_MS = 100


class PluginLink:
    """Hints out to ``hints_address``, KV figures in from ``kv_address`` (either may be
    None). ``start()`` opens the sockets, ``close()`` closes them."""

    def __init__(
        self,
        *,
        kv_address: str | None,
        hints_address: str | None,
        on_events: Callable[[Sequence[AnyEvent]], None] = lambda events: None,
    ) -> None:
        self.kv_address = kv_address
        self.hints_address = hints_address
        self._on_events = on_events
        self._kv: KVStats | None = None
        self.dropped_hints = 0
        self._context = zmq.Context()
        self._push: Any = None
        self._stopping = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        if self.hints_address:
            self._push = self._context.socket(zmq.PUSH)
            self._push.setsockopt(zmq.SNDHWM, HINT_QUEUE)
            self._push.setsockopt(zmq.LINGER, 0)
            self._push.connect(self.hints_address)
        if self.kv_address:
            subscriber = self._context.socket(zmq.SUB)
            subscriber.setsockopt(zmq.SUBSCRIBE, KV_TOPIC)
            subscriber.setsockopt(zmq.SUBSCRIBE, EVENT_TOPIC)
            subscriber.setsockopt(zmq.LINGER, 0)
            subscriber.connect(self.kv_address)
            self._reader = threading.Thread(
                target=self._read_kv, args=(subscriber,), name="agentmars-kv-link", daemon=True
            )
            self._reader.start()

    def close(self) -> None:
        self._stopping.set()
        if self._reader is not None:
            self._reader.join(timeout=5.0)
        if self._push is not None:
            self._push.close()
        self._context.term()

    # --- out: hints ----------------------------------------------------------------------

    def forward(self, events: Sequence[AnyEvent]) -> None:
        """Send ``events`` to the plugin, except the engine's own (never blocks)."""
        if self._push is None:
            return
        for event in events:
            if event.source == "engine" or isinstance(event, KVStats):
                continue
            try:
                self._push.send(event.to_json().encode(), zmq.NOBLOCK)
            except zmq.Again:
                self.dropped_hints += 1

    # --- in: KV figures and the engine half's events -------------------------------------

    def kv_stats(self) -> KVStats | None:
        return self._kv

    def _read_kv(self, subscriber: Any) -> None:
        try:
            while not self._stopping.is_set():
                if subscriber.poll(POLL_MS):
                    topic, payload = subscriber.recv_multipart()
                    self._take(topic, payload)
        finally:
            subscriber.close()

    def _take(self, topic: bytes, payload: bytes) -> None:
        try:
            event = decode_event(payload)
        except EventError as error:
            log.warning("agentmars: ignored a plugin message that is no event: %s", error)
            return
        if topic == KV_TOPIC and isinstance(event, KVStats):
            self._kv = event
        elif topic == EVENT_TOPIC:
            self._on_events([event])
