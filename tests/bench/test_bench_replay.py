"""``agentmars bench replay`` and ``agentmars demo``, run as a user runs them: agents
replaying a workload through the SDK and the gateway in front of the twin, their tools
for real in the sandbox pool, each policy served in turn, the simulator's prediction
beside each run (the demo's full size takes minutes: marked slow, run in CI)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentmars.server.metrics.results import SweepResult
from tests.bench.serve_killer import run_killing

CLI = [sys.executable, "-m", "agentmars.cli.main"]


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("bench", "replay", "--rate", "1", "--concurrency", "2"), "not both"),
        (("bench", "replay", "--policies", "mars,nope"), "unknown policy 'nope'"),
        (("bench", "replay", "--workload", "nope"), "unknown workload"),
        (("bench", "replay", "--vllm-python", "/x"), "--vllm-python is for --engine vllm"),
        (("bench", "replay", "--tool-scale", "-1"), "--tool-scale must be 0 or more"),
        (("bench", "replay", "--agents", "nope"), "--agents must be one of replay, openhands"),
        (("demo", "--engine", "vllm", "--vllm-python", "/nonexistent"), "does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: tuple[str, ...], says: str, tmp_path: Path) -> None:
    done = _run(*args, "--out", str(tmp_path / "out"), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.slow
def test_replay_on_the_twin_measures_each_policy_and_its_prediction(tmp_path: Path) -> None:
    out = tmp_path / "replay"
    done = _run(
        "bench", "replay", "--sessions", "3", "--rate", "1", "--max-turns", "3",
        "--tool-scale", "0.3", "--policies", "mars,fcfs", "--num-blocks", "64",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = SweepResult.read(out / "results.json")
    assert [run.policy for run in result.runs] == ["mars", "mars (sim)", "fcfs", "fcfs (sim)"]
    for run in result.runs:
        summary = run.summary
        assert (summary.sessions, summary.unfinished) == (3, 0), run.policy
        assert summary.latency_s is not None and summary.ttft_s is not None
        # The sessions resume after their tools: their context is found cached.
        assert (summary.kv.prefix_hit_rate or 0) > 0.3, run.policy
        # Every tool ran (in the sandbox pool for the measured runs).
        assert summary.cpu.active_tools is not None and summary.cpu.active_tools > 0
    measured = [run.summary for run in result.runs if "(sim)" not in run.policy]
    assert {s.engine for s in measured} == {"twin:cpu-tiny"}
    # The agents do not see evictions: not measured, not 0; the simulator counts them.
    assert [run.summary.kv.evicted_blocks is None for run in result.runs] == [
        True, False, True, False
    ]  # fmt: skip
    # The pool's cost per call was measured on this host for the prediction: the
    # sandbox's start, and each kind of tool the workload runs.
    cost = result.config["tool_cost_s"]
    assert 0 < cost["start"][1] <= cost["start"][0] + 0.1
    assert set(cost["by_kind"]) and all(wall > 0 for wall, _ in cost["by_kind"].values())
    assert (out / "index.html").is_file() and (out / "timeline.png").is_file()
    assert "mars against the others" in done.stdout and "prediction" in done.stdout
    # The engine's own TTFT (its histogram) is part of the agents' one, not more.
    for run in measured:
        engine_ttft = result.config["engine_ttft_mean_s"][run.policy]
        assert run.ttft_s is not None and 0 < engine_ttft <= run.ttft_s.mean, run.policy
    assert "(agents) /" in done.stdout
    # The agents' own CPU per call was measured on the run and charged in the
    # prediction (it shares the agent core with the tools).
    agent_cpu = result.config["agent_cpu_s_per_call"]
    assert set(agent_cpu) == {"mars", "fcfs"} and all(0 < cpu < 5 for cpu in agent_cpu.values())
    assert "own CPU per call" in done.stdout


@pytest.mark.slow
def test_openhands_conversations_replay_a_workload_on_the_twin(tmp_path: Path) -> None:
    pytest.importorskip("openhands.tools.terminal")
    out = tmp_path / "replay"
    done = _run(
        "bench", "replay", "--agents", "openhands", "--sessions", "2", "--rate", "1",
        "--max-turns", "3", "--tool-scale", "0.3", "--policies", "mars",
        "--num-blocks", "2048", "--max-context", "16384", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Created new conversation" not in done.stderr  # OpenHands' INFO logs kept out
    (run, predicted) = SweepResult.read(out / "results.json").runs
    assert (run.policy, predicted.policy) == ("mars", "mars (sim)")
    summary = run.summary
    assert (summary.sessions, summary.unfinished) == (2, 0)
    # Every call was streamed (a first token seen) and recorded, every tool ran.
    assert summary.latency_s is not None and summary.ttft_s is not None
    assert summary.cpu.active_tools is not None and summary.cpu.active_tools > 0


@pytest.mark.slow
def test_the_demo_runs_the_whole_system_within_five_minutes(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = _run("demo", "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = SweepResult.read(out / "results.json")
    assert [run.policy for run in result.runs] == ["mars", "mars (sim)", "fcfs", "fcfs (sim)"]
    assert all(run.summary.sessions == 16 for run in result.runs)
    assert "mars faster by" in done.stdout and (out / "index.html").is_file()


@pytest.mark.slow
def test_a_policy_whose_engine_dies_mid_run_is_reported_failed_and_the_others_are_kept(
    tmp_path: Path,
) -> None:
    # fcfs's server (the gateway and the twin) is killed once its replay has begun:
    # mars's results are on disk by then, fcfs is recorded as failed with why, and
    # continuum still runs, on a server of its own.
    out = tmp_path / "replay"
    stdout, stderr, code, killer = run_killing(
        [*CLI, "bench", "replay", "--sessions", "2", "--rate", "2", "--max-turns", "2",
         "--tool-scale", "0.3", "--policies", "mars,fcfs,continuum", "--num-blocks", "64",
         "--out", str(out)],
        "fcfs", out / "logs", out / "results.json",
    )  # fmt: skip
    assert killer.killed_pid is not None, stdout + stderr
    # Written as mars's run ended, before fcfs's failed.
    assert killer.snapshot_text is not None
    before = SweepResult.model_validate_json(killer.snapshot_text)
    assert [run.policy for run in before.runs] == ["mars", "mars (sim)"]
    assert before.config["policy_runs"] == {
        "mars": {"status": "done"}, "fcfs": {"status": "pending"},
        "continuum": {"status": "pending"},
    }  # fmt: skip
    assert code == 1, stdout + stderr
    result = SweepResult.read(out / "results.json")
    assert [run.policy for run in result.runs] == [
        "mars", "mars (sim)", "continuum", "continuum (sim)"
    ]  # fmt: skip
    assert all(run.summary.sessions == 2 for run in result.runs)
    runs = result.config["policy_runs"]
    assert isinstance(runs, dict)
    assert runs["mars"] == runs["continuum"] == {"status": "done"}
    failed = runs["fcfs"]
    assert isinstance(failed, dict) and failed["status"] == "failed"
    error = failed["error"]
    assert isinstance(error, str) and "fcfs" in error and len(error) <= 300
    engine_ttft = result.config["engine_ttft_mean_s"]
    assert isinstance(engine_ttft, dict) and set(engine_ttft) == {"mars", "continuum"}
    # The table has fcfs's row, failed; no traceback; one line names the failed run.
    assert re.search(r"fcfs\s.*run failed", stdout), stdout
    assert f"run failed fcfs: {error}" in " ".join(stdout.split())
    assert "Traceback" not in stdout + stderr
    assert "error: 1 of 3 runs failed: fcfs" in stderr
    assert (out / "index.html").is_file()
    assert not list(out.glob(".results.json.*"))  # no temporary file left
