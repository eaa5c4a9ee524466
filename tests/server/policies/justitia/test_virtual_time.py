"""Justitia's virtual clock and fair queue (seed 004 §4.3, Eq. 2-3; Appendix B): a
hand-computed example, agreement with a brute-force fluid GPS, the stability of tags
under later arrivals, the delay bound of Theorem B.1 in a small discrete model, and
bad input."""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable

import pytest

from agentmars.server.policies.justitia.virtual_time import (
    FairQueue,
    VirtualClock,
    gps_completion_times,
)

# --- (a) hand-computed example ------------------------------------------------------
#
# M = 12 KV tokens; time in decode iterations, so V is KV token-time per agent.
#   t=0  A arrives, cost 24.  V(0) = 0,                        F_A = 0 + 24 = 24.
#        N = 1, dV/dt = 12.
#   t=1  B arrives, cost 12.  V(1) = 0 + 12*1 = 12,            F_B = 12 + 12 = 24.
#        N = 2, dV/dt = 6.    (F_A = F_B: A is served first, it arrived first.)
#   t=2  C arrives, cost 60.  V(2) = 12 + 6*1 = 18,            F_C = 18 + 60 = 78.
#        N = 3, dV/dt = 4.
#   V reaches 24 at t = 2 + (24 - 18)/4 = 3.5: A and B leave GPS together. N = 1,
#        dV/dt = 12.  (Check A: 12*1 + 6*1 + 4*1.5 = 24 tokens*iterations of service.)
#   t=4  D arrives, cost 6.   V(4) = 24 + 12*0.5 = 30,         F_D = 30 + 6 = 36 < F_C.
#        N = 2, dV/dt = 6.
#   V reaches 36 at t = 4 + (36 - 30)/6 = 5: D leaves GPS. N = 1, dV/dt = 12.
#   V reaches 78 at t = 5 + (78 - 36)/12 = 8.5: C leaves GPS.
#        (Check: the server is never idle, total work 24+12+60+6 = 102 = 12 * 8.5.)
# Serve order (ascending F, ties by arrival): A, B, D, C: D, arriving last, goes before C.


def test_hand_computed_tags_virtual_times_and_gps_departures() -> None:
    clock = VirtualClock(12)
    assert clock.arrive("A", 24, now=0) == 24
    assert clock.active == 1
    assert clock.arrive("B", 12, now=1) == 24
    assert clock.value == 12
    assert clock.arrive("C", 60, now=2) == 78
    assert clock.value == 18
    assert clock.active == 3
    assert clock.next_departure() == 3.5
    assert clock.advance(3.5) == 24
    assert clock.active == 1
    assert clock.departure("A") == clock.departure("B") == 3.5
    assert clock.departure("C") is None
    assert clock.arrive("D", 6, now=4) == 36
    assert clock.value == 30
    assert clock.advance(5) == 36
    assert clock.departure("D") == 5
    assert clock.advance(10) == 78
    assert clock.departure("C") == 8.5
    assert clock.active == 0
    assert clock.advance(11) == 78  # GPS empty: V holds
    assert sorted("ABCD", key=clock.serve_key) == ["A", "B", "D", "C"]


def test_gps_completion_times_of_the_hand_computed_example() -> None:
    arrivals = [(0, 24), (1, 12), (2, 60), (4, 6)]
    assert gps_completion_times(arrivals, 12) == [3.5, 3.5, 8.5, 5]
    assert gps_completion_times(list(reversed(arrivals)), 12) == [5, 8.5, 3.5, 3.5]


def test_queue_serves_calls_by_agent_tag_without_displacing_running_calls() -> None:
    queue: FairQueue[str] = FairQueue(12)
    queue.arrive("A", 24, now=0)
    queue.arrive("B", 12, now=1)
    queue.push("B", "b1")
    queue.push("A", "a1")
    queue.push("A", "a2")
    assert [queue.pop(), queue.pop(), queue.pop()] == ["a1", "a2", "b1"]  # tie: A first
    queue.arrive("C", 60, now=2)
    queue.push("C", "c1")
    queue.push("C", "c2")
    assert queue.pop() == "c1"  # alone in the queue: it runs, and keeps running
    queue.arrive("D", 6, now=4)
    queue.push("D", "d1")
    assert queue.peek() == "d1"  # D's tag 36 < C's 78: ahead of C's waiting call
    assert [queue.pop(), queue.pop(), queue.pop()] == ["d1", "c2", None]
    assert len(queue) == 0


def test_leaving_agent_drops_its_waiting_calls() -> None:
    queue: FairQueue[str] = FairQueue(12)
    queue.arrive("A", 24, now=0)
    queue.arrive("B", 48, now=0)
    for call in ("a1", "b1", "a2"):
        queue.push(call[0].upper(), call)
    queue.leave("A")
    assert len(queue) == 1
    assert queue.pop() == "b1"
    with pytest.raises(KeyError):
        queue.clock.finish_tag("A")


