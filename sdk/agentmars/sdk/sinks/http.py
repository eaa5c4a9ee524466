"""HTTP sink: batches events on a background thread and POSTs them as JSONL to a collector.

``emit`` only appends to a bounded in-memory queue, so the agent never waits on
the network; serialization, batching, retries and backoff all happen on one
daemon thread. When the collector is slow or down the queue fills and further
events are counted as dropped instead of growing memory without bound.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from agentmars.sdk.auth import check_token
from agentmars.sdk.events import Event, encode_jsonl

log = logging.getLogger("agentmars.sdk")

MAX_BACKOFF_S = 2.0
"""Ceiling of one retry pause, so a long outage never parks the thread for minutes."""

JSONL_CONTENT_TYPE = "application/x-ndjson"


@dataclass(frozen=True)
class HttpSinkStats:
    """Counters of an ``HttpSink``: every emitted event ends up in exactly one of
    ``sent``, ``dropped`` or (until it is resolved) ``queued``."""

    sent: int
    dropped: int
    retries: int
    failed_batches: int
    queued: int


class _Outcome(enum.Enum):
    DELIVERED = "delivered"
    RETRYABLE = "retryable"
    REJECTED = "rejected"
    EXPIRED = "expired"
    """close()'s deadline passed before the batch could be sent."""


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"collector url must start with http:// or https://, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"collector url {url!r} has no host")
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ValueError(f"collector url {url!r} has an invalid port: {exc}") from None
    return url


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: float, *, allow_zero: bool) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if isinstance(value, bool) or not ok or math.isinf(value):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


def _classify(status_code: int) -> _Outcome:
    if 200 <= status_code < 300:
        return _Outcome.DELIVERED
    if status_code == 429 or status_code >= 500:
        return _Outcome.RETRYABLE
    return _Outcome.REJECTED


def backoff_delay(attempt: int, base_s: float) -> float:
    """Pause before retry ``attempt`` (1-based): exponential, capped, with "equal
    jitter" (half fixed, half random) so many sinks recovering from one outage
    do not retry in lockstep, yet no pause collapses to zero."""
    ceiling = min(MAX_BACKOFF_S, base_s * 2.0 ** (attempt - 1))
    return ceiling / 2 + random.uniform(0.0, ceiling / 2)


