"""Fan-out of events to sinks, isolated so a failing sink never reaches the agent."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Protocol, runtime_checkable

from agentmars.sdk.events import Event

log = logging.getLogger("agentmars.sdk")


@runtime_checkable
class Sink(Protocol):
    """Where events go. ``emit`` is called on the agent's hot path: it must be fast
    and should not block; ``close`` flushes and releases resources."""

    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


class Emitter:
    """Delivers each event to every sink; a sink that raises is counted, logged once
    and skipped, so instrumentation can never break or slow the agent's code."""

    def __init__(self, sinks: tuple[Sink, ...] | list[Sink] = ()) -> None:
        self._sinks: tuple[Sink, ...] = tuple(sinks)
        self._lock = threading.Lock()
        self._errors_lock = threading.Lock()
        self.sink_errors: Counter[str] = Counter()

    @property
    def sinks(self) -> tuple[Sink, ...]:
        return self._sinks

    def emit(self, event: Event) -> None:
        for sink in self._sinks:
            try:
                sink.emit(event)
            except Exception as exc:
                self._sink_failed(sink, exc)

    def _sink_failed(self, sink: Sink, exc: Exception) -> None:
        name = type(sink).__name__
        # Sinks fail on many threads at once: ``+= 1`` on a Counter is a read then a
        # write, so without the lock concurrent failures would be lost.
        with self._errors_lock:
            self.sink_errors[name] += 1
            first = self.sink_errors[name] == 1
        if first:
            log.warning("agentmars sink %s failed (further failures counted only): %r", name, exc)

    def flush(self) -> None:
        """Deliver what buffering sinks hold now (an ``HttpSink``'s queue): an agent
        flushes a tool's events before its next LLM call, so the gateway sees the tool
        end before the call that follows it."""
        for sink in self._sinks:
            flush = getattr(sink, "flush", None)
            if callable(flush):
                try:
                    flush()
                except Exception as exc:
                    self._sink_failed(sink, exc)

    def trace_headers(self, session_id: str, call_id: str | None = None) -> dict[str, str]:
        """Trace context headers (W3C ``traceparent``...) for a request made on behalf
        of the call (or, without one, the session), from the sinks that trace it (an
        ``OTelSink``): the receiver's spans then join the session's trace. Empty when
        no sink does."""
        headers: dict[str, str] = {}
        for sink in self._sinks:
            supplier = getattr(sink, "trace_headers", None)
            if callable(supplier):
                try:
                    headers.update(supplier(session_id, call_id))
                except Exception as exc:
                    self._sink_failed(sink, exc)
        return headers

    def add(self, sink: Sink) -> None:
        with self._lock:
            self._sinks = (*self._sinks, sink)

    def remove(self, sink: Sink) -> None:
        with self._lock:
            self._sinks = tuple(s for s in self._sinks if s is not sink)

    def close(self) -> None:
        """Close every sink (flushing buffered events) and forget them."""
        with self._lock:
            sinks, self._sinks = self._sinks, ()
        for sink in sinks:
            try:
                sink.close()
            except Exception as exc:
                self._sink_failed(sink, exc)


_default = Emitter()


def default_emitter() -> Emitter:
    """The process-wide emitter that sessions use unless given their own."""
    return _default


def configure(*sinks: Sink) -> Emitter:
    """Replace the process-wide sinks (closing the previous ones) and return the emitter."""
    _default.close()
    for sink in sinks:
        _default.add(sink)
    return _default
