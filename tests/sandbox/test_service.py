"""The sandbox service and its client, as separate processes would use them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentmars.sandbox.client import SandboxClient, SandboxClientError
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.service import MAX_BODY_BYTES, create_sandbox_app
from agentmars.sandbox.spec import MAX_ARGS, MAX_ENV_VARS, MAX_OUTPUT_CAP_BYTES, ExecSpec
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import MAX_COUNT, ToolEnd, clock
from agentmars.sdk.sinks.memory import MemorySink
from agentmars.sdk.tool_stats import OTHER_TOOLS
from agentmars.server.web.serving import serve_in_subprocess, serve_in_thread

TOKEN = "sandbox-test-token"
PY = sys.executable


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, SandboxPool, MemorySink]]:
    events = MemorySink()
    pool = SandboxPool(
        SandboxConfig(workspace_root=tmp_path / "ws", slots=2), emitter=Emitter([events])
    )
    with serve_in_thread(create_sandbox_app(pool, TOKEN)) as url:
        yield url, pool, events


@pytest.fixture
def client(service: tuple[str, SandboxPool, MemorySink]) -> Iterator[SandboxClient]:
    with SandboxClient(service[0], TOKEN) as sandbox:
        yield sandbox


def test_run_a_tool_through_the_service(client: SandboxClient, tmp_path: Path) -> None:
    workspace = client.open_session("s1")
    assert Path(workspace) == tmp_path / "ws" / "s1"
    result = client.run(
        "s1",
        ExecSpec(
            command=["sh", "-c", "cat; echo $GREETING; pwd"], stdin="in\n", env={"GREETING": "hi"}
        ),
        tool="terminal",
        priority=3,
        turn=1,
    )
    assert result.status == "ok" and result.exit_status == 0
    assert result.stdout == f"in\nhi\n{workspace}\n"
    assert result.slot in (0, 1) and result.cores
    client.close_session("s1")
    assert not Path(workspace).exists()


def test_streaming_delivers_output_before_the_result(client: SandboxClient) -> None:
    client.open_session("s1")
    chunks: list[tuple[str, str]] = []
    code = "import sys\nfor i in range(3): print(i, flush=True)\nprint('e', file=sys.stderr)"
    result = client.run_streaming(
        "s1", ExecSpec(command=[PY, "-c", code]), lambda s, d: chunks.append((s, d))
    )
    assert result.status == "ok"
    assert "".join(d for s, d in chunks if s == "stdout") == "0\n1\n2\n"
    assert "".join(d for s, d in chunks if s == "stderr") == "e\n"


def test_health_and_metrics(
    service: tuple[str, SandboxPool, MemorySink], client: SandboxClient
) -> None:
    url = service[0]
    client.open_session("s1")
    client.run("s1", ExecSpec(command=["true"]), tool="probe")
    health = client.health()
    assert health["status"] == "ok" and health["backend"] == "process"
    assert [s["index"] for s in health["slots"]] == [0, 1]
    metrics = httpx.get(f"{url}/metrics").text
    assert 'agentmars_sandbox_tool_calls_total{status="ok",tool="probe"} 1.0' in metrics
    assert "agentmars_sandbox_slots 2.0" in metrics
    assert 'agentmars_sandbox_tool_exec_ema_seconds{tool="probe"}' in metrics


def test_interrupt_over_http(client: SandboxClient) -> None:
    client.open_session("s1")
    spec = ExecSpec(command=[PY, "-c", "import time\nwhile True: time.sleep(0.01)"], timeout_s=30)
    outcome: list[object] = []
    runner = threading.Thread(target=lambda: outcome.append(client.run("s1", spec, call_id="long")))
    runner.start()
    while not client.interrupt("s1", "long"):
        pass  # the call is not registered yet: ask again
    runner.join(timeout=20)
    assert outcome and outcome[0].status == "cancelled"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("post", "/v1/sessions/nope/exec", {"command": ["true"]}, 404, "unknown session"),
        ("post", "/v1/sessions/s1/exec", {"command": []}, 422, "at least 1 item"),
        ("post", "/v1/sessions/s1/exec", {"command": ["x" * 70000]}, 422, "the limit is"),
        (
            "post",
            "/v1/sessions/s1/exec",
            {"command": ["true"], "timeout_s": -1},
            422,
            "greater than 0",
        ),
        ("post", "/v1/sessions/s1/exec", {"command": ["true"], "priority": "high"}, 422, "integer"),
        (
            "post",
            "/v1/sessions/s1/exec",
            {"command": ["true"], "priority": 2**40},
            422,
            "less than",
        ),
        ("post", "/v1/sessions", {"session_id": "../x"}, 400, "invalid session id"),
        ("post", "/v1/sessions", {"sid": "x"}, 422, "Field required"),
        ("delete", "/v1/sessions/ghost", None, 404, "unknown session"),
    ],
)
def test_bad_requests_get_4xx_with_a_message(
    client: SandboxClient, method: str, path: str, body: object, status: int, message: str
) -> None:
    client.open_session("s1")
    response = httpx.request(
        method, client.base_url + path, json=body, headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == status, response.text
    assert message in response.text


def test_control_endpoints_need_the_token(service: tuple[str, SandboxPool, MemorySink]) -> None:
    url = service[0]
    assert httpx.post(f"{url}/v1/sessions", json={"session_id": "s"}).status_code == 401
    wrong = {"authorization": "Bearer nope"}
    assert (
        httpx.post(f"{url}/v1/sessions", json={"session_id": "s"}, headers=wrong).status_code == 401
    )
    assert httpx.get(f"{url}/healthz").status_code == 200
    with pytest.raises(SandboxClientError) as refused:
        SandboxClient(url, "wrong-token").open_session("s")
    assert refused.value.status_code == 401


def _marked_processes(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


@pytest.mark.slow
def test_service_killed_mid_call_fails_the_call_and_leaves_nothing(tmp_path: Path) -> None:
    """The caller gets an error, the tool dies with the service, a restarted
    service serves again."""
    marker = f"agentmars-fault-{uuid.uuid4().hex}"
    workspaces = str(tmp_path / "ws")
    command = [PY, "-m", "agentmars.cli.main", "sandbox", "serve", "--workspace-root", workspaces]
    env = {"AGENTMARS_SANDBOX_TOKEN": TOKEN}
    spec = ExecSpec(command=[PY, "-c", f"import time  # {marker}\nwhile True: time.sleep(0.01)"])
    outcome: list[BaseException | object] = []
    with serve_in_subprocess(command, env=env) as url, SandboxClient(url, TOKEN) as sandbox:
        sandbox.open_session("s1")

        def call() -> None:
            try:
                outcome.append(sandbox.run("s1", spec))
            except SandboxClientError as exc:
                outcome.append(exc)

        runner = threading.Thread(target=call)
        runner.start()
        while not _marked_processes(marker):
            pass  # wait until the tool runs
        service_pid = int(httpx.get(f"{url}/healthz").json()["pid"])
        os.killpg(service_pid, signal.SIGKILL)
        runner.join(timeout=20)
    assert isinstance(outcome[0], SandboxClientError) and outcome[0].status_code is None
    deadline = time.monotonic() + 10
    # bwrap's --die-with-parent takes the tree down asynchronously.
    while _marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _marked_processes(marker) == []
    with serve_in_subprocess(command, env=env) as url, SandboxClient(url, TOKEN) as sandbox:
        sandbox.open_session("s1")
        assert sandbox.run("s1", ExecSpec(command=["true"])).status == "ok"


# --- bounds on what a client can make the service do (issue 10) ----------------------

AUTH = {"authorization": f"Bearer {TOKEN}"}


def _raw_exchange(url: str, request: bytes, timeout_s: float = 5.0) -> bytes:
    """Send ``request`` as is on a new connection; what the server answers until it
    closes (or the timeout: then what came so far)."""
    host, port = url.removeprefix("http://").split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as connection:
        connection.sendall(request)
        with contextlib.suppress(TimeoutError):
            while chunk := connection.recv(65536):
                answer += chunk
    return answer


def test_no_token_is_refused_before_the_body_is_read(
    service: tuple[str, SandboxPool, MemorySink],
) -> None:
    url = service[0]
    # 300 MB announced, none sent: a server that reads the body first never answers.
    head = (
        "POST /v1/sessions/s1/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 300000000\r\n\r\n"
    )
    answer = _raw_exchange(url, head.encode())
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"bearer token" in answer


def test_a_chunked_body_past_the_limit_gets_413(client: SandboxClient) -> None:
    client.open_session("s1")

    def chunks() -> Iterator[bytes]:
        yield b'{"command": ["true"], "stdin": "'
        for _ in range(MAX_BODY_BYTES // 2**20 + 2):
            yield b"x" * 2**20
        yield b'"}'

    response = httpx.post(
        f"{client.base_url}/v1/sessions/s1/exec", content=chunks(), headers=AUTH, timeout=30
    )
    assert response.status_code == 413, response.text
    assert str(MAX_BODY_BYTES) in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        '{"command": ["true"], "timeout_s": NaN}',
        '{"command": ["true"], "timeout_s": Infinity}',
        '{"command": ["true"], "timeout_s": -Infinity}',
        '{"command": ["true"], "timeout_s": 1e400}',
        '{"command": ["true"], "priority": 1e400}',
        '{"command": ["true"], "output_cap_bytes": NaN}',
        '{"command": ["true"], "turn": Infinity}',
    ],
)
def test_non_finite_numbers_get_422(client: SandboxClient, body: str) -> None:
    client.open_session("s1")
    response = httpx.post(
        f"{client.base_url}/v1/sessions/s1/exec",
        content=body,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][0] == "body"


@pytest.mark.parametrize("stream", [False, True])
def test_a_symlink_loop_cwd_gets_400(client: SandboxClient, stream: bool) -> None:
    workspace = Path(client.open_session("s1"))
    (workspace / "a").symlink_to("b")
    (workspace / "b").symlink_to("a")
    response = httpx.post(
        f"{client.base_url}/v1/sessions/s1/exec",
        json={"command": ["pwd"], "cwd": "a", "stream": stream},
        headers=AUTH,
    )
    assert response.status_code == 400, response.text
    assert response.json() == {"detail": "cwd 'a' is a symlink loop"}


def test_delete_removes_a_2000_deep_tree_and_the_id_reopens_empty(client: SandboxClient) -> None:
    workspace = Path(client.open_session("deep"))
    deep = "import os\nfor _ in range(2000):\n    os.mkdir('d')\n    os.chdir('d')"
    assert client.run("deep", ExecSpec(command=[PY, "-c", deep])).status == "ok"
    client.close_session("deep")
    assert not workspace.exists()
    assert Path(client.open_session("deep")) == workspace
    assert os.listdir(workspace) == []


@pytest.mark.parametrize("session_id", ["ok\n", "ok\r", "\nok", "o k"])
def test_a_session_id_with_a_newline_is_refused(
    client: SandboxClient, tmp_path: Path, session_id: str
) -> None:
    response = httpx.post(
        f"{client.base_url}/v1/sessions", json={"session_id": session_id}, headers=AUTH
    )
    assert response.status_code == 400, response.text
    assert "invalid session id" in response.json()["detail"]
    assert [name for name in os.listdir(tmp_path / "ws") if not name.startswith(".")] == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"command": ["true"], "env": {f"V{i}": "1" for i in range(5000)}}, "at most 1024"),
        ({"command": ["true", *["a"] * MAX_ARGS]}, f"at most {MAX_ARGS}"),
        ({"command": ["true"], "output_cap_bytes": MAX_OUTPUT_CAP_BYTES + 1}, "less than or"),
    ],
)
def test_specs_past_the_documented_limits_get_422(
    client: SandboxClient, spec: dict[str, object], message: str
) -> None:
    client.open_session("s1")
    response = httpx.post(f"{client.base_url}/v1/sessions/s1/exec", json=spec, headers=AUTH)
    assert response.status_code == 422, response.text
    assert message in response.text


def test_specs_at_the_limits_run_in_bubblewrap(client: SandboxClient) -> None:
    client.open_session("s1")
    env = {f"V{i}": "1" for i in range(MAX_ENV_VARS)}
    args = [str(i) for i in range(MAX_ARGS - 4)]
    count = "import os, sys\nprint(len(sys.argv) - 1, sum(n[0] == 'V' for n in os.environ))"
    result = client.run("s1", ExecSpec(command=[PY, "-c", count, *args], env=env))
    assert (result.status, result.stdout) == ("ok", f"{len(args)} {MAX_ENV_VARS}\n"), result


def test_metrics_stay_bounded_whatever_the_tool_names(
    service: tuple[str, SandboxPool, MemorySink],
) -> None:
    url, pool, _ = service
    for i in range(1500):
        start = clock()
        ids = {"session_id": "s", "call_id": f"c{i}", "tool": f"tool-{i}", "source": "sandbox"}
        pool.emitter.emit(ToolEnd(**ids, **start, status="ok", duration_s=0.1))
    metrics = httpx.get(f"{url}/metrics").text
    assert len(metrics) < 400_000, len(metrics)
    assert f'tool="{OTHER_TOOLS}"' in metrics
    assert f'agentmars_sandbox_tool_calls_total{{status="ok",tool="{OTHER_TOOLS}"}} ' in metrics
    assert 'tool="tool-1499"' not in metrics


# --- strings that are not Unicode text (issue 38) -----------------------------------

EXEC = "/v1/sessions/s1/exec"


def _with_surrogates(body: object) -> str:
    """``body`` as JSON, each ``@`` in it a lone surrogate (``\\ud800``, as JSON writes
    one)."""
    return json.dumps(body).replace("@", "\\ud800")


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (EXEC, {"command": ["true"], "tool": "a@"}, "tool"),
        (EXEC, {"command": ["true"], "call_id": "@"}, "call_id"),
        (EXEC, {"command": ["echo", "a@"]}, "command[1]"),
        (EXEC, {"command": ["true"], "cwd": "a@"}, "cwd"),
        (EXEC, {"command": ["cat"], "stdin": "@x"}, "stdin"),
        (EXEC, {"command": ["true"], "env": {"A": "@"}}, "env['A']"),
        (EXEC, {"command": ["true"], "env": {"@": "x"}}, "a name in env"),
        (EXEC, {"command": ["true"], "stream": True, "tool": "@"}, "tool"),
        ("/v1/sessions", {"session_id": "s@"}, "session_id"),
    ],
)
def test_a_lone_surrogate_in_any_string_gets_422_naming_it(
    client: SandboxClient, path: str, body: object, where: str
) -> None:
    client.open_session("s1")
    response = httpx.post(
        client.base_url + path,
        content=_with_surrogates(body),
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert f"{where} is not Unicode text: it holds a lone surrogate" in error["msg"]


def test_a_low_surrogate_before_a_high_one_is_no_pair(client: SandboxClient) -> None:
    client.open_session("s1")
    response = httpx.post(
        f"{client.base_url}{EXEC}",
        content='{"command": ["true"], "tool": "a\\udc00\\ud800"}',
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert "tool is not Unicode text" in response.json()["detail"][0]["msg"]


def test_a_lone_surrogate_as_raw_bytes_gets_422(client: SandboxClient) -> None:
    """The UTF-8-like bytes of a surrogate (CESU-8), which Python's JSON reader decodes
    to one."""
    client.open_session("s1")
    body = b'{"command": ["true"], "tool": "a\xed\xa0\x80"}'
    response = httpx.post(
        f"{client.base_url}/v1/sessions/s1/exec",
        content=body,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert "tool is not Unicode text" in response.json()["detail"][0]["msg"]


def test_an_error_that_quotes_a_lone_surrogate_still_renders(client: SandboxClient) -> None:
    """Past the values the check looks at (a command far too long), the fields' own
    errors name the surrogate, escaped."""
    client.open_session("s1")
    body = _with_surrogates({"command": ["x"] * 20_000, "tool": "a@"})
    response = httpx.post(
        f"{client.base_url}/v1/sessions/s1/exec",
        content=body,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    errors = {tuple(e["loc"]): e for e in response.json()["detail"]}
    assert errors[("body", "tool")]["input"] == "a\\ud800"
    assert ("body", "command") in errors


def test_non_ascii_text_and_surrogate_pairs_pass(client: SandboxClient) -> None:
    client.open_session("s1")
    body = '{"command": ["sh", "-c", "cat; echo $A"], "env": {"A": "\\ud83d\\ude00"}, "stdin": "é"}'
    response = httpx.post(
        f"{client.base_url}/v1/sessions/s1/exec",
        content=body,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["stdout"] == "é\U0001f600\n"


def test_a_turn_no_event_can_carry_gets_422(client: SandboxClient) -> None:
    client.open_session("s1")
    response = httpx.post(
        f"{client.base_url}/v1/sessions/s1/exec",
        json={"command": ["true"], "turn": MAX_COUNT + 1},
        headers=AUTH,
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "turn"]
