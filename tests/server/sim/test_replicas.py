"""Several engine replicas behind one gateway (seed 003 §6.2.2): each session is placed
on one replica by the admission half (``AdmissionHalf.place``) and every call of it
runs there (affinity); each replica has its own KV, scheduler and engine half, and its
own KV figures reach the gateway."""

from __future__ import annotations

from collections import defaultdict

import pytest

from agentmars.sdk.events import AnyEvent, SessionEnd, SessionMove
from agentmars.server.metrics.summary import summarize
from agentmars.server.policies.fcfs import FCFS
from agentmars.server.policies.interface import AdmissionHalf, EngineHalf, KVDecision, Pin, Policy
from agentmars.server.policies.registry import make_policy
from agentmars.server.policies.views import AdmissionView, CallView, EngineView, SessionView
from agentmars.server.sim.engine import SimConfig, SimEngine, SimError
from tests.server.sim.factories import flat_profile, session, workload


def _sessions(count: int, prompt: int = 100, apart_s: float = 0.05) -> object:
    return workload(
        *(
            session(f"s{i}", [(prompt, 8, 0.5), (50, 8, 0.5), (50, 8, None)], arrival_s=apart_s * i)
            for i in range(count)
        )
    )


def _note_finished_calls(engine: SimEngine) -> list[tuple[str, int]]:
    """(session, replica) of each call the engine will finish, in order (a session's
    last call asks no decision, so it is not noted)."""
    finished: list[tuple[str, int]] = []
    for replica in engine.replicas:
        half = replica.engine_half
        decide = half.on_call_finished

        def note(call: CallView, view: EngineView, index: int = replica.index, f=decide):  # type: ignore[no-untyped-def]
            finished.append((call.session_id, index))
            return f(call, view)

        half.on_call_finished = note  # type: ignore[method-assign]
    return finished


def _where_calls_ran(engine: SimEngine) -> dict[str, set[int]]:
    """Run, noting on which replica each finished call of each session ran."""
    finished = _note_finished_calls(engine)
    engine.run()
    ran: dict[str, set[int]] = defaultdict(set)
    for session_id, index in finished:
        ran[session_id].add(index)
    return ran


@pytest.mark.parametrize("policy", ["fcfs", "thunderagent", "mori", "mars"])
def test_every_call_of_a_session_runs_on_the_replica_it_was_placed_on(policy: str) -> None:
    profile = flat_profile(num_gpu_blocks=64, cpu_kv_blocks=64)
    engine = SimEngine(
        _sessions(8),  # type: ignore[arg-type]
        make_policy(policy),
        profile,
        SimConfig(tool_cores=4, replicas=2),
    )
    ran = _where_calls_ran(engine)
    assert len(engine.record.sessions) == 8
    assert all(len(replicas) == 1 for replicas in ran.values()), ran
    # Both replicas served sessions.
    assert {index for replicas in ran.values() for index in replicas} == {0, 1}
    assert engine.record.total_blocks == 128
    assert engine.record.engine.endswith(" x2")


def test_by_default_a_session_goes_to_the_replica_with_the_fewest_sessions() -> None:
    engine = SimEngine(
        _sessions(6),  # type: ignore[arg-type]
        FCFS(),
        flat_profile(),
        SimConfig(tool_cores=4, replicas=3),
    )
    ran = _where_calls_ran(engine)
    # Arrivals 50 ms apart, each session lasting over a second: all six are placed
    # while the others run, two on each replica, in turn.
    assert [next(iter(ran[f"s{i}"])) for i in range(6)] == [0, 1, 2, 0, 1, 2]


def test_thunderagent_places_each_program_on_the_replica_with_the_most_room() -> None:
    # All arrive at once, before any runs: 1,024 tokens of room on each replica; s0 to
    # replica 0 (equal room: the first), s1 to replica 1 (1,024 > 724), s2 to 0, s3 to 1.
    engine = SimEngine(
        _sessions(4, prompt=300, apart_s=0.0),  # type: ignore[arg-type]
        make_policy("thunderagent"),
        flat_profile(num_gpu_blocks=64),
        SimConfig(tool_cores=4, replicas=2),
    )
    ran = _where_calls_ran(engine)
    assert [next(iter(ran[f"s{i}"])) for i in range(4)] == [0, 1, 0, 1]
    # Each replica's engine half heard only its own sessions' events and figures.
    views = engine.admission_view.replicas
    assert [replica.index for replica in views] == [0, 1]
    assert all(replica.kv is not None and replica.kv.total_blocks == 64 for replica in views)
    assert engine.admission_view.kv is not None and engine.admission_view.kv.total_blocks == 128


