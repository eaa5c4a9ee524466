"""Reshaping a workload for a smaller stage: first turns, scaled tools, fitted context."""

from __future__ import annotations

import math

import pytest

from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload
from agentmars.server.workloads.reshape import first_turns, fit_context, scale_tools

BASH = ToolSpec(kind="bash", wall_s=0.8, cpu_s=0.4)
API = ToolSpec(kind="api", wall_s=2.0)


def turn(append: int, output: int, tool: ToolSpec | None = None) -> TurnSpec:
    return TurnSpec(append_tokens=append, output_tokens=output, tool=tool)


# Final contexts: x 100 + 20 + 30 + 10 = 160, y 40 + 15 + 3 + 1 = 59.
X = SessionSpec(
    session_id="x",
    arrival_s=1.5,
    agent="coder",
    prefix_group="g",
    shared_prefix_tokens=10,
    turns=(turn(100, 20, BASH), turn(30, 10)),
)
Y = SessionSpec(session_id="y", turns=(turn(40, 15, API), turn(3, 1)))
LONG = SessionSpec(
    session_id="long",
    task_id="t",
    turns=(turn(10, 1, BASH), turn(5, 2, API), turn(6, 3, BASH), turn(7, 4)),
)
WORKLOAD = Workload(name="w", seed=9, arrival="closed", concurrency=2, sessions=(X, Y, LONG))


# --- first_turns ------------------------------------------------------------------


def test_longer_sessions_are_cut_and_end_without_a_tool() -> None:
    cut = first_turns(WORKLOAD, 2)
    long = cut.sessions[2]
    assert long.turns == (turn(10, 1, BASH), turn(5, 2))
    assert (long.session_id, long.task_id) == ("long", "t")


def test_sessions_that_fit_are_unchanged() -> None:
    cut = first_turns(WORKLOAD, 2)
    assert cut.sessions[:2] == (X, Y)
    assert (cut.name, cut.seed, cut.arrival, cut.concurrency) == ("w", 9, "closed", 2)
    assert first_turns(WORKLOAD, 4) == WORKLOAD


def test_one_turn_keeps_the_first_call_only() -> None:
    cut = first_turns(WORKLOAD, 1)
    assert [session.turns for session in cut.sessions] == [
        (turn(100, 20),),
        (turn(40, 15),),
        (turn(10, 1),),
    ]
    assert cut.sessions[0].shared_prefix_tokens == 10


@pytest.mark.parametrize("max_turns", [0, -1])
def test_fewer_than_one_turn_is_refused(max_turns: int) -> None:
    with pytest.raises(ValueError, match="max_turns must be at least 1"):
        first_turns(WORKLOAD, max_turns)


# --- scale_tools ------------------------------------------------------------------


def test_tools_are_scaled_in_time_and_cpu_not_in_cores() -> None:
    scaled = scale_tools(WORKLOAD, 2.5)
    bash = scaled.sessions[0].turns[0].tool
    assert bash is not None
    assert bash.kind == "bash"
    assert bash.wall_s == pytest.approx(2.0)
    assert bash.cpu_s == pytest.approx(1.0)
    assert bash.cores == pytest.approx(BASH.cores)
    api = scaled.sessions[1].turns[0].tool
    assert api is not None
    assert api.wall_s == pytest.approx(5.0)
    assert api.cpu_s == 0.0
    assert scaled.sessions[0].turns[1].tool is None
    assert [t.append_tokens for t in scaled.sessions[2].turns] == [10, 5, 6, 7]
    assert scaled.sessions[2].tool_wall_s == pytest.approx(2.5 * (0.8 + 2.0 + 0.8))


def test_a_zero_scale_makes_tools_instant() -> None:
    scaled = scale_tools(WORKLOAD, 0.0)
    assert all(session.tool_wall_s == 0.0 for session in scaled.sessions)


@pytest.mark.parametrize("factor", [-0.5, math.nan, math.inf])
def test_a_negative_or_infinite_scale_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match="the tool scale must be a finite number, 0 or more"):
        scale_tools(WORKLOAD, factor)


# --- fit_context ------------------------------------------------------------------

SMALL = Workload(name="small", sessions=(X, Y))


def test_a_workload_that_fits_is_unchanged() -> None:
    assert fit_context(SMALL, 160) is SMALL
    assert fit_context(SMALL, 1000) is SMALL


def test_every_count_is_scaled_by_one_factor_and_floored() -> None:
    # Room for the clamps: 100 - (2 turns + 1) = 97; factor = 97 / 160 = 0.60625.
    fitted = fit_context(SMALL, 100)
    x, y = fitted.sessions
    # x: 60.6 -> 60, 12.1 -> 12, 18.2 -> 18, 6.06 -> 6; shared 6.06 -> 6.
    assert x.turns == (turn(60, 12, BASH), turn(18, 6))
    assert (x.shared_prefix_tokens, x.prefix_group) == (6, "g")
    # y: 24.25 -> 24, 9.09 -> 9, 1.8 -> 1, 0.6 -> 0 -> at least 1 (an output).
    assert y.turns == (turn(24, 9, API), turn(1, 1))
    assert (x.final_context, y.final_context) == (96, 35)
    assert (x.session_id, x.arrival_s, x.agent) == ("x", 1.5, "coder")


def test_clamped_counts_still_fit_and_a_zero_append_stays_zero() -> None:
    # A later turn's append of 0 is allowed and stays 0; outputs floored to 0 become 1,
    # and the factor leaves room for them, so the context still fits.
    session = SessionSpec(session_id="z", turns=(turn(10, 10, BASH), turn(0, 10)))
    fitted = fit_context(Workload(name="z", sessions=(session,)), 15)
    (z,) = fitted.sessions
    assert z.final_context <= 15
    assert z.turns[1].append_tokens == 0
    with pytest.raises(ValueError, match="cannot fit a context of 2"):
        fit_context(Workload(name="z", sessions=(session,)), 2)


def test_fitted_sessions_fit_and_keep_their_turns_and_tools() -> None:
    for max_context in (40, 77, 120, 159):
        fitted = fit_context(WORKLOAD, max_context)
        assert all(session.final_context <= max_context for session in fitted.sessions)
        for before, after in zip(WORKLOAD.sessions, fitted.sessions, strict=True):
            assert [t.tool for t in after.turns] == [t.tool for t in before.turns]
        assert (fitted.name, fitted.arrival, fitted.concurrency) == ("w", "closed", 2)
