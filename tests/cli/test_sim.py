"""``agentmars sim``, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentmars.server.metrics.results import SweepResult

CLI = [sys.executable, "-m", "agentmars.cli.main", "sim"]


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, check=False)


def test_run_writes_results_table_and_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _sim(
        "run", "--workload", "react", "--rate", "2", "--sessions", "6", "--seed", "3",
        "--policies", "fcfs,continuum,vtc", "--profile", "h100-qwen3-coder-30b", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = SweepResult.read(out / "results.json")
    assert [run.policy for run in result.runs] == ["fcfs", "continuum", "vtc"]
    for run in result.runs:
        assert run.rate == 2.0 and run.summary.sessions == 6
        assert run.summary.goodput is not None  # T_ideal came from the isolated runs
    assert result.runs[0].summary.fairness is not None  # VTC was run, so fair ratios exist
    for png in ("ttft_by_turn-react.png", "goodput-react.png", "fairness-react.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")
    assert not (out / "latency_vs_load.png").exists()  # one rate: the headline says it
    assert "index.html" in {p.name for p in out.iterdir()}
    assert not [p for p in out.iterdir() if p.name.startswith(".partial")]
    assert "continuum" in done.stdout and "react at 2 sessions/s" in done.stdout


def test_run_is_reproducible_for_a_seed(tmp_path: Path) -> None:
    args = (
        "run",
        "--workload",
        "bfcl",
        "--rate",
        "1",
        "--sessions",
        "4",
        "--policies",
        "fcfs",
        "--no-report",
    )
    first, second = (
        _sim(*args, "--out", str(tmp_path / "a")),
        _sim(*args, "--out", str(tmp_path / "b")),
    )
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    assert a == b


def test_sweep_runs_every_point_in_worker_processes(tmp_path: Path) -> None:
    done = _sim(
        "sweep", "--workloads", "react,bfcl", "--rates", "1,2", "--sessions", "3",
        "--policies", "fcfs,continuum", "--jobs", "2", "--no-report", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = SweepResult.read(tmp_path / "results.json").runs
    assert sorted((r.workload, r.rate, r.policy) for r in runs) == sorted(
        (w, rate, p)
        for w in ("react", "bfcl")
        for rate in (1.0, 2.0)
        for p in ("fcfs", "continuum")
    )


def test_listings_name_every_registered_policy_and_workload() -> None:
    policies = _sim("policies")
    assert policies.returncode == 0
    for name in (
        "fcfs",
        "autellix",
        "infercept",
        "continuum",
        "continuum-dy",
        "thunderagent",
        "thunderagent-cpu",
        "vtc",
    ):
        assert name in policies.stdout
    workloads = _sim("workloads")
    assert workloads.returncode == 0
    for name in (
        "ilr-1",
        "ilr-4",
        "s-ilr-3",
        "swe-bench",
        "bfcl",
        "coding-agent",
        "react",
        "plan-execute",
        "infercept",
        "task-parallel",
        "elephant-mice",
    ):
        assert name in workloads.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--workload", "nope", "--rate", "1"), "unknown workload"),
        (("--workload", "nope"), "unknown workload 'nope'"),  # before what it lacks
        (("--workload", "react", "--rate", "1", "--policies", "fcfs,nope"), "unknown policy"),
        (("--workload", "react", "--rate", "-1"), "positive rate"),
        (("--workload", "react", "--rate", "x"), "not a number"),
        (("--workload", "react"), "rates or a closed-loop concurrency"),
        (("--workload", "react", "--rate", "1", "--concurrency", "2"), "not both"),
        (("--workload", "react", "--rate", "1", "--profile", "h900"), "h900"),
        (("--workload", "missing.jsonl", "--rate", "1"), "missing.jsonl"),
        (("--workload", "react", "--rate", "1", "--policies", "mars:nope=1"), "no setting nope"),
        (("--workload", "react", "--rate", "1", "--policies", "mars:aimd_beta"), "NAME=VALUE"),
        (("--workload", "react", "--rate", "1", "--policies", "mars:aimd_beta=2"), "at most 1"),
    ],
)
def test_bad_input_exits_2_with_a_message(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    done = _sim("run", *args, "--sessions", "2", "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_results_record_the_policies_settings(tmp_path: Path) -> None:
    done = _sim(
        "run", "--workload", "react", "--rate", "1", "--sessions", "2",
        "--policies", "continuum,vtc", "--no-report", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = SweepResult.read(tmp_path / "results.json").config
    assert config["policy_settings"] == {
        "continuum": {"ttl_s": 2.0},
        "vtc": {"w_prompt": 1.0, "w_output": 2.0},
    }
    assert config["profile"] == "h100-qwen3-coder-30b"


def test_a_policy_with_settings_runs_apart_from_its_defaults(tmp_path: Path) -> None:
    done = _sim(
        "run", "--workload", "react", "--rate", "1", "--sessions", "2", "--no-report",
        "--policies", "mars,mars:aimd_beta=0.7:levels=8", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = SweepResult.read(tmp_path / "results.json")
    assert [run.policy for run in result.runs] == ["mars", "mars:aimd_beta=0.7:levels=8"]
    settings = result.config["policy_settings"]
    assert settings["mars"]["aimd_beta"] == 0.5
    assert settings["mars:aimd_beta=0.7:levels=8"]["aimd_beta"] == 0.7
    assert settings["mars:aimd_beta=0.7:levels=8"]["levels"] == 8


def test_a_workload_file_arrives_at_the_rate_given_or_as_recorded(tmp_path: Path) -> None:
    from agentmars.server.workloads.files import save_workload
    from agentmars.server.workloads.registry import build_workload

    # Recorded arrivals 100 s apart: alone, every session runs by itself.
    recorded = build_workload("react", sessions=8, seed=2, rate=0.01)
    path = tmp_path / "react.jsonl"
    save_workload(recorded, path)
    means = {}
    for label, load in (("recorded", ()), ("fast", ("--rate", "50"))):
        out = tmp_path / label
        done = _sim(
            "run", "--workload", str(path), *load, "--policies", "fcfs", "--no-report",
            "--out", str(out),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (run,) = SweepResult.read(out / "results.json").runs
        assert run.rate == (50.0 if load else None) and run.summary.sessions == 8
        assert run.summary.latency_s is not None
        means[label] = run.summary.latency_s.mean
    assert "at 50 sessions/s" in done.stdout
    # At 50 sessions/s they share the engine and the host: slower than when alone.
    assert means["fast"] > means["recorded"] * 1.05