class HttpSink:
    """Sends events to ``url`` in JSONL batches from a background thread.

    ``emit`` never blocks and never raises: when ``max_queue`` events are waiting
    it drops the event and counts it. A batch goes out when ``batch_size`` events
    are queued or ``flush_interval_s`` after the first one was. Connection errors,
    timeouts, 5xx and 429 are retried ``max_retries`` times with exponential
    backoff; a batch that still fails, or that the collector rejects with another
    4xx, is counted as dropped. A ``client`` passed in is used as is and left
    open on ``close``; otherwise the sink owns (and closes) its own.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        batch_size: int = 1000,
        max_queue: int = 100_000,
        flush_interval_s: float = 0.05,
        timeout_s: float = 2.0,
        max_retries: int = 3,
        backoff_s: float = 0.05,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = _check_url(url)
        _check_count("batch_size", batch_size, 1)
        _check_count("max_queue", max_queue, 1)
        _check_count("max_retries", max_retries, 0)
        _check_seconds("flush_interval_s", flush_interval_s, allow_zero=False)
        _check_seconds("timeout_s", timeout_s, allow_zero=False)
        _check_seconds("backoff_s", backoff_s, allow_zero=True)
        self._batch_size = batch_size
        self._max_queue = max_queue
        self._flush_interval_s = flush_interval_s
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._headers = {"content-type": JSONL_CONTENT_TYPE}
        if token is not None:
            check_token(token)
            self._headers["authorization"] = f"Bearer {token}"
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout_s)

        self._queue: deque[Event] = deque()
        self._lock = threading.Lock()
        # Two conditions on one lock: emit/flush/close wake the worker through
        # _work, the worker wakes flush() through _idle; sharing one condition
        # would let an emit's notify land on a flush waiter instead.
        self._work = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._flush_waiters = 0
        self._closed = False
        self._deadline = math.inf
        self._closing = threading.Event()
        self._warned: set[str] = set()

        self._sent = 0
        self._dropped = 0
        self._retries = 0
        self._failed_batches = 0

        self._thread = threading.Thread(target=self._run, name="agentmars-http-sink", daemon=True)
        self._thread.start()

    # --- caller side ------------------------------------------------------------

    def emit(self, event: Event) -> None:
        with self._lock:
            if self._closed or len(self._queue) >= self._max_queue:
                self._dropped += 1
                return
            self._queue.append(event)
            queued = len(self._queue)
            # The worker sleeps while the queue is empty and otherwise only until
            # the flush interval ends, so it needs a nudge exactly when the first
            # event arrives and when a batch fills.
            if queued == 1 or queued == self._batch_size:
                self._work.notify()

    def stats(self) -> HttpSinkStats:
        with self._lock:
            return HttpSinkStats(
                sent=self._sent,
                dropped=self._dropped,
                retries=self._retries,
                failed_batches=self._failed_batches,
                queued=len(self._queue) + self._in_flight,
            )

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send everything queued now; True once nothing is left, False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._flush_waiters += 1
            self._work.notify()
            try:
                while self._queue or self._in_flight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._thread.is_alive():
                        return False
                    self._idle.wait(remaining)
                return True
            finally:
                self._flush_waiters -= 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued within ``timeout_s`` (the rest counts as dropped),
        stop the thread and close the owned client. Later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._deadline = time.monotonic() + timeout_s
            self._work.notify()
        self._closing.set()
        # The worker bounds its own requests and pauses by the deadline; the
        # extra second only covers a request that overruns its timeout.
        self._thread.join(timeout_s + 1.0)
        with self._lock:
            self._drop_queued()
        if self._owns_client:
            self._client.close()

    # --- worker side --------------------------------------------------------------

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            self._deliver(batch)

    def _next_batch(self) -> list[Event] | None:
        """Wait until a batch is due and take it; None when the sink is closed and done."""
        with self._lock:
            due = time.monotonic() + self._flush_interval_s
            while True:
                if self._closed and (not self._queue or time.monotonic() >= self._deadline):
                    self._drop_queued()
                    return None
                if not self._queue:
                    self._work.wait()
                    # The flush interval counts from the first event of a batch.
                    due = time.monotonic() + self._flush_interval_s
                    continue
                if self._batch_due(due):
                    return self._take_batch()
                self._work.wait(max(0.0, due - time.monotonic()))

    def _batch_due(self, due: float) -> bool:
        return (
            len(self._queue) >= self._batch_size
            or self._flush_waiters > 0
            or self._closed
            or time.monotonic() >= due
        )

    def _take_batch(self) -> list[Event]:
        size = min(self._batch_size, len(self._queue))
        batch = [self._queue.popleft() for _ in range(size)]
        self._in_flight = size
        return batch

    def _drop_queued(self) -> None:
        self._dropped += len(self._queue)
        self._queue.clear()
        self._idle.notify_all()

    def _deliver(self, batch: list[Event]) -> None:
        try:
            delivered = self._post_with_retries(encode_jsonl(batch).encode())
        except Exception as exc:  # the worker must outlive any one batch
            self._warn_once("crash", "agentmars HttpSink failed to send a batch: %r", exc)
            delivered = False
        with self._lock:
            self._in_flight = 0
            if delivered:
                self._sent += len(batch)
            else:
                self._dropped += len(batch)
                self._failed_batches += 1
            self._idle.notify_all()

    def _post_with_retries(self, body: bytes) -> bool:
        for attempt in range(self._max_retries + 1):
            if attempt:
                with self._lock:
                    self._retries += 1
                if not self._pause(backoff_delay(attempt, self._backoff_s)):
                    return False
            outcome = self._post_once(body)
            if outcome is not _Outcome.RETRYABLE:
                return outcome is _Outcome.DELIVERED
        self._warn_once(
            "gave_up",
            "agentmars HttpSink dropped a batch after %d retries to %s",
            self._max_retries,
            self.url,
        )
        return False

    def _post_once(self, body: bytes) -> _Outcome:
        timeout = min(self._timeout_s, self._deadline - time.monotonic())
        if timeout <= 0:
            return _Outcome.EXPIRED
        try:
            response = self._client.post(
                self.url, content=body, headers=self._headers, timeout=timeout
            )
        except httpx.TransportError:
            return _Outcome.RETRYABLE
        outcome = _classify(response.status_code)
        if outcome is _Outcome.REJECTED:
            self._warn_once(
                "rejected",
                "agentmars collector %s rejected a batch with HTTP %d (not retried): %s",
                self.url,
                response.status_code,
                response.text[:500],
            )
        return outcome

    def _pause(self, delay_s: float) -> bool:
        """Back off before a retry; False if close()'s deadline leaves no time to retry."""
        end = time.monotonic() + delay_s
        # close() cuts the pause short to its deadline, which it may set mid-pause.
        if self._closing.wait(delay_s):
            time.sleep(max(0.0, min(end, self._deadline) - time.monotonic()))
        return time.monotonic() < self._deadline

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)
