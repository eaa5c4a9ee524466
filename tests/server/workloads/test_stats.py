"""Workload statistics, on a workload worked by hand."""

from __future__ import annotations

import json

import pytest

from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload
from agentmars.server.workloads.stats import main, stats_table, workload_stats

WORKLOAD = Workload(
    name="hand",
    sessions=(
        SessionSpec(
            session_id="s1",
            turns=(
                TurnSpec(
                    append_tokens=100,
                    output_tokens=10,
                    tool=ToolSpec(kind="bash", wall_s=1.0, cpu_s=1.0),
                ),
                TurnSpec(append_tokens=20, output_tokens=5, tool=ToolSpec(kind="web", wall_s=3.0)),
                TurnSpec(append_tokens=30, output_tokens=5),
            ),
        ),
        SessionSpec(session_id="s2", turns=(TurnSpec(append_tokens=50, output_tokens=10),)),
    ),
)


def test_statistics_by_hand() -> None:
    stats = workload_stats(WORKLOAD)
    # s1's prompts: 100, 100 + 10 + 20 = 130, 130 + 5 + 30 = 165 (sum 395; final
    # context 170); s2's: 50 (final 60).
    assert (stats.sessions, stats.turns_mean, stats.turns_sd) == (2, 2.0, 1.0)
    assert (stats.first_prompt_mean, stats.append_mean, stats.output_mean) == (75.0, 25.0, 7.5)
    assert (stats.prompt_volume_mean, stats.prompt_volume_sd) == (222.5, 172.5)
    assert (stats.final_context_mean, stats.final_context_max) == (115.0, 170)
    assert (stats.tool_calls, stats.tool_mean_s, stats.tool_sd_s) == (2, 2.0, 1.0)
    # Percentiles interpolate linearly between 1 s and 3 s.
    assert (stats.tool_p50_s, stats.tool_p90_s, stats.tool_p99_s) == pytest.approx((2.0, 2.8, 2.98))
    assert stats.tool_under_2s == 0.5
    assert stats.tool_cores == 0.25  # 1 core-second over 4 s


def test_table_has_a_row_per_workload() -> None:
    table = stats_table({"hand": workload_stats(WORKLOAD)}).splitlines()
    assert table[0].startswith("| workload | sessions | turns |")
    assert table[2].startswith("| hand | 2 | 2.00 ± 1.00 | 75 | 25 | 8 | 222 ± 172 |")


def test_command_line_prints_markdown_or_json(capsys: pytest.CaptureFixture[str]) -> None:
    main(["react", "--sessions", "10"])
    assert capsys.readouterr().out.splitlines()[2].startswith("| react | 10 |")
    main(["bfcl", "--sessions", "5", "--json"])
    assert json.loads(capsys.readouterr().out)["bfcl"]["sessions"] == 5
