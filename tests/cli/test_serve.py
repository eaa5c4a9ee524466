"""``agentmars serve`` on the real vLLM CPU engine: it serves through the gateway and
stops everything on SIGTERM, leaving no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentmars.sdk.events import SessionEnd
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.web.serving import CannotListen, free_loopback_port, listening_socket
from tests.cli.serving import sigterm_once_vllm_starts, vllm_children, wait_for
from tests.server.engines.vllm.conftest import vllm_python  # noqa: F401  (the fixture)

CLI = [sys.executable, "-m", "agentmars.cli.main", "serve"]


def _start(
    python: Path, port: int, log: Path, *more: str, policy: str = "continuum"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *CLI, "--model", str(tiny_model_made_by(python)), "--vllm-python", str(python),
            "--policy", policy, "--port", str(port), "--num-blocks", "64",
            "--max-model-len", "4096", "--log", str(log), *(more or ("--cores", "0")),
        ],
        env={**os.environ, "AGENTMARS_GATEWAY_TOKEN": "test-token"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _kv_metrics(base: str) -> dict[str, float]:
    """The gateway's KV samples, by name (with the state or release reason, if any,
    after a /)."""
    samples = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("agentmars_kv_"):
                label = sample.labels.get("state") or sample.labels.get("reason")
                samples[f"{sample.name}/{label}" if label else sample.name] = sample.value
    return samples


def _eventually(check: Callable[[dict[str, float]], bool], base: str) -> dict[str, float]:
    deadline = time.monotonic() + 10
    while not check(figures := _kv_metrics(base)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return figures


def _check_engine_series(base: str) -> None:
    """vLLM's own series come through the gateway's /metrics, after the gateway's."""
    text = httpx.get(base + "/metrics", timeout=10).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert families["vllm:e2e_request_latency_seconds"].type == "histogram"
    (up,) = families["agentmars_engine_metrics_up"].samples
    assert (up.value, up.labels["model_name"]) == (1, SERVED_MODEL_NAME)


def _check_side_channel(base: str) -> None:
    """The plugin's KV figures reach the gateway's /metrics, and a session end posted to
    the gateway reaches the plugin and releases the session's pin (continuum pinned it)."""
    figures = _eventually(lambda f: f.get("agentmars_kv_pinned_sessions") == 1, base)
    pool = sum(figures[f"agentmars_kv_blocks/{state}"] for state in ("free", "used", "pinned"))
    assert pool == 63  # 64 less vLLM's null block
    assert figures["agentmars_kv_blocks/pinned"] >= 1
    end = SessionEnd(session_id="s1", turns=1).to_json()
    token = {"authorization": "Bearer test-token"}
    assert httpx.post(base + "/v1/events", content=end, headers=token).status_code == 200
    # The plugin takes the gateway's events at its next step: another session's call.
    other = {"model": SERVED_MODEL_NAME, "prompt": "bye", "max_tokens": 2}
    assert httpx.post(base + "/v1/completions", json=other, timeout=120).status_code == 200
    released = "agentmars_kv_pins_released_total/session_end"
    figures = _eventually(lambda f: f.get(released) == 1, base)
    assert figures.get(released) == 1, figures


