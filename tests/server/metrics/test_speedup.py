"""One policy against the strongest of the others at each point of a sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentmars.cli.main import app
from agentmars.server.metrics.speedup import SpeedupError, compare


def run(
    policy: str, mean: float, p90: float, p95: float, goodput: float, rate: float = 0.1
) -> dict[str, Any]:
    summary = {
        "workload": "w", "policy": policy,
        "latency_s": {"mean": mean, "p90": p90, "p95": p95},
        "goodput": {"1.0": goodput, "2.0": goodput * 2},
    }  # fmt: skip
    return {"rate": rate, "summary": summary}


RESULTS = {
    "runs": [
        run("mars", 10.0, 30.0, 50.0, 0.02),
        run("a", 25.0, 40.0, 45.0, 0.01),  # strongest mean, best P95
        run("b", 40.0, 35.0, 60.0, 0.015),  # best P90 and goodput
        run("mars-x", 30.0, 0.0, 0.0, 0.0),
    ]
}


def test_each_figure_is_against_the_best_other_policy_for_that_figure() -> None:
    (row,) = compare(RESULTS, "mars", ["a", "b"], ["mars-x"])
    assert (row.best_other, row.speedup) == ("a", 2.5)
    assert row.p90_speedup == pytest.approx(35 / 30)
    assert row.p95_speedup == pytest.approx(45 / 50)
    assert row.best_other_goodput == {"1.0": 0.015, "2.0": 0.03}
    assert row.variants == {"mars-x": 3.0}


def test_a_point_without_every_policy_is_refused() -> None:
    with pytest.raises(SpeedupError, match="no run of c"):
        compare(RESULTS, "mars", ["a", "c"])
    with pytest.raises(SpeedupError, match="not a sweep"):
        compare({"runs": [{"rate": 1}]}, "mars", ["a"])


def test_the_command_prints_the_tables_and_refuses_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(RESULTS))
    out = tmp_path / "rows.json"
    args = ["sim", "speedup", str(path), "--against", "a,b", "--variants", "mars-x"]
    result = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "2.50x" in result.output and "3.00x" in result.output
    assert json.loads(out.read_text())[0]["best_other"] == "a"
    for bad in ([str(tmp_path / "missing.json")], [str(path), "--against", "a,zzz"]):
        result = CliRunner().invoke(app, ["sim", "speedup", *bad])
        assert result.exit_code == 2
        assert "Traceback" not in result.output
