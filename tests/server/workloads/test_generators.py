"""Each generator hits the statistics it is calibrated to (module docstrings and
docs/workloads.md), on large samples with a fixed seed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from agentmars.server.workloads.api_calls import INFERCEPT_CLASSES
from agentmars.server.workloads.coding import (
    CLAUDE_CODE_LONG_KINDS,
    coding_tool_calls,
    coding_tool_draws,
)
from agentmars.server.workloads.ilr import (
    GPT_OSS_CONTEXT,
    ILR_VOLUMES,
    QWEN3_CODER_CONTEXT,
    S_ILR_VOLUMES,
)
from agentmars.server.workloads.model import SessionSpec, Workload
from agentmars.server.workloads.task_parallel import AGENT_CLASSES

Build = Callable[..., Workload]


def tool_walls(sessions: tuple[SessionSpec, ...] | list[SessionSpec]) -> np.ndarray:
    return np.array([t.tool.wall_s for s in sessions for t in s.turns if t.tool is not None])


@pytest.mark.parametrize(("name", "target"), [*ILR_VOLUMES.items(), *S_ILR_VOLUMES.items()])
def test_ilr_mean_prompt_volume_is_the_target(workload: Build, name: str, target: int) -> None:
    volumes = [s.prompt_volume for s in workload(name).sessions]
    assert np.mean(volumes) == pytest.approx(target, rel=0.05)


@pytest.mark.parametrize(
    ("names", "cap"),
    [(ILR_VOLUMES, QWEN3_CODER_CONTEXT), (S_ILR_VOLUMES, GPT_OSS_CONTEXT)],
)
def test_ilr_calls_fit_the_models_context(workload: Build, names: dict[str, int], cap: int) -> None:
    for name in names:
        assert max(s.final_context for s in workload(name).sessions) <= cap


def test_ilr_regimes_differ_in_the_first_prompt_only(workload: Build) -> None:
    light, heavy = workload("ilr-1").sessions, workload("ilr-2").sessions
    # Same seed, same draws: the turns and tools are the same sessions' ...
    assert [len(s.turns) for s in light] == [len(s.turns) for s in heavy]
    assert [t.tool for s in light for t in s.turns] == [t.tool for s in heavy for t in s.turns]
    # ... and the first prompts grow, on top of OpenHands' shared 4K system prompt.
    assert np.mean([s.turns[0].append_tokens for s in heavy]) > np.mean(
        [s.turns[0].append_tokens for s in light]
    )
    assert {s.shared_prefix_tokens for s in light} == {4000}
    assert {s.prefix_group for s in light} == {"openhands-system"}


def test_coding_tool_durations_match_seed_003() -> None:
    _, drawn = coding_tool_draws(np.random.default_rng(5), 200_000, CLAUDE_CODE_LONG_KINDS)
    walls = np.array(drawn)
    p50, p90, p99 = np.percentile(walls, [50, 90, 99])
    assert p50 == pytest.approx(1.10, rel=0.10)
    assert p90 == pytest.approx(2.03, rel=0.10)
    assert p99 == pytest.approx(20.0, rel=0.10)
    assert (walls < 2.0).mean() == pytest.approx(0.87, abs=0.02)
    assert walls[walls >= 2.0].sum() / walls.sum() == pytest.approx(0.58, abs=0.03)
    assert walls.max() > 120  # the tail reaches minutes


def test_coding_tools_use_the_cpu_of_their_kind() -> None:
    tools = coding_tool_calls(np.random.default_rng(6), 20_000, CLAUDE_CODE_LONG_KINDS)
    cores = {t.kind: round(t.cpu_s / t.wall_s, 6) for t in tools}
    assert cores == {"read": 0.5, "edit": 0.5, "search": 1.0, "bash": 1.0, "test": 1.0, "wait": 0.0}


def test_coding_agent_sessions_have_tens_of_turns(workload: Build) -> None:
    turns = [len(s.turns) for s in workload("coding-agent", 1000).sessions]
    assert np.mean(turns) == pytest.approx(30, rel=0.05)


def test_swe_bench_programs_match_continuum(workload: Build) -> None:
    sessions = workload("swe-bench").sessions
    turns = np.array([len(s.turns) for s in sessions])
    assert turns.mean() == pytest.approx(10.9, rel=0.02)
    assert turns.std() == pytest.approx(2.1, rel=0.10)
    walls = tool_walls(sessions)
    assert walls.mean() == pytest.approx(0.925, rel=0.10)
    # lognormal with mean 0.925 and sd 3.55: median 0.925 / sqrt(1 + (3.55/0.925)^2)
    assert np.median(walls) == pytest.approx(0.925 / np.sqrt(1 + (3.55 / 0.925) ** 2), rel=0.10)
    volumes = np.array([s.prompt_volume for s in sessions])
    assert volumes.mean() == pytest.approx(70_000, rel=0.03)
    assert volumes.std() == pytest.approx(20_000, rel=0.10)
    assert {s.agent for s in sessions} == {"swe-bench"}


def test_bfcl_programs_match_continuum(workload: Build) -> None:
    sessions = workload("bfcl").sessions
    turns = np.array([len(s.turns) for s in sessions])
    assert turns.mean() == pytest.approx(6.3, rel=0.03)
    assert turns.std() == pytest.approx(2.3, rel=0.10)
    walls = tool_walls(sessions)
    assert walls.mean() == pytest.approx(1.923, rel=0.10)
    assert walls.std() == pytest.approx(2.133, rel=0.15)
    assert sum(t.tool.cpu_s for s in sessions for t in s.turns if t.tool) == 0.0


@pytest.mark.parametrize(
    ("name", "resume", "decode"),
    [("react", (30, 127, 56), (21, 127, 40)), ("plan-execute", (125, 421, 251), (22, 141, 60))],
)
def test_agent_loops_match_agentserve_table_1(
    workload: Build, name: str, resume: tuple[int, int, int], decode: tuple[int, int, int]
) -> None:
    sessions = workload(name).sessions
    colds = np.array([s.turns[0].append_tokens for s in sessions])
    assert colds.min() >= 2500 and colds.max() <= 3500
    assert colds.mean() == pytest.approx(3000, rel=0.01)
    assert {s.shared_prefix_tokens for s in sessions} == {0}  # cold prefills are not shared
    for values, (low, high, mean) in (
        ([t.append_tokens for s in sessions for t in s.turns[1:]], resume),
        ([t.output_tokens for s in sessions for t in s.turns], decode),
    ):
        assert low <= min(values) and max(values) <= high
        assert np.mean(values) == pytest.approx(mean, rel=0.03)
    # ToolBench (seed 001 Table 1): 2.45 +/- 1.81 calls of 1.72 s on average.
    calls = np.array([len(s.turns) - 1 for s in sessions])
    assert calls.mean() == pytest.approx(2.45, rel=0.05)
    assert calls.std() == pytest.approx(1.81, rel=0.10)
    assert tool_walls(sessions).mean() == pytest.approx(1.72, rel=0.10)


def test_infercept_classes_match_seed_001_table_1(workload: Build) -> None:
    sessions = workload("infercept").sessions
    for api in INFERCEPT_CLASSES:
        mine = [s for s in sessions if s.agent == api.kind]
        assert len(mine) / len(sessions) == pytest.approx(1 / 6, abs=0.03)
        calls = np.array([len(s.turns) - 1 for s in mine])
        assert calls.mean() == pytest.approx(api.calls[0], rel=0.08), api.kind
        assert calls.std() == pytest.approx(api.calls[1], rel=0.15), api.kind
        walls = tool_walls(mine)
        assert walls.mean() == pytest.approx(api.duration_s[0], rel=0.10), api.kind
        assert walls.std() == pytest.approx(api.duration_s[1], rel=0.15), api.kind
        assert {t.tool.kind for s in mine for t in s.turns if t.tool} == {api.kind}


def kv_token_time(session: SessionSpec) -> float:
    """Seed 004's memory-centric cost of a session: p d + d^2 / 2 per call."""
    return sum(
        session.prompt_tokens(i) * t.output_tokens + t.output_tokens**2 / 2
        for i, t in enumerate(session.turns)
    )


def test_task_parallel_classes_match_seed_004(workload: Build) -> None:
    sessions = workload("task-parallel").sessions
    size_of = {c.name: c.size for c in AGENT_CLASSES}
    agents: dict[str, list[SessionSpec]] = {}
    for session in sessions:
        agents.setdefault(session.session_id.split(".")[0], []).append(session)
    assert len(agents) == 2000
    sizes = [size_of[branches[0].agent] for branches in agents.values()]
    assert sizes.count("small") / 2000 == pytest.approx(0.72, abs=0.03)
    assert sizes.count("medium") / 2000 == pytest.approx(0.26, abs=0.03)
    assert sizes.count("large") / 2000 == pytest.approx(0.02, abs=0.01)
    cost: dict[str, list[float]] = {size: [] for size in ("small", "medium", "large")}
    for branches in agents.values():
        cost[size_of[branches[0].agent]].append(sum(kv_token_time(s) for s in branches))
    small, medium, large = (np.mean(cost[size]) for size in ("small", "medium", "large"))
    assert 3 * small < medium and 3 * medium < large
