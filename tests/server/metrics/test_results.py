"""results.json: the sweep's results survive a round trip; bad files are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmars.server.metrics.results import RunResult, SweepResult
from agentmars.server.metrics.summary import summarize
from tests.server.metrics.records_factory import call, run, session


def _sweep() -> SweepResult:
    record = run(
        [session("a", 0, 4, calls=[call(0, 0, 1.0, 4, 1.0)])], duration_s=4, evictions=[(1, 2)]
    )
    ideal = {"a": session("a", 0, 2, calls=[call(0, 0, 0.5, 4, 0.5)])}
    return SweepResult(
        config={"workloads": ["toy"], "rates": [0.5], "profile": "h100-qwen3", "seed": 7},
        runs=[
            RunResult(rate=0.5, summary=summarize(record, ideal)),
            RunResult(rate=None, summary=summarize(record)),
        ],
    )


def test_results_round_trip_through_json(tmp_path: Path) -> None:
    sweep = _sweep()
    path = tmp_path / "out" / "results.json"
    sweep.write(path)
    again = SweepResult.read(path)
    assert again == sweep
    assert (again.runs[0].workload, again.runs[0].policy, again.runs[0].rate) == (
        "toy",
        "fcfs",
        0.5,
    )
    assert again.runs[0].summary.goodput == {1.0: 0.0, 2.0: 0.25, 3.0: 0.25}


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope.json: cannot read"):
        SweepResult.read(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ('{"version": 2, "runs": []}', "version"),
        ('{"runs": [{"rate": -1, "summary": {}}]}', "runs.0.rate"),
        ('{"runs": [], "extra": 1}', "extra"),
        ("not json", "Invalid JSON"),
    ],
)
def test_a_bad_results_file_names_the_field(tmp_path: Path, content: str, field: str) -> None:
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"results.json: not a valid results file: .*{field}"):
        SweepResult.read(path)
