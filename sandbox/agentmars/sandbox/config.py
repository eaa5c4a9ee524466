"""Sandbox pool configuration: slots, the cores they are pinned to, limits."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentmars.sandbox.spec import MAX_OUTPUT_CAP_BYTES, MAX_TIMEOUT_S

SYSTEM_READONLY_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
"""Host paths every sandbox sees read-only (those that exist); everything else of
the host is absent, so secrets in /root, /home or other workspaces cannot be read."""


def default_readonly_paths() -> list[Path]:
    """The system paths plus this interpreter's installation, so Python tools run."""
    paths = {Path(p) for p in SYSTEM_READONLY_PATHS}
    paths |= {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    return sorted(p for p in paths if p.exists())


def allowed_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def default_workspace_root() -> Path:
    return Path(tempfile.gettempdir()) / f"agentmars-{os.getuid()}" / "workspaces"


class SandboxConfig(BaseModel):
    """How the pool runs tools. Core sets default to the seed 000 layout: the engine
    keeps core 0 (when there is more than one), tools get the rest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["process", "docker"] = "process"
    slots: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Tools running at once; default: one per tool core."""
    engine_cores: list[int] | None = None
    """Cores reserved for the inference engine; default: [0] when more than one core."""
    tool_cores: list[int] | None = None
    """Cores the slots are pinned to; default: the allowed cores minus the engine's."""
    workspace_root: Path = Field(default_factory=default_workspace_root)
    """Each session gets ``workspace_root/<session id>``, its only writable place."""
    workspace_quota_mb: Annotated[int, Field(ge=16)] | None = 4096
    """Disk space per workspace: each is a file system of this size where the pool runs
    as root (see ``workspaces.py``); None: no quota."""
    readonly_paths: list[Path] = Field(default_factory=default_readonly_paths)
    memory_limit_mb: Annotated[int, Field(ge=16)] = 2048
    """Per slot (cgroup memory limit; RLIMIT_AS where cgroups are unavailable)."""
    pids_limit: Annotated[int, Field(ge=8)] = 512
    """Processes and threads per slot (cgroup pids limit)."""
    default_timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] = 120.0
    output_cap_bytes: Annotated[int, Field(ge=0, le=MAX_OUTPUT_CAP_BYTES)] = 1024 * 1024
    """Bytes of output kept per stream of a call (see ``ExecSpec.output_cap_bytes``)."""
    exec_ema_alpha: Annotated[float, Field(gt=0, le=1)] = 0.2
    """Weight of the newest sample in the per-tool-kind execution-time EMA (seed 000
    §4.1 names an EMA without a weight; 0.2 is our choice)."""
    docker_image: str = "python:3.12-slim"
    docker_container_per: Literal["slot", "session"] = "slot"

    @model_validator(mode="after")
    def _cores_are_valid(self) -> SandboxConfig:
        available = set(allowed_cores())
        for name, cores in (("engine_cores", self.engine_cores), ("tool_cores", self.tool_cores)):
            unknown = set(cores or ()) - available
            if unknown:
                raise ValueError(
                    f"{name} {sorted(unknown)} are not cores this process may use "
                    f"(allowed: {sorted(available)})"
                )
        overlap = set(self.engine_cores or ()) & set(self.tool_cores or ())
        if overlap:
            raise ValueError(
                f"tool_cores and engine_cores overlap on {sorted(overlap)}: "
                "tools must run on cores disjoint from the engine's"
            )
        if not self.resolved_tool_cores():
            raise ValueError(
                "no cores left for tools: set tool_cores, or fewer engine_cores "
                f"(allowed: {sorted(available)})"
            )
        return self

    def resolved_engine_cores(self) -> list[int]:
        if self.engine_cores is not None:
            return sorted(self.engine_cores)
        cores = allowed_cores()
        return cores[:1] if len(cores) > 1 else []

    def resolved_tool_cores(self) -> list[int]:
        if self.tool_cores is not None:
            return sorted(self.tool_cores)
        engine = set(self.resolved_engine_cores())
        return [c for c in allowed_cores() if c not in engine]

    def resolved_slots(self) -> int:
        return self.slots if self.slots is not None else len(self.resolved_tool_cores())

    def slot_cores(self, index: int) -> list[int]:
        """Slot ``index``'s cores: the tool cores dealt out round-robin, so slots share
        a core only when there are more slots than cores."""
        cores = self.resolved_tool_cores()
        slots = self.resolved_slots()
        if slots <= len(cores):
            return cores[index::slots]
        return [cores[index % len(cores)]]
