"""A workload's tool as a sandbox command: its action by kind, its size, and real runs
in the sandbox pool on a session's repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmars.runtime.replay import tools
from agentmars.runtime.replay.repository import FUNCTIONS, write_repository
from agentmars.runtime.replay.tools import (
    EDIT_SCRIPT,
    PYTHON,
    TIMEOUT_MARGIN_S,
    UNITTEST,
    ToolCost,
    action,
    tool_exec,
)
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecResult
from agentmars.server.workloads.model import ToolSpec

PAD = Path(tools.__file__).with_name("pad.py").read_text()


# --- the command ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("read", ["cat", "toolkit/text.py"]),
        ("Read", ["cat", "toolkit/text.py"]),
        ("search", ["grep", "-rn", "return", "toolkit", "tests"]),
        ("edit", [PYTHON, "-c", EDIT_SCRIPT, "4"]),
        ("test", UNITTEST),
        ("test-suite", UNITTEST),
        ("bash", UNITTEST),
        ("exec_command", UNITTEST),
        ("build", [PYTHON, "-m", "compileall", "-q", "toolkit"]),
        ("api", []),
        ("wait", []),
        ("WebSearch", []),
    ],
)
def test_each_kind_has_its_action(kind: str, expected: list[str]) -> None:
    assert action(kind, 4) == expected


def test_the_unittest_action_runs_the_suite_quietly() -> None:
    assert UNITTEST == ["python3", "-m", "unittest", "discover", "-s", "tests", "-q"]


def test_the_edit_action_names_its_turn() -> None:
    assert action("edit", 7)[-1] == "7"
    assert action("edit", 8)[-1] == "8"


def test_a_tool_is_padded_to_its_scaled_size() -> None:
    # cores = 5.0 / 2.0 = 2.5 -> 3 processes; scale 0.5: wall 1.0 s, cpu 2.5 s.
    spec = tool_exec(ToolSpec(kind="build", wall_s=2.0, cpu_s=5.0), 3, scale=0.5)
    assert spec.command[:3] == [PYTHON, "-c", PAD]
    assert spec.command[3:6] == ["1.000000", "2.500000", "3"]
    assert spec.command[6:] == ["--", PYTHON, "-m", "compileall", "-q", "toolkit"]
    assert spec.timeout_s == pytest.approx(1.0 + TIMEOUT_MARGIN_S)


def test_a_tool_that_waits_runs_one_process_and_no_action() -> None:
    spec = tool_exec(ToolSpec(kind="api", wall_s=0.3), 1)
    assert spec.command[3:] == ["0.300000", "0.000000", "1"]
    assert spec.timeout_s == pytest.approx(0.3 + TIMEOUT_MARGIN_S)


def test_a_zero_length_tool_still_has_one_process() -> None:
    spec = tool_exec(ToolSpec(kind="read", wall_s=0.0), 2, scale=3.0)
    assert spec.command[3:] == ["0.000000", "0.000000", "1", "--", "cat", "toolkit/text.py"]
    assert spec.timeout_s == pytest.approx(TIMEOUT_MARGIN_S)


def test_a_whole_core_is_one_process() -> None:
    spec = tool_exec(ToolSpec(kind="bash", wall_s=1.5, cpu_s=1.5), 1, scale=2.0)
    assert spec.command[3:6] == ["3.000000", "3.000000", "1"]
    assert spec.timeout_s == pytest.approx(3.0 + TIMEOUT_MARGIN_S)


# --- real runs in the sandbox pool ------------------------------------------------------


@pytest.fixture
def pool(started_pool: SandboxPool) -> SandboxPool:
    write_repository(started_pool.open_session("s1"), 3)
    return started_pool


async def _run(pool: SandboxPool, tool: ToolSpec, call_id: str, turn: int = 1) -> ExecResult:
    return await pool.run("s1", tool_exec(tool, turn), tool=tool.kind, call_id=call_id, turn=turn)


async def test_a_read_shows_the_text_module(pool: SandboxPool) -> None:
    result = await _run(pool, ToolSpec(kind="read", wall_s=0.0), "r")
    assert (result.status, result.exit_status) == ("ok", 0)
    assert result.stdout == (pool.workspace("s1") / "toolkit/text.py").read_text()
    assert "def tag_0(text: str) -> str:" in result.stdout


async def test_an_edit_then_a_test_run_passes(pool: SandboxPool) -> None:
    edited = await _run(pool, ToolSpec(kind="edit", wall_s=0.0), "e", turn=2)
    assert (edited.status, edited.exit_status) == ("ok", 0), edited.stderr
    assert "def added_2" in (pool.workspace("s1") / "toolkit/numbers.py").read_text()
    tested = await _run(pool, ToolSpec(kind="test", wall_s=0.0), "t", turn=2)
    assert (tested.status, tested.exit_status) == ("ok", 0), tested.stderr
    assert f"Ran {2 * FUNCTIONS + 1} tests" in tested.stderr
    assert tested.stderr.rstrip().endswith("OK")


async def test_a_tool_burns_its_cpu_and_lasts_its_wall_time(pool: SandboxPool) -> None:
    result = await _run(pool, ToolSpec(kind="search", wall_s=0.6, cpu_s=0.3), "s")
    assert (result.status, result.exit_status) == ("ok", 0), result.stderr
    assert "toolkit/numbers.py" in result.stdout
    assert result.wall_s >= 0.6
    assert result.cpu_s is not None
    assert result.cpu_s >= 0.25


async def test_a_waiting_tool_lasts_without_using_cpu(pool: SandboxPool) -> None:
    result = await _run(pool, ToolSpec(kind="api", wall_s=0.3), "a")
    assert (result.status, result.exit_status) == ("ok", 0), result.stderr
    assert result.wall_s >= 0.3
    assert result.cpu_s is not None
    assert result.cpu_s < 0.15


def test_the_hosts_cost_starts_every_tool_and_an_action_longer_than_the_padding_wins() -> None:
    # Measured: the sandbox's start 0.05 s (0.04 s of CPU); an empty test run 0.25 s
    # (0.2 s of CPU: the start and the suite).
    cost = ToolCost(start=(0.05, 0.04), by_kind={"test": (0.25, 0.2)})
    # A test run sized 1 s and 1 s of CPU pads past its suite: the start, then its size.
    long = cost.apply(ToolSpec(kind="test", wall_s=1.0, cpu_s=1.0))
    assert (long.wall_s, long.cpu_s) == pytest.approx((1.05, 1.04))
    # Sized 0.1 s, its suite is longer than its size: the suite's figures stand.
    short = cost.apply(ToolSpec(kind="test", wall_s=0.1, cpu_s=0.1))
    assert (short.wall_s, short.cpu_s) == pytest.approx((0.25, 0.2))
    # A kind not measured (a remote API's wait) pays the start only.
    wait = cost.apply(ToolSpec(kind="api", wall_s=2.0))
    assert (wait.wall_s, wait.cpu_s) == pytest.approx((2.05, 0.04))
    assert ToolCost().apply(long) == long
