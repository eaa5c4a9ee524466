"""The host's tool CPUs: processor sharing among the tools that use cores."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from agentmars.server.sim.host_cpu import HostCPU
from agentmars.server.workloads.model import ToolSpec


def test_a_tool_that_asks_for_no_core_is_not_slowed_by_oversubscribed_cores() -> None:
    # One core, two 1 s tools asking for a core each (they share it: 2 s each) and a
    # 1 s tool that only waits (0 cores): it ends at 1.0 whatever the others do.
    host = HostCPU(cores=1)
    host.submit("a", ToolSpec(kind="bash", wall_s=1.0, cpu_s=1.0))
    host.submit("b", ToolSpec(kind="bash", wall_s=1.0, cpu_s=1.0))
    host.submit("api", ToolSpec(kind="http", wall_s=1.0, cpu_s=0.0))
    assert host.next_finish() == (pytest.approx(1.0), "api")
    host.advance(1.0)
    host.finish("api")
    # The two core-bound tools went at half speed meanwhile: 0.5 s of work left each.
    assert host.next_finish() == (pytest.approx(2.0), "a")
    assert host.busy_core_s == pytest.approx(1.0)


def _one_slot_host_running(key: str) -> HostCPU:
    host = HostCPU(cores=4, slots=1)
    assert host.submit(key, ToolSpec(kind="bash", wall_s=1.0, cpu_s=1.0))
    return host


def _start_order(host: HostCPU, running: Hashable) -> list[Hashable]:
    """Finish the running tool, then each that takes its slot, in turn."""
    order: list[Hashable] = []
    while started := host.finish(running):
        (running,) = started
        order.append(running)
    return order


def test_queued_tools_take_a_free_slot_lowest_priority_first() -> None:
    host = _one_slot_host_running("running")
    for key, priority in (("p5", 5), ("p1", 1), ("p3", 3)):
        assert not host.submit(key, ToolSpec(kind="bash", wall_s=1.0), priority)
    assert host.queued == 3
    assert _start_order(host, "running") == ["p1", "p3", "p5"]
    assert host.queued == 0


def test_queued_tools_of_one_priority_start_in_arrival_order() -> None:
    host = _one_slot_host_running("running")
    for key, priority in (("a", 2), ("b", 0), ("c", 2), ("d", 0), ("e", 2)):
        host.submit(key, ToolSpec(kind="bash", wall_s=1.0), priority)
    assert _start_order(host, "running") == ["b", "d", "a", "c", "e"]


def test_background_work_shares_the_cores_without_a_slot() -> None:
    # One core, one slot. A 10 s core-bound tool runs; an agent's 5 CPU-seconds of
    # background work join it: both at half speed, so the work ends at 10 s, the tool
    # having done 5 s of its 10, and the tool ends 5 s later at full speed. The work
    # took no slot: a second tool still queues for the tool's, and nothing starts when
    # the work ends.
    host = HostCPU(cores=1, slots=1)
    assert host.submit("tool", ToolSpec(kind="bash", wall_s=10.0, cpu_s=10.0))
    host.run_background("agent", 5.0)
    assert not host.submit("next", ToolSpec(kind="bash", wall_s=1.0, cpu_s=1.0))
    assert host.next_finish() == (pytest.approx(10.0), "agent")
    host.advance(10.0)
    assert host.is_background("agent")
    assert host.finish("agent") == []
    assert host.next_finish() == (pytest.approx(15.0), "tool")
    # Only the tool's core time counts as the tools' busy time.
    assert host.busy_core_s == pytest.approx(5.0)
    host.advance(15.0)
    assert host.finish("tool") == ["next"]
