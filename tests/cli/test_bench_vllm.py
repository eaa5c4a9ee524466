"""``agentmars bench plugin``, ``session-mix``, ``fidelity`` and ``gateway`` (over vLLM)
refuse bad input with exit status 2 and a message, before starting anything."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.cli.serving import sigterm_once_vllm_starts
from tests.server.engines.vllm.conftest import vllm_python  # noqa: F401  (the fixture)

CLI = [sys.executable, "-m", "agentmars.cli.main", "bench"]


def _run(*args: str, env_python: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGENTMARS_VLLM_PYTHON"}
    if env_python is not None:
        env["AGENTMARS_VLLM_PYTHON"] = env_python
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


@pytest.mark.parametrize("command", ["plugin", "session-mix"])
def test_without_a_vllm_python_it_says_how_to_give_one(command: str) -> None:
    done = _run(command)
    assert done.returncode == 2
    assert "give --vllm-python or $AGENTMARS_VLLM_PYTHON" in done.stderr


@pytest.mark.parametrize("command", ["plugin", "session-mix"])
def test_a_vllm_python_that_does_not_exist_is_named(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    done = _run(command, "--vllm-python", str(missing))
    assert done.returncode == 2
    assert f"the vLLM python {missing} does not exist" in done.stderr
    # The environment variable is read the same way.
    done = _run(command, env_python=str(missing))
    assert done.returncode == 2
    assert f"the vLLM python {missing} does not exist" in done.stderr


@pytest.mark.parametrize(
    ("policies", "message"),
    [
        ("mars,no-such", "unknown policy 'no-such'"),
        # Registered, but it needs a cost profile the bench's plugin is not given.
        ("mars,continuum-dy", "the vLLM plugin cannot run policy 'continuum-dy'"),
    ],
)
def test_bench_plugin_refuses_a_policy_it_cannot_run_before_looking_for_vllm(
    policies: str, message: str
) -> None:
    done = _run("plugin", "--policies", policies)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr and "usage:" not in done.stderr


def test_the_gateway_bench_over_vllm_names_a_missing_python(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    done = _run("gateway", "--vllm-python", str(missing))
    assert done.returncode == 2
    assert f"the vLLM python {missing} does not exist" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine-latency-ms", "5", "--vllm-python", sys.executable], "not vLLM"),
        (["--engine-latency-ms", "-1"], "Invalid value for '--engine-latency-ms'"),
    ],
)
def test_the_gateway_bench_refuses_an_engine_latency_it_cannot_use(
    args: list[str], message: str
) -> None:
    done = _run("gateway", *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_session_mix_refuses_an_unknown_policy_before_starting_vllm() -> None:
    # Any existing file passes the python check; the policy is checked next.
    done = _run("session-mix", "--vllm-python", sys.executable, "--policies", "fcfs,nope")
    assert done.returncode == 2
    assert "unknown policy 'nope'" in done.stderr


def test_session_mix_refuses_a_bad_rate_before_starting_vllm() -> None:
    done = _run("session-mix", "--vllm-python", sys.executable, "--rate", "0")
    assert done.returncode == 2
    assert "--rate must be a positive number" in done.stderr


@pytest.mark.parametrize("command", ["session-mix", "fidelity"])
@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "no readable config.json"),
        ("{not json", "no readable config.json"),
        ('{"vocab_size": 300}', "its vocabulary (300) must hold the prompts' token ids"),
    ],
)
def test_a_model_the_mix_cannot_be_replayed_on_is_refused_before_starting_vllm(
    command: str, config: str | None, message: str, tmp_path: Path
) -> None:
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    done = _run(command, "--vllm-python", sys.executable, "--model", str(tmp_path))
    assert done.returncode == 2
    assert f"--model {tmp_path}: " in done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_bench_plugin_prints_and_writes_the_figures(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    out = tmp_path / "plugin.json"
    done = _run(
        "plugin", "--vllm-python", str(vllm_python), "--sessions", "4", "--turns", "2",
        "--reps", "1", "--kv-blocks", "128", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["same_tokens"] is True
    assert figures["passed"] == all(
        ratio["paired"] <= 1.10 for ratio in figures["schedule_ratio_to_stock"].values()
    )
    for name in ("vLLM", "fcfs", "continuum", "x p50", "prefix lookups"):
        assert name in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)  # vLLM's import under valgrind takes minutes
def test_bench_plugin_counts_instructions_under_callgrind(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    out = tmp_path / "instructions.json"
    done = _run_bench_stopping_it_on_timeout(
        "plugin", "--vllm-python", str(vllm_python), "--instructions", "--sessions", "2",
        "--turns", "2", "--kv-blocks", "128", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    runs = figures["schedulers"]
    assert list(runs) == ["stock", "fcfs", "continuum", "mars"]
    # The same calls finished under every scheduler, each in a step or more, and only
    # schedule() was collected: millions of instructions, not vLLM's import's billions.
    assert figures["same_tokens"] is True
    for run in runs.values():
        assert run["steps"] >= 4
        assert 10**5 < run["instructions_per_step"] < 10**8
    for name, ratio in figures["instructions_ratio_to_stock"].items():
        per_step = runs[name]["instructions_per_step"] / runs["stock"]["instructions_per_step"]
        assert ratio == pytest.approx(per_step)
    assert figures["passed"] == all(
        r <= 1.10 for r in figures["instructions_ratio_to_stock"].values()
    )
    assert "schedule() instructions" in done.stdout and "x per step" in done.stdout


def _is_valgrind(process: psutil.Process) -> bool:
    """valgrind runs as its tool's binary: its name is the tool's, its argv[0] not."""
    try:
        return "valgrind" in process.cmdline()[0]
    except (psutil.Error, IndexError):  # it ended (a compiler's run, say)
        return False


@pytest.mark.slow
def test_sigterm_stops_the_instruction_count_and_its_valgrind(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
) -> None:
    bench = psutil.Popen(
        [*CLI, "plugin", "--vllm-python", str(vllm_python), "--instructions"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    measured: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while not measured and time.monotonic() < deadline and bench.poll() is None:
            measured = [p for p in bench.children(recursive=True) if _is_valgrind(p)]
            time.sleep(0.2)
        assert measured, "valgrind did not start"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) != 0
        _, alive = psutil.wait_procs(measured, timeout=10)
        assert alive == []
    finally:
        for process in [bench, *measured]:
            if process.is_running():
                process.kill()


@pytest.mark.slow
def test_bench_plugin_reports_the_harness_refusal(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
) -> None:
    # Too few KV blocks for a session's context: the harness refuses, the CLI says why.
    done = _run("plugin", "--vllm-python", str(vllm_python), "--kv-blocks", "16")
    assert done.returncode == 2
    assert "more than 16 KV blocks hold" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--loads", "light=fast"], "--loads: 'light=fast' is not NAME=RATE or a rate"),
        (["--loads", "x=-1"], "must be a positive number"),
        (["--policies", "fcfs,nope"], "unknown policy 'nope'"),
        (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
        (["--num-blocks", "32"], "needs 33 blocks of 128 tokens"),
    ],
)
def test_fidelity_refuses_bad_input_before_starting_vllm(args: list[str], message: str) -> None:
    done = _run("fidelity", "--vllm-python", sys.executable, *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_bench_fidelity_fits_a_profile_and_compares_every_model(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    # The whole path at its smallest: calibrate here, then real, twin and simulator.
    out = tmp_path / "fidelity.json"
    done = _run_bench_stopping_it_on_timeout(
        "fidelity", "--vllm-python", str(vllm_python), "--loads", "quick=2",
        "--policies", "fcfs", "--sessions", "3", "--max-turns", "2", "--max-context", "1024",
        "--num-blocks", "16", "--log-dir", str(tmp_path / "logs"), "--json", str(out),
        "--plot", str(tmp_path / "load.png"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["profile"] == str((tmp_path / "logs" / "cpu-host.json").resolve())
    (point,) = figures["points"]
    assert set(point["models"]) == {"sim", "twin"}
    for name, row in point["comparison"].items():
        for model in ("sim", "twin"):
            if row["real"]:  # NaN where the real figure is (no call after a tool)
                expected = row[model] / row["real"] - 1
                assert row[f"{model} error"] == pytest.approx(expected, nan_ok=True), name
            else:  # no error relative to 0 (e.g. no prefix hit at all in so short a run)
                assert math.isnan(row[f"{model} error"]), name
    assert point["real"]["engine_load"]["samples"] > 0
    assert (tmp_path / "load.png").stat().st_size > 0
    # The table (rich wraps its headers to the terminal's width, 80 columns here).
    assert all(word in done.stdout for word in ("real", "sim", "twin", "error", "quick"))


def _run_bench_stopping_it_on_timeout(*args: str) -> subprocess.CompletedProcess[str]:
    """A bench that starts servers, given minutes (vLLM starts once per run); past them
    it gets SIGTERM, which stops every server it started, before the test fails."""
    process = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = process.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=120)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.slow
def test_sigterm_stops_the_fidelity_bench_and_every_server_it_started(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    env = {**os.environ, "AGENTMARS_VLLM_PYTHON": str(vllm_python)}
    process = subprocess.Popen(
        [*CLI, "fidelity", "--log-dir", str(tmp_path), "--max-context", "1024",
         "--num-blocks", "16"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    sigterm_once_vllm_starts(process)
    assert process.returncode != 0


def test_session_mix_on_the_twin_needs_no_vllm(tmp_path: Path) -> None:
    """--twin serves the simulator's engine, paced, behind the real gateway: the same
    replay and figures, no vLLM environment (none is given; the variable is unset)."""
    out = tmp_path / "mix.json"
    env = {k: v for k, v in os.environ.items() if k != "AGENTMARS_VLLM_PYTHON"}
    done = subprocess.run(
        [sys.executable, "-m", "agentmars.cli.main", "bench", "session-mix", "--twin",
         "--policies", "fcfs,mars", "--sessions", "3", "--rate", "5", "--max-turns", "2",
         "--max-context", "1024", "--cores", "0", "--agent-cores", "0",
         "--log-dir", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert figures["engine"]["twin"] is True
    assert [p["policy"] for p in figures["policies"]] == ["fcfs", "mars"]
    for policy in figures["policies"]:
        assert policy["failed"] == [] and policy["sessions"] == 3
        assert policy["prefix_cache_queries"] > 0
    assert (tmp_path / "serve-twin-mars.log").exists()


def test_session_mix_on_the_twin_refuses_a_model() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentmars.cli.main", "bench", "session-mix", "--twin",
         "--model", sys.executable],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--model is vLLM's" in done.stderr
