"""The gateway's bounds under hostile input (issue 10): bodies counted as they arrive,
event values a scrape can render, oversized events, event streams and their buffers,
slow clients of the gateway's own process."""

from __future__ import annotations

import contextlib
import http.client
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psutil
import pytest

from agentmars.sdk.auth import GATEWAY_TOKEN_ENV as TOKEN_ENV
from agentmars.sdk.events import LLMEnd, LLMSubmit, SessionStart, ToolStats
from agentmars.sdk.http_guard import HEADER_TIMEOUT_S
from agentmars.sdk.wire import STREAM_PATH
from agentmars.server.gateway.app import MAX_BODY_BYTES
from agentmars.server.gateway.call_meta import call_metadata
from agentmars.server.gateway.events import (
    MAX_STREAMS,
    STREAM_BUFFER_BYTES,
    CallRecorder,
)
from agentmars.server.web.ingest import EVENTS_PATH, MAX_EVENT_BYTES, EventHub
from agentmars.server.web.serving import serve_in_subprocess
from tests.raw_http import connected, send_chunked_until_answered
from tests.server.gateway.conftest import AUTH, MODEL, TOKEN, Engine, Gateway

MIB = 1024 * 1024
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_a_chunked_completion_body_past_the_limit_gets_413_and_is_not_read(
    gateway: Gateway, engine: Engine
) -> None:
    process = psutil.Process()
    with connected(gateway.url) as sock:
        rss_before = process.memory_info().rss
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        sent = send_chunked_until_answered(sock, 3 * MAX_BODY_BYTES)
        response = http.client.HTTPResponse(sock)
        response.begin()
        detail = response.read()
        grown = process.memory_info().rss - rss_before
    assert response.status == 413
    assert str(MAX_BODY_BYTES).encode() in detail
    assert sent < MAX_BODY_BYTES + 16 * MIB  # answered as the limit passed, not at the end
    assert grown < MAX_BODY_BYTES + 16 * MIB  # what it read up to the limit, no more
    assert engine.requests == []


def test_an_event_body_declared_past_its_limit_gets_413_unread(gateway: Gateway) -> None:
    with connected(gateway.url) as sock:
        sock.sendall(
            f"POST {EVENTS_PATH} HTTP/1.1\r\nHost: gw\r\nAuthorization: {AUTH['authorization']}"
            f"\r\nContent-Length: {17 * MIB}\r\n\r\n".encode()
        )
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 413


def test_a_window_past_a_double_is_refused_and_metrics_stay_up(gateway: Gateway) -> None:
    huge = '{"v":1,"kind":"window_update","window":1' + "0" * 400 + ',"previous":0}'
    posted = httpx.post(f"{gateway.url}{EVENTS_PATH}", content=huge, headers=AUTH)
    assert posted.status_code == 400
    assert "window" in posted.json()["detail"]["message"]
    assert gateway.hub.count == 0
    scrape = httpx.get(f"{gateway.url}/metrics")
    assert scrape.status_code == 200
    assert "# TYPE agentmars_admission_window_sessions gauge" in scrape.text
    assert "agentmars_admission_window_sessions{" not in scrape.text  # no window came


def test_an_event_past_the_per_event_limit_gets_413_and_nothing_is_kept(
    gateway: Gateway,
) -> None:
    small = SessionStart(session_id="ok")
    big = SessionStart(session_id="big", metadata={"blob": "x" * (MAX_EVENT_BYTES + 1)})
    body = small.to_json() + "\n" + big.to_json() + "\n"
    posted = httpx.post(f"{gateway.url}{EVENTS_PATH}", content=body, headers=AUTH, timeout=30)
    assert posted.status_code == 413
    assert "event 2 of the batch" in posted.json()["detail"]
    assert gateway.hub.count == 0


@dataclass
class Stream:
    response: httpx.Response
    lines: Iterator[str]
    """Kept: a line iterator that is collected closes the connection."""

    @property
    def status_code(self) -> int:
        return self.response.status_code


def _open_stream(client: httpx.Client, url: str) -> Stream:
    response = client.send(client.build_request("GET", url + STREAM_PATH), stream=True)
    stream = Stream(response, response.iter_lines())
    if response.status_code == 200:
        next(stream.lines)  # the stream's opening comment: it is subscribed
    return stream


