"""The host's tool CPUs: processor sharing among the tools that use cores."""

from __future__ import annotations

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
