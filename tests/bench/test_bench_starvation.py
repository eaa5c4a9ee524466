"""Seed 004 §5.3's starvation benchmark (``agentmars bench starvation``): the job times
it reads off a run, worked out by hand; a small run end to end on the simulator; bad
input refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentmars.bench.starvation import growth, job_times
from agentmars.cli.main import app
from agentmars.server.metrics.records import RunRecord, SessionRecord


def record(*sessions: SessionRecord) -> RunRecord:
    return RunRecord("w", "p", "sim", 1, list(sessions), 0.0, 10, 16, 1)


def test_the_elephant_is_the_first_instance_and_a_job_spans_its_sessions() -> None:
    run = record(
        SessionRecord("e.0", "MRS", 0.0, 0.0, 30.0, task_id="e"),
        SessionRecord("e.1", "MRS", 0.0, 0.0, 50.0, task_id="e"),
        SessionRecord("m1.0", "CC", 1.0, 1.0, 5.0, task_id="m1"),
        SessionRecord("m2.0", "CC", 2.0, 2.0, 4.0, task_id="m2"),
        SessionRecord("m2.1", "CC", 2.0, 2.0, 12.0, task_id="m2"),
    )
    # The elephant: 0 to 50; mice: 1-5 (4 s) and 2-12 (10 s).
    assert job_times(run) == {"elephant_jct_s": 50.0, "mice_mean_jct_s": 7.0, "unfinished": 0.0}
    points = [
        {"policy": "a", "mice": 10, "elephant_jct_s": 20.0},
        {"policy": "a", "mice": 40, "elephant_jct_s": 50.0},
        {"policy": "b", "mice": 40, "elephant_jct_s": 30.0},
        {"policy": "b", "mice": 10, "elephant_jct_s": 30.0},
    ]
    assert growth(points) == {"a": 2.5, "b": 1.0}


def test_a_small_run_writes_its_figures_and_plot(tmp_path: Path) -> None:
    args = ["bench", "starvation", "--mice", "3,1", "--policies", "justitia,fcfs"]
    args += ["--profile", "a100-gptj-6b", "--out", str(tmp_path)]
    args += ["--json", str(tmp_path / "r.json")]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    figures = json.loads((tmp_path / "r.json").read_text())
    assert [(p["mice"], p["policy"]) for p in figures["points"]] == [
        (1, "justitia"), (1, "fcfs"), (3, "justitia"), (3, "fcfs"),
    ]  # fmt: skip
    assert all(p["elephant_jct_s"] > 0 and p["unfinished"] == 0 for p in figures["points"])
    assert set(figures["growth"]) == {"justitia", "fcfs"}
    assert (tmp_path / "starvation.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mice", "0"], "mice counts >= 1"),
        (["--mice", "x"], "invalid literal"),
        (["--policies", "nope"], "unknown policy 'nope'"),
        (["--profile", "no-such-profile"], "no-such-profile"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    done = CliRunner().invoke(app, ["bench", "starvation", *args])
    assert done.exit_code == 2
    assert message in done.output
