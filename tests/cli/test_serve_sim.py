"""``agentmars serve --engine sim``: the simulated engine behind the gateway, run as a
user runs it; it answers the OpenAI client and stops on SIGTERM, leaving nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentmars.sdk.events import SessionEnd, ToolEnd, ToolStart
from agentmars.server.web.serving import free_loopback_port
from tests.cli.serving import wait_for

CLI = [sys.executable, "-m", "agentmars.cli.main", "serve"]
ENV = {**os.environ, "AGENTMARS_GATEWAY_TOKEN": "test-token"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=ENV, capture_output=True, text=True, timeout=60, check=False
    )


def _metric(base: str, name: str, **labels: str) -> float:
    text = httpx.get(base + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    raise AssertionError(f"no {name} {labels} in {base}/metrics")


def _wait_until(base: str, name: str, value: float, **labels: str) -> None:
    deadline = time.monotonic() + 5
    while (seen := _metric(base, name, **labels)) != value:
        assert time.monotonic() < deadline, f"{name} is {seen}, not {value}"
        time.sleep(0.05)


def _post_events(base: str, events: list[ToolStart | ToolEnd]) -> None:
    batch = [event.model_dump(mode="json") for event in events]
    headers = {"Authorization": f"Bearer {ENV['AGENTMARS_GATEWAY_TOKEN']}"}
    reply = httpx.post(base + "/v1/events", json=batch, headers=headers, timeout=5)
    assert reply.status_code == 200, reply.text


def _engine_url(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()  # "agentmars: gateway on ..., simulated engine (...) URL"
    return line.split()[-1]


def test_serve_sim_answers_through_the_gateway_and_stops_cleanly() -> None:
    port = free_loopback_port()
    process = subprocess.Popen(
        [*CLI, "--engine", "sim", "--profile", "cpu-tiny", "--policy", "continuum",
         "--port", str(port), "--num-blocks", "64"],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(base + "/healthz", process, timeout_s=30)
        # The engine serves from a thread of the same process: no child to leave behind.
        assert psutil.Process(process.pid).children(recursive=True) == []
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == ["cpu-tiny"]
        session = {"X-Session-ID": "s1"}
        reply = client.chat.completions.create(
            model="cpu-tiny",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=4,
            extra_headers=session,
        )
        assert reply.choices[0].message.content == "lorem ipsum dolor sit "
        stream = client.completions.create(
            model="cpu-tiny", prompt="p" * 1200, max_tokens=3, stream=True, extra_headers=session
        )
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == (
            "lorem ipsum dolor "
        )
        # The gateway reads the engine's block pool directly (64 blocks, as asked).
        pool = [_metric(base, "agentmars_kv_blocks", state=s) for s in ("free", "used", "pinned")]
        assert sum(pool) == 64
        # The engine's series come through the gateway's /metrics too.
        assert _metric(base, "vllm:num_requests_running", model_name="cpu-tiny") == 0
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="other", prompt="hi", max_tokens=1)
        assert httpx.post(base + "/v1/events", json=[], timeout=5).status_code == 401
        # A client leaving mid-stream: the gateway closes the engine's stream, the engine
        # aborts the call and frees its blocks (the engine's URL is on the first line).
        engine = _engine_url(process)
        assert process.stdout is not None  # the next line: where the dashboard is
        # A token the user chose is named, not echoed into logs.
        said = process.stdout.readline()
        assert f"dashboard on {base}/dashboard#token=$AGENTMARS_GATEWAY_TOKEN" in said
        body = {"model": "cpu-tiny", "prompt": "q" * 4000, "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, headers=session):
            pass
        _wait_until(engine, "agentmars_sim_requests_aborted_total", 1.0)
        _wait_until(engine, "agentmars_sim_kv_blocks", 64.0, state="free")
        # Tool events posted to the gateway reach the engine's view (and its policy).
        tool = ToolStart(session_id="s1", call_id="t1", tool="pytest", source="sandbox")
        _post_events(base, [tool])
        _wait_until(engine, "agentmars_sim_tool_calls", 1.0, state="running")
        _post_events(base, [ToolEnd(session_id="s1", call_id="t1", tool="pytest", duration_s=1)])
        _wait_until(engine, "agentmars_sim_tool_calls", 0.0, state="running")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    assert not psutil.pid_exists(process.pid)
    with pytest.raises(httpx.TransportError):
        httpx.get(base + "/healthz", timeout=1)


def test_an_unknown_profile_exits_with_the_list_of_profiles() -> None:
    done = _run("--engine", "sim", "--profile", "h300-nothing")
    assert done.returncode == 2
    assert "unknown profile 'h300-nothing'" in done.stderr
    assert "cpu-tiny" in done.stderr and "h100-qwen3-coder-30b" in done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--engine", "sim"), "--engine sim needs --profile: "),
        (("--engine", "sim", "--profile", "cpu-tiny", "--model", "/m"), "only for --engine vllm"),
        (("--engine", "sim", "--profile", "cpu-tiny", "--policy", "nope"), "unknown policy"),
        (("--engine", "sim", "--profile", "cpu-tiny", "--max-model-len", "99999"), "does not fit"),
        (("--engine", "vllm"), "--engine vllm needs --model"),
    ],
)
def test_bad_options_exit_2_with_a_message(args: tuple[str, ...], says: str) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert says in done.stderr


def test_without_a_token_on_loopback_serve_makes_one_and_prints_it_once() -> None:
    port = free_loopback_port()
    env = {k: v for k, v in os.environ.items() if k != "AGENTMARS_GATEWAY_TOKEN"}
    process = subprocess.Popen(
        [*CLI, "--engine", "sim", "--profile", "cpu-tiny", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "no $AGENTMARS_GATEWAY_TOKEN, so this gateway's token is" in line
        token = line.split("token is ")[1].split()[0]
        wait_for(base + "/healthz", process, timeout_s=30)
        # The dashboard's address opens as it is printed: the made token in it.
        assert process.stdout is not None
        banner = [process.stdout.readline(), process.stdout.readline()]
        assert banner[1].strip() == f"agentmars: dashboard on {base}/dashboard#token={token}"
        end = [SessionEnd(session_id="s9", source="sdk").model_dump(mode="json")]
        assert httpx.post(base + "/v1/events", json=end, timeout=5).status_code == 401
        bearer = {"Authorization": f"Bearer {token}"}
        assert (
            httpx.post(base + "/v1/events", json=end, headers=bearer, timeout=5).status_code == 200
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert process.returncode == 0


def test_without_a_token_beyond_loopback_serve_refuses() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AGENTMARS_GATEWAY_TOKEN"}
    done = subprocess.run(
        [*CLI, "--engine", "sim", "--profile", "cpu-tiny", "--host", "0.0.0.0"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--host 0.0.0.0 is reachable from other machines" in done.stderr


def test_a_busy_port_is_refused_before_any_banner() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _run("--engine", "sim", "--profile", "cpu-tiny", "--port", str(port))
    assert done.returncode == 2
    assert f"the gateway cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "gateway on" not in done.stdout and "Traceback" not in done.stderr
