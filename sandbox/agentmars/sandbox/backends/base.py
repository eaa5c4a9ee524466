"""The contract between the pool and a backend. The pool decides what runs when
(admission, slots, events); a backend only runs one command in one slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.spec import ExecResult, ExecSpec

Stream = Literal["stdout", "stderr"]
OutputCallback = Callable[[Stream, bytes], None]
"""Called with each chunk of output as it arrives (streaming); must not block."""


@dataclass(frozen=True)
class Slot:
    index: int
    cores: tuple[int, ...]


@dataclass(frozen=True)
class Job:
    """One command for a backend, with every default already resolved by the pool."""

    session_id: str
    workspace: Path
    spec: ExecSpec
    timeout_s: float
    output_cap_bytes: int


class Backend(Protocol):
    name: str

    async def start(self, config: SandboxConfig, slots: list[Slot]) -> list[str]:
        """Prepare the slots (cgroups, containers); return warnings about isolation
        that is not available here (each also logged), empty when fully isolated."""
        ...

    async def execute(
        self,
        slot: Slot,
        job: Job,
        *,
        cancel: asyncio.Event,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Run ``job`` in ``slot`` until it exits, times out (kill the whole tree:
        status ``timeout``) or ``cancel`` is set (kill: ``cancelled``). Output beyond
        the cap is drained and counted, never buffered. Never leaves a process behind."""
        ...

    async def adopt(self, workspace: Path) -> None:
        """Make what the pool's own process wrote into ``workspace`` (an in-process
        tool's files) the sandbox's to read and write."""
        ...

    async def release_session(self, session_id: str) -> None:
        """Drop whatever the backend keeps for a session (e.g. its container)."""
        ...

    async def close(self) -> None:
        """Kill anything still running and remove cgroups / containers."""
        ...
