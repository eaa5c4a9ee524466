"""``agentmars bench admission``: the figures it prints and writes, and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from agentmars.bench.admission import run
from agentmars.cli.main import app


def test_every_policy_is_measured_at_every_idle_count(tmp_path: Path) -> None:
    out = tmp_path / "admission.json"
    result = run(100, out, ["fcfs", "thunderagent"], idle_sessions=(10, 300))
    assert json.loads(out.read_text()) == result
    assert (result["calls"], result["idle_sessions"]) == (100, [10, 300])
    for policy in ("fcfs", "thunderagent"):
        rows = result[policy]
        assert rows["10"]["p50"] > 0 and rows["300"]["p99"] >= rows["300"]["p50"]
        assert rows["ratio"] == max(rows["10"]["p50"], rows["300"]["p50"]) / rows["10"]["p50"]
        assert isinstance(rows["flat"], bool)


def test_an_unknown_policy_is_refused() -> None:
    done = CliRunner().invoke(app, ["bench", "admission", "--policies", "fcfs,nope"])
    assert done.exit_code == 2
    assert "unknown policies ['nope']" in done.output
