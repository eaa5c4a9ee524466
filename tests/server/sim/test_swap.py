"""Swapping to the CPU KV tier: the room it gives back, and what a swap-out costs."""

from __future__ import annotations

import pytest

from agentmars.server.policies.interface import EngineHalf, Policy, SessionAction
from agentmars.server.policies.registry import make_policy
from agentmars.server.policies.views import EngineView
from agentmars.server.sim.engine import SimConfig, SimEngine
from tests.server.policies.scenarios import profile, session, turn
from tests.server.sim.factories import STEP_S, flat_profile, workload
from tests.server.sim.factories import session as flat_session


def test_swapped_kv_leaves_the_cpu_tier_when_loaded_back_so_infercept_swaps_again() -> None:
    # A CPU tier of 2 blocks, a link moving 2 blocks a 10 ms step (InferCept's swap
    # budget). a pauses for a 1 s tool at 0.03 with 2 full blocks: both swapped out,
    # the tier is full. Its next call (1.03) takes them back: they leave the tier. c
    # pauses the same way at 1.53 and must find the 2 blocks free to be swapped too
    # (a tier that never frees space would leave it 0, and InferCept would discard).
    # x keeps the engine stepping (InferCept judges at every step).
    engine = SimEngine(
        workload(
            session("a", turn(30, 3, tool_s=1.0), turn(8, 2)),
            session("c", turn(30, 3, tool_s=1.0), turn(8, 2), arrival_s=1.5),
            session("x", turn(8, 300)),
        ),
        make_policy("infercept"),
        profile(blocks=32, cpu_bandwidth=3200).model_copy(update={"cpu_kv_blocks": 2}),
    )
    offloads: list[tuple[float, str, int]] = []
    tick = engine.engine_half.tick

    def noted(view: EngineView) -> list[SessionAction]:
        actions = list(tick(view))
        offloads.extend(
            (view.now, a.session_id, view.cpu_free_blocks) for a in actions if a.kind == "offload"
        )
        return actions

    engine.engine_half.tick = noted  # type: ignore[method-assign]
    engine.run()
    assert [(s, free) for _, s, free in offloads] == [("a", 2), ("c", 2)]
    assert offloads[0][0] == pytest.approx(0.03) and offloads[1][0] == pytest.approx(1.53)
    assert (
        engine.replicas[0].cpu_free_blocks == 2
        and engine.kv.cpu is not None
        and engine.kv.cpu.used == 0
    )


class SwapOnPreemption(EngineHalf):
    preempt_by_swap = True


class Swapping(Policy):
    name = "test-swap-on-preemption"

    def engine(self) -> EngineHalf:
        return SwapOnPreemption()


def test_a_step_that_preempts_by_swap_waits_for_the_copy_out() -> None:
    # 4 GPU blocks; a block moves to host memory in 5 ms. a (32-token prompt, 2
    # blocks) and b (16 tokens, 1 block) prefill at 0.0-0.01. At 0.01 a's 33rd token
    # takes the last free block; b's 17th finds none: b, the newest, is preempted and
    # its full block swapped out, which this step waits for: it ends at 0.025, not
    # 0.02. b waits (no room) until a ends: a's 20 tokens end at 0.025 + 18 x 0.01.
    fast_link = 16 * 1024 / 0.005
    engine = SimEngine(
        workload(flat_session("a", [(32, 20, None)]), flat_session("b", [(16, 20, None)])),
        Swapping(),
        flat_profile(num_gpu_blocks=4, cpu_kv_blocks=8, cpu_kv_bandwidth_bytes_s=fast_link),
        SimConfig(cpu_tier=True),
    )
    record = engine.run()
    a_call = next(s for s in record.sessions if s.session_id == "a").calls[0]
    assert record.preemptions == 1
    assert a_call.first_token_s == pytest.approx(STEP_S)
    assert a_call.end_s == pytest.approx(0.025 + 18 * STEP_S)
