from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest

from agentmars.server.workloads.model import Workload
from agentmars.server.workloads.registry import build_workload

SEED = 7


@cache
def cached_workload(name: str, sessions: int = 2000) -> Workload:
    """Each workload is generated once per test run (they take ~0.1-0.8 s each)."""
    return build_workload(name, sessions=sessions, seed=SEED, concurrency=1)


@pytest.fixture
def workload() -> Callable[..., Workload]:
    return cached_workload