class _Nowhere(AdmissionHalf):
    def place(self, session: SessionView, view: AdmissionView) -> int:
        return len(view.replicas)


class _PlacesNowhere(Policy):
    name = "places-nowhere"

    def admission(self) -> AdmissionHalf:
        return _Nowhere()


def test_a_placement_outside_the_replicas_is_an_error_naming_the_policy() -> None:
    engine = SimEngine(
        _sessions(1),  # type: ignore[arg-type]
        _PlacesNowhere(),
        flat_profile(),
        SimConfig(replicas=2),
    )
    with pytest.raises(SimError, match=r"places-nowhere.*replica 2; there are 2"):
        engine.run()


@pytest.mark.parametrize("replicas", [0, -1, 1.5, True])
def test_the_replica_count_is_a_positive_integer(replicas: object) -> None:
    with pytest.raises(SimError, match="replicas must be an integer >= 1"):
        SimConfig(replicas=replicas)  # type: ignore[arg-type]


def test_one_replica_is_the_single_engine() -> None:
    engine = SimEngine(_sessions(2), FCFS(), flat_profile())  # type: ignore[arg-type]
    record = engine.run()
    assert len(engine.replicas) == 1 and record.engine == "sim:test-flat"
    assert engine.kv is engine.replicas[0].kv


# --- moves ------------------------------------------------------------------------------


class _Hop(AdmissionHalf):
    """Moves a session to the next replica at each of its calls."""

    def moves(self, session: SessionView, current: int, view: AdmissionView) -> int | None:
        return (current + 1) % len(view.replicas)


class _PinsAndListens(EngineHalf):
    """Pins every session's KV after its calls; keeps the session ends it hears."""

    def __init__(self) -> None:
        self.ended: list[SessionEnd] = []

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, SessionEnd):
            self.ended.append(event)

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        return Pin()


class _Hopper(Policy):
    name = "test-hopper"

    def admission(self) -> AdmissionHalf:
        return _Hop()

    def engine(self) -> EngineHalf:
        return _PinsAndListens()


def test_a_moved_session_runs_on_its_new_replica_and_the_old_one_forgets_it() -> None:
    engine = SimEngine(
        _sessions(1),  # type: ignore[arg-type]
        _Hopper(),
        flat_profile(num_gpu_blocks=64),
        SimConfig(tool_cores=4, replicas=2),
    )
    finished = _note_finished_calls(engine)
    moves: list[SessionMove] = []
    pinned_at_moves: list[list[int]] = []
    emit = engine.emit

    def watch(event: AnyEvent) -> None:
        if isinstance(event, SessionMove):
            moves.append(event)
            pinned_at_moves.append([replica.kv.pinned_blocks for replica in engine.replicas])
        emit(event)

    engine.emit = watch  # type: ignore[method-assign]
    record = engine.run()
    # Three calls: placed on 0, moved to 1 for the second, back to 0 for the third (the
    # last call's end is not asked for a decision, so two notes).
    assert finished == [("s0", 0), ("s0", 1)]
    assert [(m.from_replica, m.to_replica) for m in moves] == [(0, 1), (1, 0)]
    # Each replica left heard the session end there; then its real end reached the last.
    halves = [replica.engine_half for replica in engine.replicas]
    assert [e.error for e in halves[0].ended] == ["moved to replica 1", None]  # type: ignore[attr-defined]
    assert [e.error for e in halves[1].ended] == ["moved to replica 0"]  # type: ignore[attr-defined]
    # The pin the session held on the replica it left went with each move.
    assert pinned_at_moves == [[0, 0], [0, 0]]
    assert record.sessions[0].moves == 2
    summary = summarize(record)
    assert (summary.moved_sessions, summary.moves_per_session) == (1.0, 2.0)
