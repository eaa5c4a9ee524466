"""Admission: at most `slots` holders; waiters by priority (lower first), FIFO within one."""

from __future__ import annotations

import asyncio

import pytest

from agentmars.sandbox.admission import Admission


async def test_free_slots_are_granted_at_once_and_counted() -> None:
    admission = Admission(2)
    assert {await admission.acquire(), await admission.acquire()} == {0, 1}
    assert (admission.active, admission.queued) == (2, 0)


async def test_try_acquire_takes_a_free_slot_or_nothing() -> None:
    admission = Admission(1)
    assert admission.try_acquire() == 0
    assert admission.try_acquire() is None
    waiter = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0)
    admission.release(0)  # handed to the waiter, not made free
    assert admission.try_acquire() is None
    assert await waiter == 0
    admission.release(0)
    assert admission.try_acquire() == 0


async def test_waiters_are_served_by_priority_then_fifo() -> None:
    admission = Admission(1)
    held = await admission.acquire()
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        slot = await admission.acquire(priority)
        order.append(name)
        admission.release(slot)

    tasks = []
    for name, priority in [("c", 5), ("a1", 1), ("b", 3), ("a2", 1), ("z", -2)]:
        tasks.append(asyncio.create_task(wait(name, priority)))
        await asyncio.sleep(0)  # let it enqueue: arrival order defines FIFO
    assert admission.queued == 5
    admission.release(held)
    await asyncio.gather(*tasks)
    assert order == ["z", "a1", "a2", "b", "c"]
    assert (admission.active, admission.queued) == (0, 0)


async def test_a_cancelled_waiter_neither_blocks_nor_keeps_a_slot() -> None:
    admission = Admission(1)
    held = await admission.acquire()
    cancelled = asyncio.create_task(admission.acquire(0))
    later = asyncio.create_task(admission.acquire(1))
    await asyncio.sleep(0)
    cancelled.cancel()
    admission.release(held)
    assert await later == held
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert admission.active == 1


async def test_a_slot_granted_to_a_waiter_cancelled_at_that_moment_is_passed_on() -> None:
    admission = Admission(1)
    held = await admission.acquire()
    first = asyncio.create_task(admission.acquire(0))
    second = asyncio.create_task(admission.acquire(0))
    await asyncio.sleep(0)
    admission.release(held)  # grants the slot to `first`, which has not run yet
    first.cancel()
    assert await second == held
    assert admission.active == 1


@pytest.mark.parametrize("priority", [1.5, "1", True, 2**40])
async def test_bad_priority_is_rejected(priority: object) -> None:
    with pytest.raises(ValueError, match="priority must be an integer"):
        await Admission(1).acquire(priority)  # type: ignore[arg-type]


def test_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="slots"):
        Admission(0)