@pytest.mark.slow
def test_sigterm_while_vllm_starts_leaves_nothing_running(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    """And the gateway's port is held while vLLM starts, so nothing vLLM starts on a
    free port of its own takes it (a CI run lost a server to that race)."""
    port = free_loopback_port()

    def the_port_is_held() -> None:
        with pytest.raises(CannotListen):
            listening_socket("127.0.0.1", port).close()

    process = _start(vllm_python, port, tmp_path / "vllm.log")
    sigterm_once_vllm_starts(process, while_starting=the_port_is_held)


@pytest.mark.slow
def test_serve_answers_through_the_gateway_and_stops_cleanly(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    port = free_loopback_port()
    process = _start(vllm_python, port, tmp_path / "vllm.log")
    base = f"http://127.0.0.1:{port}"
    descendants: list[psutil.Process] = []
    try:
        wait_for(base + "/healthz", process, timeout_s=600)
        descendants = psutil.Process(process.pid).children(recursive=True)
        assert vllm_children(process)
        reply = httpx.post(
            base + "/v1/completions",
            json={
                "model": SERVED_MODEL_NAME,
                "prompt": "hello " * 40,  # full KV blocks, for continuum to pin
                "max_tokens": 4,
                "ignore_eos": True,
            },
            headers={"X-Session-ID": "s1"},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        assert httpx.post(base + "/v1/events", json=[], timeout=5).status_code == 401
        _check_engine_series(base)
        _check_side_channel(base)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert alive == [], f"left running: {[p.pid for p in alive]}"


def _complete(base: str, session: str, prompt: str) -> None:
    body = {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    reply = httpx.post(
        base + "/v1/completions", json=body, headers={"X-Session-ID": session}, timeout=120
    )
    assert reply.status_code == 200, reply.text


def _by_replica(text: str, name: str) -> dict[str, float]:
    """A vLLM counter's samples summed per ``replica`` label."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                replica = sample.labels["replica"]
                totals[replica] = totals.get(replica, 0.0) + sample.value
    return totals


@pytest.mark.slow
def test_serve_two_replicas_keeps_each_session_on_its_replica(
    vllm_python: Path,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    """``--replicas 2``: two vLLM servers, one core each, MORI's placement (the replica
    with the most KV room) and session affinity: session a's three calls all run on the
    replica it was placed on (its later calls hit that replica's prefix cache), session
    b, placed once a's KV is resident, on the other; both replicas' own series come
    through the gateway's /metrics, labelled."""
    port = free_loopback_port()
    log = tmp_path / "vllm.log"
    more = ("--replicas", "2", "--cores", "0,1")
    process = _start(vllm_python, port, log, *more, policy="mori")
    base = f"http://127.0.0.1:{port}"
    descendants: list[psutil.Process] = []
    try:
        wait_for(base + "/healthz", process, timeout_s=600)
        descendants = psutil.Process(process.pid).children(recursive=True)
        assert len(vllm_children(process)) >= 2
        context = "hello " * 300  # a few KV blocks of 128 tokens
        _complete(base, "a", context)
        # a's KV stays resident (MORI's GPU tier): its replica now has less room.
        held = _eventually(lambda f: f.get("agentmars_kv_blocks/free", 64.0 * 2) < 126, base)
        assert held.get("agentmars_kv_blocks/free", 0.0) < 126, held
        _complete(base, "b", "bye " * 300)
        for turn in range(2):
            context += f" turn {turn} " + "more " * 40
            _complete(base, "a", context)
        text = httpx.get(base + "/metrics", timeout=10).text
        calls = _by_replica(text, "vllm:request_success_total")
        assert sorted(calls.values()) == [1.0, 3.0], calls
        a_replica = next(replica for replica, count in calls.items() if count == 3.0)
        hits = _by_replica(text, "vllm:prefix_cache_hits_total")
        assert hits[a_replica] > 0, hits
        families = {family.name: family for family in text_string_to_metric_families(text)}
        (up,) = families["agentmars_engine_metrics_up"].samples
        assert up.value == 1
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=90)
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    assert (tmp_path / "vllm.1.log").stat().st_size > 0  # replica 1's own log
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert alive == [], f"left running: {[p.pid for p in alive]}"


def test_serve_shares_the_cpus_out_among_replicas(tmp_path: Path) -> None:
    from agentmars.cli.serve import ServeError

    assert _options(tmp_path, "fcfs", replicas=2, cores="0-2,5").replica_cores() == ["0,1", "2,5"]
    assert _options(tmp_path, "fcfs", replicas=3, cores="0-4").replica_cores() == [
        "0,1", "2,3", "4"
    ]  # fmt: skip
    assert _options(tmp_path, "fcfs", cores="3").replica_cores() == ["3"]
    with pytest.raises(ServeError, match="only 2 CPUs to share out"):
        _options(tmp_path, "fcfs", replicas=3, cores="0,1").check()
    with pytest.raises(ServeError, match="not a CPU list"):
        _options(tmp_path, "fcfs", replicas=2, cores="0,x").check()
    with pytest.raises(ServeError, match="'3-1' is not a CPU range"):
        _options(tmp_path, "fcfs", replicas=2, cores="3-1").check()


def test_serve_refuses_a_kv_cache_too_small_for_its_context(tmp_path: Path) -> None:
    # Refused before vLLM starts: the KV must hold one longest context and the null block.
    (tmp_path / "config.json").write_text("{}")
    done = subprocess.run(
        [*CLI, "--engine", "vllm", "--model", str(tmp_path), "--vllm-python", sys.executable,
         "--num-blocks", "32", "--max-model-len", "4096", "--port", "1"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "AGENTMARS_GATEWAY_TOKEN": "t"},
    )  # fmt: skip
    assert done.returncode == 2
    assert "--num-blocks 32: 32 KV blocks cannot hold a context of 4096 tokens" in done.stderr
    assert "Traceback" not in done.stderr


def _options(
    tmp_path: Path,
    policy: str,
    cpu_kv_blocks: int | None = None,
    *,
    replicas: int = 1,
    cores: str | None = None,
) -> Any:
    from agentmars.cli.serve import ServeOptions

    (tmp_path / "config.json").write_text("{}")
    return ServeOptions(
        model=tmp_path, policy=policy, host="127.0.0.1", port=1, token="t",
        vllm_python=Path(sys.executable), log_path=tmp_path / "vllm.log",
        max_model_len=4096, num_blocks=64, cores=cores, vllm_args=(),
        profile="cpu-tiny", cpu_kv_blocks=cpu_kv_blocks, replicas=replicas,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "blocks"),
    # Needs a CPU tier, uses one, neither: as large as the GPU's KV by default, or none.
    [("thunderagent-cpu", 64), ("infercept", 64), ("autellix", 64), ("continuum", 0)],
)
def test_serve_gives_a_cpu_tier_to_a_policy_that_needs_or_uses_one(
    tmp_path: Path, policy: str, blocks: int
) -> None:
    options = _options(tmp_path, policy)
    options.check()
    assert options.cpu_tier_blocks() == blocks
    assert _options(tmp_path, policy, cpu_kv_blocks=16).cpu_tier_blocks() == 16


def test_serve_without_a_cpu_tier_refuses_a_policy_that_needs_one(tmp_path: Path) -> None:
    from agentmars.cli.serve import ServeError

    with pytest.raises(ServeError, match="'thunderagent-cpu': it needs cpu-tier"):
        _options(tmp_path, "thunderagent-cpu", cpu_kv_blocks=0).check()
