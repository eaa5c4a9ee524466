from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.sinks.memory import MemorySink

MakePool = Callable[..., Awaitable[SandboxPool]]


@pytest.fixture
def events() -> MemorySink:
    return MemorySink()


@pytest.fixture
async def make_pool(tmp_path: Path, events: MemorySink) -> AsyncIterator[MakePool]:
    """Factory of started pools over real sandboxes; every one is closed at teardown."""
    pools: list[SandboxPool] = []

    async def make(**options: object) -> SandboxPool:
        config = SandboxConfig(workspace_root=tmp_path / "ws", **options)  # type: ignore[arg-type]
        pool = SandboxPool(config, emitter=Emitter([events]))
        pools.append(pool)
        return await pool.start()

    yield make
    for pool in pools:
        await pool.close()


@pytest.fixture
async def pool(make_pool: MakePool) -> SandboxPool:
    return await make_pool()
