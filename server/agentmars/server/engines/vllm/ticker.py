"""A policy's ``tick`` while the engine idles (the ``tick`` capability).

While vLLM has work it calls ``schedule()`` continuously and the plugin runs a due
tick at its top. An idle engine calls nothing, so this daemon thread wakes every
``interval_s`` and calls ``tick_if_idle`` (which takes the scheduler's lock and ticks
only if nothing is running or waiting): a pin's TTL and a paused session's resume
must not wait for the next request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class IdleTicker:
    def __init__(self, interval_s: float, tick_if_idle: Callable[[], None]) -> None:
        self._interval_s = interval_s
        self._tick_if_idle = tick_if_idle
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentmars-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._tick_if_idle()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5.0)
