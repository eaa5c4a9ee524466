"""Tiny workloads on the simulated engine, with an engine simple enough to follow by
hand: every step takes ``STEP_S`` = 10 ms whatever it computes (a ``FittedCost`` with
c0 = 0.01 s and every other coefficient 0), blocks of ``BLOCK`` = 16 tokens, and a CPU
link that moves one block in ``STEP_S`` (16 tokens x 1 byte / 1600 B/s).

Facts of the engine the hand computations rely on (``sim.scheduler``, ``sim.kv_cache``):
- a call's first step computes its whole prompt (the budget is 512 tokens) and yields
  its first token; each later step yields one more, so a call of n output tokens
  that starts at t ends at t + n x ``STEP_S``;
- a call is admitted only if blocks for its whole remaining prompt are free; waiting
  calls are looked at in the policy's order and the first that does not fit stops
  the pass;
- a finished call's full blocks (computed tokens // 16; its last token is never
  computed) stay in the prefix cache; freed blocks join the tail of the free queue,
  a call's last block first, and allocation takes the head, so a block that still
  holds cached content is reused (evicted) only after every block freed before it.
"""

from __future__ import annotations

from agentmars.server.metrics.records import CallRecord, RunRecord
from agentmars.server.policies.interface import Policy
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import FittedCost, Profile
from agentmars.server.sim.engine import SimConfig, SimEngine
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload

STEP_S = 0.01
BLOCK = 16


def profile(
    *,
    blocks: int = 8,
    max_num_seqs: int = 8,
    cpu_bandwidth: float = 1600.0,
) -> Profile:
    """``blocks`` GPU blocks of 16 tokens; a CPU tier of 64 blocks (used only by the
    policies that need one) over a link of ``cpu_bandwidth`` bytes/s at 1 byte per
    token of KV."""
    return Profile(
        name="hand",
        description="constant 10 ms steps, for hand-computed tests",
        sources=["tests/server/policies/scenarios.py"],
        block_size=BLOCK,
        num_gpu_blocks=blocks,
        max_model_len=blocks * BLOCK,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=512,
        kv_bytes_per_token=1,
        cpu_kv_blocks=64,
        cpu_kv_bandwidth_bytes_s=cpu_bandwidth,
        cost=FittedCost(c0=STEP_S, c1=0.0, c2=0.0, c3=0.0, c4=0.0),
    )


def turn(append: int, output: int, tool_s: float | None = None, kind: str = "tool") -> TurnSpec:
    """A turn appending ``append`` tokens and generating ``output``, then (if
    ``tool_s`` is given) a tool of that kind that waits ``tool_s`` seconds."""
    tool = ToolSpec(kind=kind, wall_s=tool_s) if tool_s is not None else None
    return TurnSpec(append_tokens=append, output_tokens=output, tool=tool)


def session(session_id: str, *turns: TurnSpec, arrival_s: float = 0.0) -> SessionSpec:
    return SessionSpec(session_id=session_id, arrival_s=arrival_s, turns=turns)


def run(
    policy: Policy | str,
    *sessions: SessionSpec,
    blocks: int = 8,
    max_num_seqs: int = 8,
    cpu_bandwidth: float = 1600.0,
    config: SimConfig | None = None,
) -> RunRecord:
    """Run the sessions (open arrivals) under ``policy`` (an object or a registry name)."""
    chosen = make_policy(policy) if isinstance(policy, str) else policy
    workload = Workload(name="hand", sessions=sessions)
    engine_profile = profile(blocks=blocks, max_num_seqs=max_num_seqs, cpu_bandwidth=cpu_bandwidth)
    return SimEngine(workload, chosen, engine_profile, config).run()


def calls(record: RunRecord, session_id: str) -> list[CallRecord]:
    """The LLM calls of one session, in turn order."""
    (found,) = [s for s in record.sessions if s.session_id == session_id]
    return found.calls


def ends(record: RunRecord) -> dict[str, float]:
    """When each session ended."""
    return {s.session_id: s.end_s for s in record.sessions}


def evictions(record: RunRecord) -> list[tuple[float, int]]:
    """(time, blocks) of the run's evictions, times rounded to the microsecond (sums of
    10 ms steps are not exact in binary)."""
    return [(round(time, 6), blocks) for time, blocks in record.evictions]


def evicted_before(record: RunRecord, time_s: float) -> int:
    """Blocks evicted before ``time_s``. (Within a decode-only stretch the engine takes
    the stretch's blocks at its start, so an eviction inside one is dated to its start:
    count them rather than date them.)"""
    return sum(blocks for time, blocks in record.evictions if time < time_s)
