"""MORI (seed 003): Eq. 1 idleness without the scheduler's waits, demotion and promotion
in §4.3.1's order, gating and lazy demotion, the admission of new programs behind the
gated ones, and the tiers' capacities kept on the simulator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentmars.sdk.events import (
    AnyEvent,
    LLMSubmit,
    SessionEnd,
    SessionMove,
    SessionPause,
    SessionResume,
)
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.interface import Offload, Pin, Release, SessionAction
from agentmars.server.policies.mori import Mori
from agentmars.server.policies.mori.admission import MoriAdmission
from agentmars.server.policies.mori.idleness import Idleness
from agentmars.server.policies.mori.placement import (
    Candidate,
    Demotion,
    demotions,
    promotions,
)
from agentmars.server.policies.mori.scheduler import MoriEngine
from agentmars.server.policies.mori.settings import MoriSettings
from agentmars.server.policies.mori.tiers import Tier
from agentmars.server.policies.views import EngineView
from agentmars.server.sim.engine import SimConfig, SimEngine
from tests.server.policies.views import (
    AdmissionData,
    EngineData,
    PinData,
    SessionData,
    call,
    kv_stats,
)
from tests.server.sim.factories import flat_profile, session, workload

# --- Eq. 1 --------------------------------------------------------------------------------


def test_idleness_is_acting_over_acting_and_reasoning_the_current_gap_included() -> None:
    idle = Idleness(window_cycles=5)
    idle.call_arrived(0.0)
    idle.call_started(0.0)
    idle.call_ended(2.0)  # Reasoning 2 s
    idle.call_arrived(8.0)  # Acting 6 s
    idle.call_started(8.0)
    idle.call_ended(9.0)  # Reasoning 1 s
    # At 12 s the tool has run 3 s: (6 + 3) / (2 + 6 + 1 + 3).
    assert idle.value(12.0) == pytest.approx(9 / 12)
    assert not idle.reasoning


def test_idleness_forgets_cycles_past_its_window() -> None:
    idle = Idleness(window_cycles=2)
    # Cycle 1: a 100 s tool after a 1 s call; cycle 2: 1 s call, 1 s tool; cycle 3 runs.
    for arrive, end in ((0.0, 1.0), (101.0, 102.0), (103.0, 104.0)):
        idle.call_arrived(arrive)
        idle.call_started(arrive)
        if arrive < 103.0:
            idle.call_ended(end)
    # The window holds cycle 2 (1 s + 1 s) and the current one (1 s of Reasoning so far);
    # the 100 s tool is gone.
    assert idle.value(104.0) == pytest.approx(1 / 3)


def test_a_new_program_is_busy() -> None:
    assert Idleness(window_cycles=5).value(50.0) == 0.0


def _engine(**settings: float) -> MoriEngine:
    return Mori(**settings).engine()


def _view(now: float, **fields: object) -> EngineData:
    return EngineData(now=now, cpu_total_blocks=64, **fields)  # type: ignore[arg-type]


def test_time_a_call_waits_in_a_gated_tier_counts_neither_as_acting_nor_reasoning() -> None:
    engine = _engine(tick_s=5.0, gate_check_s=0.1)
    # A runs a call from 0 to 2 s and pins 64 tokens; B's demand overflows the GPU
    # (capacity 4 blocks x 16 = 64 tokens), so the tick at 5 s demotes idle A (Acting).
    a0 = call("A", 0, prompt_tokens=60, output_tokens=4, arrival_s=0.0)
    engine.tick(_view(0.0, running=[a0]))
    assert engine.on_call_finished(a0, _view(2.0)) == Pin()
    crowded = _view(5.0, total_blocks=4, pins=[PinData("A", 4, 64)], waiting=[call("B")])
    assert list(engine.tick(crowded)) == [
        SessionAction("offload", "A"),
        SessionAction("pause", "A", Tier.CPU.pause_reason),
    ]
    # A's tool ends and its next call arrives at 6 s: held. Promoted at 10 s, it runs
    # from 10 s to 11 s. Its cycle: Reasoning 2 s, Acting 4 s (2 -> 6), Reasoning 1 s;
    # the 4 s it was held (6 -> 10) are in neither.
    engine.on_event(LLMSubmit(session_id="A", call_id="A/1", projected_prompt_tokens=70))
    engine.tick(_view(6.0, total_blocks=8))
    assert list(engine.tick(_view(10.0, total_blocks=8))) == [SessionAction("resume", "A")]
    a1 = call("A", 1, prompt_tokens=70, arrival_s=10.0)
    engine.tick(_view(10.1, total_blocks=8, running=[a1]))
    engine.on_call_finished(a1, _view(11.0, total_blocks=8))
    assert engine.idleness("A", 11.0) == pytest.approx(4 / 7)


# --- §4.3.1: who moves -------------------------------------------------------------------


def test_demotion_takes_acting_before_reasoning_and_the_most_idle_first() -> None:
    gpu = [
        Candidate("busy-acting", 30, idleness=0.2, blocks=2),
        Candidate("idle-acting", 30, idleness=0.9, blocks=2),
        Candidate("idle-reasoning", 30, idleness=0.95, reasoning=True, blocks=2),
    ]
    # 50 tokens too many: the two Acting programs go (30 + 30), most idle first.
    assert demotions(gpu, 50, cpu_free_blocks=8) == [
        Demotion("idle-acting", Tier.CPU, lazy=False),
        Demotion("busy-acting", Tier.CPU, lazy=False),
    ]
    # 70 too many: the Reasoning one too, lazily.
    assert demotions(gpu, 70, cpu_free_blocks=8)[-1] == Demotion(
        "idle-reasoning", Tier.CPU, lazy=True
    )


def test_demotion_goes_to_waiting_once_the_cpu_tier_is_full() -> None:
    gpu = [Candidate("a", 64, idleness=0.9, blocks=4), Candidate("b", 64, idleness=0.5, blocks=4)]
    assert demotions(gpu, 100, cpu_free_blocks=5) == [
        Demotion("a", Tier.CPU, lazy=False),
        Demotion("b", Tier.WAITING, lazy=False),
    ]


def test_promotion_takes_cpu_before_waiting_least_idle_first_and_skips_a_misfit() -> None:
    waiting = [
        Candidate("w-busy", 10, idleness=0.1, tier=Tier.WAITING),
        Candidate("c-idle", 10, idleness=0.8, tier=Tier.CPU),
        Candidate("c-busy", 10, idleness=0.3, tier=Tier.CPU),
        Candidate("w-big", 50, idleness=0.2, tier=Tier.WAITING),
    ]
    assert promotions(waiting, 100) == (["c-busy", "c-idle", "w-busy", "w-big"], [])
    # 40 tokens of room: w-big (next after w-busy) does not fit and waits; w-late, after
    # it in the order, fits in what is left.
    late = Candidate("w-late", 5, 0.9, tier=Tier.WAITING)
    assert promotions([*waiting, late], 40) == (["c-busy", "c-idle", "w-busy", "w-late"], [])


def test_a_waiting_program_takes_the_place_of_more_idle_acting_ones() -> None:
    waiting = [Candidate("c", 40, idleness=0.3, tier=Tier.CPU, blocks=3)]
    residents = [
        Candidate("idle", 30, idleness=0.9, blocks=2),
        Candidate("idler", 20, idleness=0.95, blocks=2),
        Candidate("busy", 100, idleness=0.1, blocks=7),
    ]
    # 10 tokens free: with the most idle resident's 20 it is 30, not enough; with the
    # next one's 30 it is 60; the busier resident stays. The first (2 blocks) fits the
    # CPU tier's 3 free blocks, the second no longer does: it is discarded.
    assert promotions(waiting, 10, residents, cpu_free_blocks=3) == (
        ["c"],
        [Demotion("idler", Tier.CPU, lazy=False), Demotion("idle", Tier.WAITING, lazy=False)],
    )
    # Residents busier than the waiting program are never displaced.
    assert promotions(waiting, 10, residents[2:], cpu_free_blocks=3) == ([], [])


def test_nothing_moves_while_the_gpu_tier_fits() -> None:
    engine = _engine()
    view = _view(0.0, pins=[PinData("A", 2, 32)], running=[call("B")])
    engine.tick(view)
    assert list(engine.tick(replace(view, now=5.0))) == []


def test_a_reasoning_victim_finishes_its_call_then_is_offloaded_and_gated() -> None:
    engine = _engine()
    b0 = call("B", 0, prompt_tokens=100, arrival_s=0.0)
    engine.tick(_view(0.0, running=[b0]))
    # Only Reasoning programs: B (100 tokens) > 4 blocks; demoted lazily, nothing now.
    assert list(engine.tick(_view(5.0, total_blocks=4, running=[b0]))) == []
    assert engine.tier("B") is Tier.GPU
    # Its call ends: its KV goes to the CPU tier, and the next check gates it.
    assert engine.on_call_finished(b0, _view(5.5, total_blocks=4)) == Offload()
    assert engine.tier("B") is Tier.CPU
    assert list(engine.tick(_view(5.6, total_blocks=4))) == [
        SessionAction("pause", "B", Tier.CPU.pause_reason)
    ]


def test_a_victim_without_room_in_the_cpu_tier_is_discarded() -> None:
    engine = _engine()
    b0 = call("B", 0, prompt_tokens=100, arrival_s=0.0)
    engine.tick(EngineData(now=0.0, running=[b0]))
    engine.tick(EngineData(now=5.0, total_blocks=4, running=[b0]))  # no CPU tier
    assert engine.on_call_finished(b0, EngineData(now=6.0, total_blocks=4)) == Release()
    assert engine.tier("B") is Tier.WAITING
    # Its gate says it is in the Waiting tier: the gateway may place it anew.
    gate = list(engine.tick(EngineData(now=6.1, total_blocks=4)))
    assert gate == [SessionAction("pause", "B", "mori: waiting tier")]


def test_busy_programs_calls_run_before_idle_ones() -> None:
    engine = _engine()
    a0, b0 = call("A", 0, arrival_s=0.0), call("B", 0, prompt_tokens=100, arrival_s=1.0)
    engine.tick(_view(0.0, running=[a0, b0]))
    engine.tick(_view(5.0, total_blocks=4, running=[a0, b0]))  # B demoted lazily
    engine.on_call_finished(b0, _view(5.5, total_blocks=4))
    late = call("B", 1, arrival_s=6.0)  # came before its gate: on the GPU again
    engine.tick(_view(6.0, waiting=[late]))
    assert engine.tier("B") is Tier.GPU
    engine.on_event(SessionEnd(session_id="B"))
    assert engine.tier("B") is None


# --- the admission of new programs -------------------------------------------------------


def test_new_programs_wait_behind_a_gated_program_with_a_call_then_go_smallest_first() -> None:
    admission = MoriAdmission()
    queue = [SessionData("big", 300), SessionData("small", 100, arrival_s=1.0)]
    view = AdmissionData(kv=kv_stats(free_blocks=64))
    admission.on_event(SessionPause(session_id="gated"))
    # Gated but still at its tool: new programs go in, the smallest first.
    assert [s.session_id for s in admission.admit(queue, view)] == ["small", "big"]
    admission.on_event(LLMSubmit(session_id="gated", call_id="gated/3"))
    assert list(MoriAdmission.admit(admission, queue, view)) == []
    admission.on_event(SessionResume(session_id="gated"))
    assert [s.session_id for s in admission.admit(queue[:1], view)] == ["big"]


def _two_replicas(free: list[int]) -> StreamAdmissionView:
    figures = [kv_stats(free_blocks=blocks) for blocks in free]
    return StreamAdmissionView(
        clock=lambda: 0.0,
        block_size=16,
        tool_cores=4,
        kv_sources=[lambda i=i: figures[i] for i in range(2)],  # type: ignore[misc]
        replicas=2,
    )


def test_a_waiting_program_moves_to_the_replica_with_the_most_room_if_its_own_has_none() -> None:
    # The Waiting queue is global (§4.1): a program whose KV was discarded may come back
    # on any replica, the one with the most room first (BFD, §4.3.1), when its own has
    # no room for it (ours: its own may still cache part of it); a CPU-tier one keeps
    # its replica (its KV is in that replica's CPU memory).
    admission = MoriAdmission()
    view = _two_replicas([4, 20])  # 64 and 320 tokens of room
    admission.on_event(SessionPause(session_id="w", reason=Tier.WAITING.pause_reason))
    admission.on_event(SessionPause(session_id="c", reason=Tier.CPU.pause_reason))
    assert admission.moves(SessionData("c", 100), 0, view) is None
    assert admission.moves(SessionData("w", 400), 0, view) is None  # fits nowhere
    assert admission.moves(SessionData("w", 100), 1, view) is None  # its own has room
    assert admission.moves(SessionData("w", 60), 0, view) is None  # so has this one
    assert admission.moves(SessionData("w", 100), 0, view) == 1
    # Its prompt now counts against replica 1's room until it starts.
    assert admission.room(view) == {0: 64, 1: 220}
    # Moved, or promoted where it was: no longer Waiting.
    admission.on_event(SessionMove(session_id="w", from_replica=0, to_replica=1))
    assert admission.moves(SessionData("w", 100), 0, view) is None
    admission.on_event(SessionPause(session_id="w2", reason=Tier.WAITING.pause_reason))
    admission.on_event(SessionResume(session_id="w2"))
    assert admission.moves(SessionData("w2", 10), 0, view) is None


# --- on the simulator --------------------------------------------------------------------


class _Checked(MoriEngine):
    """MORI whose every tick checks the tiers' capacities after its moves."""

    def tick(self, view: EngineView) -> list[SessionAction]:  # type: ignore[override]
        actions = list(super().tick(view))
        cpu_held = sum(p.cpu_blocks for p in self._programs.values() if p.tier is Tier.CPU)
        assert cpu_held <= view.cpu_total_blocks
        assert view.cpu_total_blocks - view.cpu_free_blocks <= view.cpu_total_blocks
        return actions


