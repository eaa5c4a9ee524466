"""Small real profiles and workloads for the simulator's tests."""

from __future__ import annotations

from typing import Any

from agentmars.server.profiles.cost_model import FittedCost, Profile
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload

STEP_S = 0.01
"""Every step of ``flat_profile`` takes exactly this long, whatever it computes."""


def flat_profile(num_gpu_blocks: int = 64, **overrides: Any) -> Profile:
    """Block size 16; each step takes ``STEP_S``, so times are easy to work out."""
    fields: dict[str, Any] = {
        "name": "test-flat",
        "description": "every step takes 10 ms",
        "sources": [],
        "block_size": 16,
        "num_gpu_blocks": num_gpu_blocks,
        "max_model_len": num_gpu_blocks * 16,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 256,
        "kv_bytes_per_token": 1024,
        "cpu_kv_blocks": 0,
        "cpu_kv_bandwidth_bytes_s": 16 * 1024 * 100.0,
        "cost": FittedCost(c0=STEP_S, c1=0.0, c2=0.0, c3=0.0, c4=0.0),
    }
    fields.update(overrides)
    return Profile(**fields)


def session(
    session_id: str,
    turns: list[tuple[int, int, float | None]],
    *,
    arrival_s: float = 0.0,
    tool_cpu_s: float = 0.0,
    **extra: Any,
) -> SessionSpec:
    """``turns``: (append tokens, output tokens, tool wall seconds or None)."""
    return SessionSpec(
        session_id=session_id,
        arrival_s=arrival_s,
        turns=tuple(
            TurnSpec(
                append_tokens=append,
                output_tokens=output,
                tool=None
                if wall is None
                else ToolSpec(kind="bash", wall_s=wall, cpu_s=min(tool_cpu_s, wall)),
            )
            for append, output, wall in turns
        ),
        **extra,
    )


def workload(*sessions: SessionSpec, **fields: Any) -> Workload:
    return Workload(name="test", sessions=sessions, **fields)