def test_event_streams_past_the_limit_get_429_until_one_closes(gateway: Gateway) -> None:
    with httpx.Client(headers=AUTH, timeout=10) as client:
        streams = [_open_stream(client, gateway.url) for _ in range(MAX_STREAMS)]
        assert [s.status_code for s in streams] == [200] * MAX_STREAMS
        refused = _open_stream(client, gateway.url)
        assert refused.status_code == 429
        assert str(MAX_STREAMS) in refused.response.read().decode()
        streams.pop().response.close()
        deadline = time.monotonic() + 5
        while (again := _open_stream(client, gateway.url)).status_code == 429:
            assert time.monotonic() < deadline, "a closed stream never freed its place"
        streams.append(again)
        for stream in streams:
            stream.response.close()


def test_a_stream_reader_that_falls_behind_loses_events_past_its_byte_buffer(
    gateway: Gateway,
) -> None:
    blob = "x" * (MAX_EVENT_BYTES - 1000)
    events = [SessionStart(session_id=f"s{i}", metadata={"blob": blob}) for i in range(40)]
    with httpx.Client(headers=AUTH, timeout=10) as client:
        stream = _open_stream(client, gateway.url)
        gateway.hub.publish(events)  # one batch: the stream's buffer takes it at once
        delivered = dropped = 0
        while delivered + dropped < len(events):
            line = next(stream.lines)
            delivered += line.startswith("data: ")
            if line.startswith(": dropped "):
                dropped = int(line.removeprefix(": dropped "))
        stream.response.close()
    assert delivered <= STREAM_BUFFER_BYTES // len(blob)
    assert dropped == len(events) - delivered


def test_the_gateway_process_closes_a_connection_that_sends_no_request() -> None:
    argv = [sys.executable, "-m", "agentmars.server.gateway.app", "--upstream", "http://x"]
    with serve_in_subprocess(argv, env={TOKEN_ENV: TOKEN}) as url, connected(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")  # and never the end
        started = time.monotonic()
        sock.settimeout(HEADER_TIMEOUT_S + 10)
        with contextlib.suppress(ConnectionResetError):  # closed, unread bytes or not
            assert sock.recv(1) == b""
        held = time.monotonic() - started
    assert HEADER_TIMEOUT_S - 1 < held < HEADER_TIMEOUT_S + 5


def test_completions_within_the_limit_still_go_through(gateway: Gateway) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi" * 1000}]}
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=10)
    assert answer.status_code == 200
    ingest = httpx.post(
        f"{gateway.url}{EVENTS_PATH}", content=ToolStats(active=1).to_json(), headers=AUTH
    )
    assert ingest.json() == {"accepted": 1}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vllm_xargs.expected_tool_s", "1" + "0" * 400),  # past a float: OverflowError, a 500
        ("vllm_xargs.expected_tool_s", "1e300"),
        ("vllm_xargs.turn", str(2**53 + 1)),  # past what the call's events can carry
        ("priority", "-1" + "0" * 400),
    ],
    ids=["seconds-past-a-float", "seconds-past-max", "turn-past-2-53", "priority-past-2-53"],
)
def test_numbers_out_of_bounds_in_a_completion_get_400_naming_them(
    gateway: Gateway, engine: Engine, field: str, value: str
) -> None:
    xargs = {"session_id": "s", "next_tool": "pytest"}
    body = json.dumps({**CHAT, "vllm_xargs": xargs}).encode()
    name = field.rpartition(".")[2]
    where = b'"vllm_xargs": {' if field.startswith("vllm_xargs.") else b"{"
    body = body.replace(where, where + f'"{name}": {value}, '.encode(), 1)
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 400
    assert field.replace("priority", "'priority'") in answer.json()["error"]["message"]
    assert engine.requests == []


def test_the_recorder_drops_engine_counts_its_events_cannot_carry() -> None:
    hub = EventHub()
    meta = call_metadata({}, {"session_id": "s"})
    recorder = CallRecorder(hub, meta, 0, {"max_tokens": 10**400})
    recorder.observe({"usage": {"prompt_tokens": 2**60, "completion_tokens": 3}}, chunk=False)
    recorder.end()
    submit, end = hub.events()
    assert isinstance(submit, LLMSubmit) and submit.max_tokens is None
    assert isinstance(end, LLMEnd) and (end.prompt_tokens, end.output_tokens) == (None, 3)
