"""A sandbox pool the runtime starts for itself: an event loop on a thread of its own,
the pool on it, its events posted to the gateway's ``/v1/events``.

A synchronous OpenHands program has no event loop for the pool; this gives it one, so
the drop-in is ``AgentmarsRuntime()`` and nothing else. It closes itself when the
program exits: before the interpreter shuts down its thread pools, which closing the
sandbox sessions still needs (``threading._register_atexit``, the hook
``concurrent.futures`` itself uses; plain ``atexit`` runs after that shutdown).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.sinks.http import HttpSink

T = TypeVar("T")


class HostedPool:
    """Started by ``start``; ``close`` (or the program's exit) runs ``before_close``,
    closes the pool, flushes the events and stops the thread."""

    def __init__(
        self, gateway: str, token: str, config: SandboxConfig, before_close: Callable[[], None]
    ) -> None:
        self.emitter = Emitter([HttpSink(f"{gateway}/v1/events", token=token)])
        self.pool = SandboxPool(config, emitter=self.emitter)
        self.loop = asyncio.new_event_loop()
        self._before_close = before_close
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="agentmars-runtime", daemon=True
        )
        self._closed = False

    def start(self) -> HostedPool:
        self._thread.start()
        try:
            self.call(self.pool.start())
        except BaseException:
            self._stop_loop()
            self.emitter.close()
            raise
        threading._register_atexit(self.close)  # type: ignore[attr-defined]
        return self

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._before_close()
            self.call(self.pool.close())
        finally:
            self._stop_loop()
            self.emitter.close()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
