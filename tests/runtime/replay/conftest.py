"""A real sandbox pool on one core, for the replay driver's tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool


@pytest.fixture
async def started_pool(tmp_path: Path) -> AsyncIterator[SandboxPool]:
    config = SandboxConfig(
        workspace_root=tmp_path / "ws",
        tool_cores=[max(os.sched_getaffinity(0))],
        engine_cores=[],
        slots=2,
    )
    async with SandboxPool(config) as started:
        yield started
