"""The waiting queue kept in the policy's order: after any mix of what vLLM and the
plugin do to it (calls joining at the tail or the head, calls taken off the head,
skipped ones put back, keys forgotten by session or all at once), it is in the order
a full sort by the current keys gives."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import pytest

from agentmars.server.engines.vllm.waiting_order import WaitingOrder


@dataclass(eq=False)
class Request:
    """What the order reads of a vLLM request."""

    request_id: str
    session_id: str
    rank: int
    status: str = "waiting"


def make_order(kept: bool = True) -> tuple[WaitingOrder, list[int]]:
    """An order by ``rank`` (then id); the list counts the keys it made."""
    made: list[int] = []

    def key_of(request: Request) -> tuple[str, tuple[int, str]]:
        made.append(1)
        return request.session_id, (request.rank, request.request_id)

    order = WaitingOrder(key_of, kept=kept, is_waiting=lambda request: request.status == "waiting")
    return order, made


def in_order(queue: deque[Request]) -> bool:
    keys = [(request.rank, request.request_id) for request in queue]
    return keys == sorted(keys)


def test_first_order_sorts_then_a_joining_call_is_placed_without_new_keys() -> None:
    order, made = make_order()
    queue = deque(Request(f"r{i}", f"s{i}", rank) for i, rank in enumerate([5, 1, 4, 2, 3]))
    order.order(queue)
    assert [r.rank for r in queue] == [1, 2, 3, 4, 5] and len(made) == 5
    newcomer = Request("r9", "s9", 3)
    queue.append(newcomer)  # vLLM's add_request
    order.joined(newcomer)
    order.order(queue)
    assert [r.request_id for r in queue] == ["r1", "r3", "r4", "r9", "r2", "r0"]
    assert len(made) == 6  # only the newcomer's key was made


def test_a_session_whose_pin_changed_is_placed_again_only_if_waiting() -> None:
    order, made = make_order()
    a, b, c = Request("a", "sa", 1), Request("b", "sb", 2), Request("c", "sc", 3)
    queue = deque([a, b, c])
    order.order(queue)
    a.rank = 9  # its key changes with its session's pin
    c.status = "running"  # taken off the queue by vLLM, and so not placed again
    queue.remove(c)
    order.forget_sessions({"sa", "sc"}, {"a": a, "b": b, "c": c})
    order.order(queue)
    assert [r.request_id for r in queue] == ["b", "a"]
    assert len(made) == 4


def test_without_kept_keys_every_order_makes_every_key() -> None:
    order, made = make_order(kept=False)
    queue = deque([Request("a", "sa", 2), Request("b", "sb", 1)])
    order.order(queue)
    assert not order.settled  # keys may change at any step: ordered at every one
    order.order(queue)
    assert [r.request_id for r in queue] == ["b", "a"] and len(made) == 4


@pytest.mark.parametrize("seed", range(20))
def test_any_mix_of_changes_leaves_the_queue_fully_sorted(seed: int) -> None:
    rng = random.Random(seed)
    order, _ = make_order()
    queue: deque[Request] = deque()
    requests: dict[str, Request] = {}
    for step in range(200):
        for _ in range(rng.randint(0, 3)):  # new calls at the tail, preempted at the head
            session, rank = f"s{rng.randint(0, 9)}", rng.randint(0, 5)
            request = Request(f"r{step}-{len(requests)}", session, rank)
            requests[request.request_id] = request
            if rng.random() < 0.8:
                queue.append(request)
            else:
                queue.appendleft(request)
            order.joined(request)
        if rng.random() < 0.3:  # a pin changed: its session's keys may differ now
            session = f"s{rng.randint(0, 9)}"
            for request in queue:
                if request.session_id == session:
                    request.rank = rng.randint(0, 5)
            order.forget_sessions({session}, requests)
        if rng.random() < 0.05:  # the policy's refresh
            for request in queue:
                request.rank = rng.randint(0, 5)
            order.forget_all()
        # As the plugin does: the order is put right only when it may be wrong.
        if not order.settled:
            order.order(queue)
        assert order.settled and in_order(queue), f"step {step}"
        # vLLM's pass: calls taken off the head, scheduled or skipped; the skipped ones
        # are put back in their order.
        taken = [queue.popleft() for _ in range(min(len(queue), rng.randint(0, 2)))]
        skipped = []
        for request in taken:
            if rng.random() < 0.5:
                request.status = "running"
                if rng.random() < 0.5:
                    order.left(request.request_id)  # finished
            else:
                skipped.append(request)
        queue.extendleft(reversed(skipped))
