"""The plugin's record of paused sessions and their held requests, and the idle ticker
(pure Python; the real engine pausing and ticking is in this folder's slow tests)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from agentmars.server.engines.vllm.paused import PausedSessions
from agentmars.server.engines.vllm.ticker import IdleTicker


@dataclass(frozen=True)
class Request:
    request_id: str


def test_held_requests_come_back_in_arrival_order_on_resume() -> None:
    paused = PausedSessions()
    paused.pause("a")
    paused.hold("a", [Request("1"), Request("2")])
    paused.hold("a", [Request("3")])  # arrived while paused
    assert "a" in paused and "b" not in paused and len(paused) == 1
    assert paused.requests == 3
    assert paused.resume("a") == [Request("1"), Request("2"), Request("3")]
    assert "a" not in paused and paused.requests == 0
    assert paused.resume("a") == []  # not paused: nothing held


def test_a_held_request_that_is_aborted_is_forgotten() -> None:
    paused = PausedSessions()
    paused.pause("a")
    paused.pause("b")
    paused.hold("a", [Request("1"), Request("2")])
    paused.hold("b", [Request("3")])
    paused.forget({"2", "3"})
    assert paused.requests == 1
    assert paused.resume("a") == [Request("1")]
    assert "b" in paused  # still paused, with nothing held


def test_the_idle_ticker_calls_at_its_interval_until_stopped() -> None:
    calls: list[float] = []
    three = threading.Event()

    def tick() -> None:
        calls.append(1.0)
        if len(calls) == 3:
            three.set()

    ticker = IdleTicker(0.01, tick)
    assert three.wait(5.0)
    ticker.stop()
    stopped_at = len(calls)
    assert not ticker._thread.is_alive()
    assert len(calls) == stopped_at  # nothing after stop
