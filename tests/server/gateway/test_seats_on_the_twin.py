"""Issue 38's probe of admission, as the clients did it: against `agentmars serve
--engine sim --profile cpu-tiny` with MARS (the default) on 127.0.0.1. Clients that
never say goodbye, a refused prompt, and a tool announced but never started must not
hold capacity: new sessions are served while the engine is idle. Each case is bounded
in time (a few dozen calls)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import httpx

from agentmars.sdk.events import SessionEnd, ToolEnd
from agentmars.server.gateway.gaps import FIRST_GAP_S
from tests.cli.serving import Twin, served_twin

MODEL = "cpu-tiny"
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
WAIT_S = 3.0
"""How long a call of a new session may take while the engine is idle (a seat given
back after a measured gap of well under a second, floored at 1 s, plus a call of a
few tokens; today's calls waited for the 300 s expiry)."""


def chat(session_id: str, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "tools": TOOLS,  # OpenHands offers its tools on every call
        **extra,
    }


def timed_call(
    client: httpx.Client, twin: Twin, session_id: str, **extra: Any
) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    response = client.post(
        f"{twin.base}/v1/chat/completions",
        json=chat(session_id, **extra),
        headers={"X-Session-ID": session_id},
    )
    return time.monotonic() - started, response


def post_event(client: httpx.Client, twin: Twin, event: ToolEnd) -> None:
    answer = client.post(
        f"{twin.base}/v1/events",
        content=event.to_json(),
        headers={"authorization": f"Bearer {twin.token}"},
    )
    assert answer.status_code == 200, answer.text


def test_sessions_that_never_say_goodbye_strand_no_seats() -> None:
    with served_twin() as twin, httpx.Client(timeout=60) as client:
        # The stream has seen one tool of about 20 s, as the sandbox reports one.
        post_event(client, twin, ToolEnd(session_id="x", call_id="t", tool="bash", duration_s=20))
        waits = []
        for n in range(12):  # one after another, two calls each, no session_end
            for _ in range(2):
                took, response = timed_call(client, twin, f"agent-{n}")
                assert response.status_code == 200, response.text
                waits.append(took)
        assert max(waits) < WAIT_S, waits  # today: 20 of 24 calls past 4 s


def test_a_refused_prompt_and_an_unstarted_tool_hold_nothing() -> None:
    with served_twin() as twin, httpx.Client(timeout=60) as client:
        # A prompt over max_model_len, no token needed: the engine's 400 at once.
        took, refused = timed_call(client, twin, "hog", content="x" * 300_000)
        assert refused.status_code == 400 and took < WAIT_S
        took, response = timed_call(client, twin, "next")
        assert response.status_code == 200 and took < WAIT_S  # today: about 300 s
        # Two sessions announce a tool "t" that never starts; then a client reports
        # a "t" of 600 s.
        xargs = {"vllm_xargs": {"expects_tool": 1, "next_tool": "t"}}
        for session_id in ("a", "b"):
            _, response = timed_call(client, twin, session_id, **xargs)
            assert response.status_code == 200
        post_event(client, twin, ToolEnd(session_id="y", call_id="t", tool="t", duration_s=600))
        for n in range(3):
            took, response = timed_call(client, twin, f"new-{n}")
            assert response.status_code == 200
            assert took < FIRST_GAP_S + WAIT_S  # today: until 302 s
        # With other sessions seated, the hog's call still gets its 4xx at once.
        took, refused = timed_call(client, twin, "hog-2", content="x" * 300_000)
        assert refused.status_code == 400 and took < WAIT_S


def test_session_idle_s_ends_a_quiet_session_recording_its_last_activity() -> None:
    with served_twin(args=["--session-idle-s", "1.5"]) as twin, httpx.Client(timeout=60) as c:
        started = time.monotonic()
        _, response = timed_call(c, twin, "quiet")
        assert response.status_code == 200
        headers = {"authorization": f"Bearer {twin.token}"}
        with c.stream("GET", f"{twin.base}/v1/events/stream", headers=headers) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and '"session_end"' in line:
                    ended = SessionEnd.model_validate_json(line.removeprefix("data: "))
                    break
        assert time.monotonic() - started >= 1.5  # the expiry, measured from its call's end
        assert (ended.session_id, ended.source) == ("quiet", "gateway")
        assert ended.error == "no call or tool for 1.5 s"
        assert ended.duration_s < 1.0  # its one call, not the expiry


def test_a_session_idle_s_that_is_no_duration_is_refused() -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "agentmars.cli.main", "serve", "--engine", "sim",
         "--profile", "cpu-tiny", "--session-idle-s", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert answer.returncode == 2 and "--session-idle-s" in answer.stderr