def test_forgotten_agent_stays_in_gps_until_v_passes_its_tag() -> None:
    clock = VirtualClock(12)
    clock.arrive("A", 24, now=0)
    clock.forget("A")  # done early in the real system
    assert clock.arrive("B", 12, now=1) == 24  # V(1) = 12: A still counted in N
    assert clock.active == 2
    # A re-arrives as a new agent: V(2) = 18, F = 18 + 12 = 30.
    assert clock.arrive("A", 12, now=2) == 30
    clock.advance(3.5)  # the old A and B leave at V = 24; the new A does not
    assert clock.active == 1
    assert clock.departure("A") is None
    clock.advance(5)  # alone, slope 12: V 24 -> 30 in 0.5
    assert clock.departure("A") == 4


def test_zero_cost_agent_leaves_gps_on_arrival_and_goes_first() -> None:
    clock = VirtualClock(12)
    clock.arrive("A", 24, now=0)
    assert clock.arrive("Z", 0, now=1) == 12
    assert clock.departure("Z") == 1
    assert clock.active == 1
    assert clock.serve_key("Z") < clock.serve_key("A")


def test_resize_changes_the_slope_from_then_and_keeps_tags() -> None:
    clock = VirtualClock(12)
    clock.arrive("A", 24, now=0)
    clock.resize(6, now=1)  # V(1) = 12, then 6 per iteration
    assert clock.next_departure() == 3
    assert clock.finish_tag("A") == 24


# --- (b) agreement with a brute-force fluid GPS --------------------------------------


def fluid_gps(arrivals: list[tuple[float, float]], capacity: float, dt: float) -> list[float]:
    """GPS by brute force, with no virtual time: every ``dt`` each present agent gets
    ``capacity * dt / N`` of service; one that needs less finishes within the step (the
    rest of its share is not handed on: errors of about ``dt`` per departure)."""
    pending = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    remaining: dict[int, float] = {}
    done: dict[int, float] = {}
    step = 0
    while len(done) < len(arrivals):
        now = step * dt
        while pending and arrivals[pending[0]][0] <= now:
            index = pending.pop(0)
            remaining[index] = arrivals[index][1]
        if remaining:
            share = capacity * dt / len(remaining)
            for index, left in list(remaining.items()):
                if left <= share:
                    done[index] = now + dt * left / share
                    del remaining[index]
                else:
                    remaining[index] = left - share
        step += 1
    return [done[index] for index in range(len(arrivals))]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_virtual_clock_matches_fluid_gps(seed: int) -> None:
    rng = random.Random(seed)
    arrivals = [(rng.uniform(0, 20), rng.uniform(1, 50)) for _ in range(10)]
    capacity = 8.0
    exact = gps_completion_times(arrivals, capacity)
    fluid = fluid_gps(arrivals, capacity, dt=1e-3)
    assert exact == pytest.approx(fluid, abs=0.02)
    clock = VirtualClock(capacity)
    tags = {}
    for index in sorted(range(len(arrivals)), key=lambda i: arrivals[i][0]):
        tags[index] = clock.arrive(index, arrivals[index][1], arrivals[index][0])
    order = list(range(len(arrivals)))
    assert sorted(order, key=fluid.__getitem__) == sorted(order, key=tags.__getitem__)


# --- (c) later arrivals keep the earlier agents' order --------------------------------


@pytest.mark.parametrize("seed", [4, 5])
def test_later_arrivals_keep_tags_and_order_of_earlier_agents(seed: int) -> None:
    rng = random.Random(seed)
    early = sorted((rng.uniform(0, 5), rng.uniform(1, 40)) for _ in range(6))
    late = sorted((rng.uniform(5, 10), rng.uniform(1, 40)) for _ in range(6))
    alone, crowded = VirtualClock(4), VirtualClock(4)
    for index, (time, cost) in enumerate(early):
        assert alone.arrive(index, cost, time) == crowded.arrive(index, cost, time)
    for index, (time, cost) in enumerate(late, start=len(early)):
        crowded.arrive(index, cost, time)
    assert [crowded.finish_tag(i) for i in range(6)] == [alone.finish_tag(i) for i in range(6)]
    before = gps_completion_times(early, 4)
    after = gps_completion_times(early + late, 4)[: len(early)]
    assert all(b <= a for b, a in zip(before, after, strict=True))  # slower, ...
    assert sorted(range(6), key=before.__getitem__) == sorted(range(6), key=after.__getitem__)


# --- Theorem B.1 in a small discrete, non-preemptive model -------------------------
#
# M KV-token slots; time in decode iterations. An agent arrives with all its calls at
# once (task-parallel, one stage: GPS lets an agent use any share, which a chain of
# dependent calls could not). A call holds one slot for ``d`` iterations: its
# KV token-time is ``d``, equal to its runtime, as the proof uses ``c_max`` for both,
# and one-slot calls make the model free of fragmentation, as Appendix B assumes. Each
# iteration the calls that end free their slots, the agents that arrive queue their
# calls, and free slots go to waiting calls in the queue's order; a running call is
# never preempted. An agent completes when its last call ends.

Agent = tuple[int, list[int]]  # (arrival iteration, call durations)


