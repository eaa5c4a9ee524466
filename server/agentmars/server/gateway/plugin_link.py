"""The gateway's end of the side channel to the scheduler plugin inside vLLM
(notes/vllm-plugin.md "Telemetry"; the plugin's end is ``engines/vllm/kv_status`` and
``engines/vllm/hints``).

- Out, the hints: every session event the gateway records or ingests (LLM call events,
  tool enqueue / start / end, session start and end) goes to the plugin's PULL socket
  as its JSON line, so the policy inside vLLM learns what the gateway's learns and a
  session's end releases its pin. The PUSH socket queues up to ``HINT_QUEUE`` events
  while the engine is not (yet) listening; past that, events are dropped and counted
  rather than stall the gateway.
- In, the KV figures: a thread reads the plugin's PUB socket (10 per second) and keeps
  the newest figures; the link is the gateway view's ``KVSource``.

ZMQ sockets are not thread-safe: the PUSH socket is used on the event loop only (the
app calls ``forward`` from its event handler there), the SUB socket by its thread only.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import zmq

from agentmars.sdk.events import AnyEvent, SessionEvent
from agentmars.server.engines.vllm.kv_status import ZMQ_TOPIC
from agentmars.server.gateway.telemetry import KVFigures

log = logging.getLogger("agentmars.server")

HINT_QUEUE = 10_000
POLL_MS = 100


class PluginLink:
    """Hints out to ``hints_address``, KV figures in from ``kv_address`` (either may be
    None). ``start()`` opens the sockets, ``close()`` closes them."""

    def __init__(self, *, kv_address: str | None, hints_address: str | None) -> None:
        self.kv_address = kv_address
        self.hints_address = hints_address
        self._figures = KVFigures()
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
            subscriber.setsockopt(zmq.SUBSCRIBE, ZMQ_TOPIC)
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
        """Send the session events among ``events`` to the plugin (never blocks)."""
        if self._push is None:
            return
        for event in events:
            if not isinstance(event, SessionEvent):
                continue
            try:
                self._push.send(event.to_json().encode(), zmq.NOBLOCK)
            except zmq.Again:
                self.dropped_hints += 1

    # --- in: KV figures ------------------------------------------------------------------

    def kv_figures(self) -> KVFigures:
        return self._figures

    def _read_kv(self, subscriber: Any) -> None:
        try:
            while not self._stopping.is_set():
                if subscriber.poll(POLL_MS):
                    _, payload = subscriber.recv_multipart()
                    self._take_kv(payload)
        finally:
            subscriber.close()

    def _take_kv(self, payload: bytes) -> None:
        try:
            figures = json.loads(payload)
            self._figures = KVFigures(
                total_blocks=int(figures["total"]),
                free_blocks=int(figures["free"]),
                used_blocks=int(figures["used"]),
                pinned_blocks=int(figures["pinned"]),
                pins=int(figures["pins"]),
                released={str(k): int(v) for k, v in figures.get("released", {}).items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("agentmars: ignored KV figures the plugin link could not read: %r", error)
