"""docs/writing-a-policy.md's example, as written: loaded from outside the project
through ``AGENTMARS_POLICY_MODULES``, listed, and run on the simulator beside FCFS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "writing-a-policy.md"
AGENTMARS = Path(sys.executable).parent / "agentmars"


def _example_module() -> str:
    section = DOC.read_text(encoding="utf-8").split("## 3. The example", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def module_dir(tmp_path: Path) -> Path:
    (tmp_path / "my_policy.py").write_text(_example_module(), encoding="utf-8")
    return tmp_path


def _agentmars(args: list[str], cwd: Path, modules: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTMARS_POLICY_MODULES": modules, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(AGENTMARS), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_example_is_listed_with_its_first_sentence(module_dir: Path) -> None:
    listed = _agentmars(["sim", "policies"], module_dir, "my_policy")
    assert listed.returncode == 0, listed.stderr
    assert "Least-served first inside a shrinking window." in listed.stdout


def test_the_example_runs_on_the_simulator_beside_fcfs(module_dir: Path) -> None:
    out = module_dir / "out"
    args = ["sim", "run", "--workload", "ilr-1", "--rates", "0.5", "--sessions", "6"]
    args += ["--policies", "example:window=2,fcfs", "--profile", "cpu-tiny"]
    ran = _agentmars([*args, "--out", str(out), "--no-report"], module_dir, "my_policy")
    assert ran.returncode == 0, ran.stderr
    runs = json.loads((out / "results.json").read_text(encoding="utf-8"))["runs"]
    summaries = {run["summary"]["policy"]: run["summary"] for run in runs}
    assert sorted(summaries) == ["example:window=2", "fcfs"]
    assert [summary["unfinished"] for summary in summaries.values()] == [0, 0]


def test_a_module_that_does_not_import_stops_the_command(module_dir: Path) -> None:
    refused = _agentmars(["sim", "policies"], module_dir, "my_policy,not_there")
    assert refused.returncode == 2
    assert "AGENTMARS_POLICY_MODULES: cannot import not_there" in refused.stderr
    assert "Traceback" not in refused.stderr
