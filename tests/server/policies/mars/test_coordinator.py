"""MARS's Priority-Aware Coordinator: the level of a call from its KV footprint, its
session's windowed service and its wait; bounded promotion; eviction in the same
order. Pool: 64 blocks of 16 tokens, so the footprint base is 1 block."""

from __future__ import annotations

from dataclasses import replace

from agentmars.sdk.events import LLMEnd, SessionEnd
from agentmars.server.policies.mars.coordinator import PriorityAwareCoordinator, doublings
from agentmars.server.policies.mars.settings import MarsSettings
from tests.server.policies.views import CallData, EngineData, PinData, call

SETTINGS = MarsSettings()  # 6 levels, quota 8,192 tokens, +1 level per 30 s waited
SMALL = call("small", prompt_tokens=16)  # 1 block: level 0
BIG = call("big", prompt_tokens=640)  # 40 blocks: ceil(log2 40) = 6 doublings, level 5


def served(coordinator: PriorityAwareCoordinator, session_id: str, *computed: int) -> None:
    for tokens in computed:
        coordinator.on_event(
            LLMEnd(session_id=session_id, call_id="c", prompt_tokens=tokens, cached_tokens=0)
        )


def order(coordinator: PriorityAwareCoordinator, view: EngineData, *calls: CallData) -> list[str]:
    """The waiting order as the engines sort it: the policy's key, then arrival."""
    ranked = sorted(calls, key=lambda c: (coordinator.priority(c, view), c.arrival_s))
    return [c.session_id for c in ranked]


def test_levels_double_from_the_footprint_base_and_the_quota() -> None:
    assert [doublings(v, 1) for v in (0.5, 1, 2, 3, 40)] == [0, 0, 1, 2, 6]
    coordinator = PriorityAwareCoordinator(SETTINGS)
    view = EngineData()
    assert coordinator.level(SMALL, view) == 0
    assert coordinator.level(BIG, view) == 5
    # 20,000 + 480 tokens computed for the session: 2.5 quotas, two levels down.
    coordinator.on_event(
        LLMEnd(session_id="small", call_id="c", prompt_tokens=20_000, output_tokens=480)
    )
    assert coordinator.level(SMALL, view) == 2


def test_a_warm_resume_ranks_by_what_it_adds_to_its_pin() -> None:
    coordinator = PriorityAwareCoordinator(SETTINGS)
    resume = call("warm", prompt_tokens=640, follows_tool=True)
    view = EngineData(pins=[PinData("warm", blocks=39, tokens=624)])
    assert coordinator.level(resume, view) == 0
    assert coordinator.level(resume, EngineData()) == 5


def test_the_service_window_forgets_old_calls_and_ended_sessions() -> None:
    coordinator = PriorityAwareCoordinator(SETTINGS)
    served(coordinator, "s", 40_000, 100, 100, 100)
    assert coordinator.attained_tokens("s") == 40_300
    served(coordinator, "s", 100)  # the 40,000-token call leaves the 4-call window
    assert coordinator.attained_tokens("s") == 400
    coordinator.on_event(SessionEnd(session_id="s"))
    assert coordinator.attained_tokens("s") == 0


def test_promotion_ends_the_starvation_plain_mlfq_causes() -> None:
    mlfq = PriorityAwareCoordinator(replace(SETTINGS, promotion_wait_s=1e12))
    coordinator = PriorityAwareCoordinator(SETTINGS)
    big = replace(BIG, arrival_s=0.0)
    for now in (10.0, 100.0, 149.0, 500.0):
        # A small call arrives a second before every decision: always a fresh one.
        fresh = replace(SMALL, arrival_s=now - 1.0)
        view = EngineData(now=now)
        assert order(mlfq, view, big, fresh) == ["small", "big"]
    # Promoted one level per 30 s: at 100 s, level 5 - 3 = 2 (small still first); at
    # 150 s, level 0, where arrival order puts it ahead of the newer small call.
    assert coordinator.level(big, EngineData(now=100.0)) == 2
    view = EngineData(now=150.0)
    assert coordinator.level(big, view) == 0
    assert order(coordinator, view, big, replace(SMALL, arrival_s=149.0)) == ["big", "small"]


def test_the_victim_is_the_lowest_priority_then_the_largest() -> None:
    coordinator = PriorityAwareCoordinator(SETTINGS)
    view = EngineData()
    running = [
        call("a", prompt_tokens=16, num_computed_tokens=16),  # level 0
        call("b", prompt_tokens=640, num_computed_tokens=160),  # level 5, 10 blocks held
        call("c", prompt_tokens=700, num_computed_tokens=320),  # level 5, 20 blocks held
    ]
    assert coordinator.victim(running, view).session_id == "c"


def test_pins_are_reclaimed_lowest_priority_first_larger_first_among_equals() -> None:
    coordinator = PriorityAwareCoordinator(SETTINGS)
    pins = [
        PinData("p1", blocks=2, tokens=32),  # level 1
        PinData("p2", blocks=40, tokens=640),  # level 5
        PinData("p3", blocks=10, tokens=160),  # level 4
        PinData("p4", blocks=12, tokens=192),  # level 4
    ]
    reclaimed = coordinator.reclaim(pins, EngineData())
    assert [pin.session_id for pin in reclaimed] == ["p2", "p4", "p3", "p1"]
    # A session that has been served much sinks below a larger one that has not.
    served(coordinator, "p1", 70_000)  # 70,000 / 8,192 = 8.5 quotas: 4 levels down
    reclaimed = coordinator.reclaim(pins, EngineData())
    assert [pin.session_id for pin in reclaimed] == ["p2", "p1", "p4", "p3"]