class _CheckedMori(Mori):
    name = "mori-checked"

    def engine(self) -> MoriEngine:
        return _Checked(MoriSettings())


def _crowded_workload() -> object:
    """Eight programs whose contexts outgrow the GPU (160 blocks, 2,560 tokens): four
    busy ones (ten calls with 0.5 s tools, growing to ~1,500 tokens each) and four idle
    ones (a 30 s tool after their first call)."""
    busy = [(300, 16, 0.5)] + [(100, 16, 0.5)] * 8 + [(100, 16, None)]
    idle = [(300, 16, 30.0), (100, 16, 0.5), (100, 16, None)]
    return workload(
        *(
            session(f"p{index}", idle if index % 2 else busy, arrival_s=0.1 * index)
            for index in range(8)
        )
    )


def _run(policy: Mori) -> tuple[object, list[tuple[float, str, str]]]:
    """The crowded workload under MORI; the run's record and its pauses and resumes
    (time, kind, session)."""
    # Two calls at a time: the others wait, and their prompts count in the GPU tier's
    # demand before the engine itself runs short of blocks.
    profile = flat_profile(num_gpu_blocks=160, cpu_kv_blocks=80, max_num_seqs=2)
    engine = SimEngine(
        _crowded_workload(),  # type: ignore[arg-type]
        policy,
        profile,
        SimConfig(tool_cores=8),
    )
    moves: list[tuple[float, str, str]] = []
    emit = engine.emit

    def record(event: AnyEvent) -> None:
        if isinstance(event, SessionPause | SessionResume):
            moves.append((engine.now, event.kind, event.session_id))
        emit(event)

    engine.emit = record  # type: ignore[method-assign]
    engine.admission.publish = engine.engine_half.publish = record
    return engine.run(), moves


def _cached(record: object, session_id: str, turn: int) -> int:
    sessions = record.sessions  # type: ignore[attr-defined]
    found = next(s for s in sessions if s.session_id == session_id)
    return next(c.cached_tokens or 0 for c in found.calls if c.turn == turn)


def test_on_the_simulator_demoted_programs_come_back_with_their_kv_from_the_cpu_tier() -> None:
    record, moves = _run(_CheckedMori())
    assert len(record.sessions) == 8  # type: ignore[attr-defined]
    paused = [sid for _, kind, sid in moves if kind == "session_pause"]
    resumed = [sid for _, kind, sid in moves if kind == "session_resume"]
    assert paused and sorted(paused) == sorted(resumed)
    # Each demoted program's call after its pause loaded its context from the CPU tier
    # (its first turn: 300 prompt tokens + 16 output, 19 full blocks).
    for sid in set(paused):
        when = next(t for t, kind, s in moves if kind == "session_pause" and s == sid)
        turn = next(
            c.turn
            for s in record.sessions  # type: ignore[attr-defined]
            if s.session_id == sid
            for c in s.calls
            if c.submit_s > when
        )
        assert _cached(record, sid, turn) >= 19 * 16