def serve_justitia(agents: list[Agent], slots: int) -> list[int]:
    queue: FairQueue[tuple[int, int]] = FairQueue(slots)

    def arrive(index: int, now: int) -> None:
        queue.arrive(index, sum(agents[index][1]), now)
        for duration in agents[index][1]:
            queue.push(index, (index, duration))

    return serve(agents, slots, arrive, queue.pop)


def serve_fcfs(agents: list[Agent], slots: int) -> list[int]:
    waiting: deque[tuple[int, int]] = deque()

    def arrive(index: int, now: int) -> None:
        waiting.extend((index, duration) for duration in agents[index][1])

    return serve(agents, slots, arrive, lambda: waiting.popleft() if waiting else None)


def serve(
    agents: list[Agent],
    slots: int,
    arrive: Callable[[int, int], None],
    next_call: Callable[[], tuple[int, int] | None],
) -> list[int]:
    """Completion iteration of each agent in the discrete model above."""
    left = [len(calls) for _, calls in agents]
    finished = [0] * len(agents)
    running: list[tuple[int, int]] = []  # heap of (end, agent)
    arrivals = sorted(range(len(agents)), key=lambda i: agents[i][0])
    now = 0
    while any(left):
        while running and running[0][0] == now:
            _, index = heapq.heappop(running)
            left[index] -= 1
            if not left[index]:
                finished[index] = now
        while arrivals and agents[arrivals[0]][0] == now:
            arrive(arrivals.pop(0), now)
        while len(running) < slots and (call := next_call()) is not None:
            index, duration = call
            heapq.heappush(running, (now + duration, index))
        now += 1
    return finished


def delays_and_bound(agents: list[Agent], slots: int, finished: list[int]) -> tuple[float, float]:
    """The largest ``f_j - fbar_j`` and Theorem B.1's ``2 c_max + C_max / M``."""
    fair = gps_completion_times([(a, sum(calls)) for a, calls in agents], slots)
    c_max = max(max(calls) for _, calls in agents)
    big_c_max = max(sum(calls) for _, calls in agents)
    worst = max(f - fbar for f, fbar in zip(finished, fair, strict=True))
    return worst, 2 * c_max + big_c_max / slots


def test_mice_behind_elephants_stay_within_the_bound_and_fcfs_does_not() -> None:
    # 3 elephants at t=0, 40 calls of 10 iterations each (C = 400), fill the 4 slots
    # just before the mice come; 10 mice, one call of 1 iteration, at t = 1, 11, 21, ...
    # In GPS a mouse finishes 1 iteration after arriving (N = 4, dV/dt = 1). Justitia
    # starts it when the next elephant call ends (<= 9 later); FCFS after every
    # elephant call queued before it (~300 iterations). Bound: 2*10 + 400/4 = 120.
    slots = 4
    elephants: list[Agent] = [(0, [10] * 40) for _ in range(3)]
    mice: list[Agent] = [(1 + 10 * k, [1]) for k in range(10)]
    agents = elephants + mice
    justitia, bound = delays_and_bound(agents, slots, serve_justitia(agents, slots))
    fcfs, _ = delays_and_bound(agents, slots, serve_fcfs(agents, slots))
    assert bound == 120
    assert justitia <= bound
    assert fcfs > 2 * bound


@pytest.mark.parametrize("seed", range(6))
def test_delay_bound_holds_on_random_agents(seed: int) -> None:
    rng = random.Random(seed)
    slots = rng.choice([2, 3, 5])
    agents: list[Agent] = [
        (rng.randrange(40), [rng.randint(1, 8) for _ in range(rng.randint(1, 12))])
        for _ in range(12)
    ]
    worst, bound = delays_and_bound(agents, slots, serve_justitia(agents, slots))
    assert worst <= bound


# --- (d) bad input ----------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, -1, math.nan, math.inf])
def test_rejects_bad_capacity(capacity: float) -> None:
    with pytest.raises(ValueError, match="capacity"):
        VirtualClock(capacity)
    with pytest.raises(ValueError, match="capacity"):
        VirtualClock(1).resize(capacity, now=0)


@pytest.mark.parametrize("cost", [-1, math.nan, math.inf])
def test_rejects_bad_cost(cost: float) -> None:
    with pytest.raises(ValueError, match="cost"):
        VirtualClock(1).arrive("A", cost, now=0)


def test_rejects_time_going_backwards_and_allows_simultaneous_events() -> None:
    clock = VirtualClock(1)
    clock.arrive("A", 5, now=2)
    clock.arrive("B", 5, now=2)
    with pytest.raises(ValueError, match="backwards"):
        clock.arrive("C", 5, now=1)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(1.5)
    with pytest.raises(ValueError, match="finite"):
        clock.advance(math.nan)


def test_rejects_duplicate_and_unknown_agents() -> None:
    queue: FairQueue[str] = FairQueue(1)
    queue.arrive("A", 5, now=0)
    with pytest.raises(ValueError, match="arrived already"):
        queue.arrive("A", 5, now=1)
    with pytest.raises(KeyError):
        queue.push("B", "b1")
    with pytest.raises(KeyError):
        queue.leave("B")
