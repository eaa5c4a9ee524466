"""``agentmars serve --engine sim --profile cpu-tiny`` under the hostile clients of
issue 38 (item 6), as a user runs it, on loopback: legal bodies that would cost the
gateway a gigabyte to parse, and lone surrogates in events and LLM calls. About 15 s."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from agentmars.server.gateway.app import MAX_BODY_BYTES
from agentmars.server.web.json_body import MAX_JSON_CONTAINERS
from tests.cli.serving import Twin, served_twin

MIB = 1024 * 1024
SMALL = {"model": "cpu-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
SLOWEST_SMALL_CALL_S = 1.0
"""A small call made while the big bodies are read (it takes about 15 ms alone; before
issue 38's fix, 12 s while four bodies of a million empty messages were parsed)."""


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    with served_twin() as served:
        yield served


def _empty_messages(count: int) -> bytes:
    """A legal chat body of ``count`` empty messages: 3 bytes each."""
    return b'{"model":"cpu-tiny","messages":[' + b"{}," * (count - 1) + b"{}]}"


@pytest.mark.parametrize(
    "messages",
    [1_000_000, (MAX_BODY_BYTES - 64) // 3],
    ids=["a million empty messages", "32 MiB of empty messages"],
)
def test_bodies_past_the_json_bounds_are_refused_unparsed_while_other_calls_go_on(
    twin: Twin, messages: int
) -> None:
    body = _empty_messages(messages)
    assert len(body) <= MAX_BODY_BYTES
    server = psutil.Process(twin.pid)
    assert httpx.post(f"{twin.base}/v1/chat/completions", json=SMALL, timeout=30).is_success
    rss_before = peak = server.memory_info().rss
    answers: list[httpx.Response] = []
    small: list[tuple[int, float]] = []
    big_ones_in_flight = threading.Event()
    done = threading.Event()

    def watch_memory() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, server.memory_info().rss)
            time.sleep(0.005)

    def big() -> None:
        answer = httpx.post(
            f"{twin.base}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
        answers.append(answer)

    def small_calls() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                during = big_ones_in_flight.is_set()
                started = time.monotonic()
                status = client.post(f"{twin.base}/v1/chat/completions", json=SMALL).status_code
                if during:
                    small.append((status, time.monotonic() - started))
                time.sleep(0.01)

    helpers = [threading.Thread(target=watch_memory), threading.Thread(target=small_calls)]
    bigs = [threading.Thread(target=big) for _ in range(4)]
    for thread in helpers:
        thread.start()
    time.sleep(0.1)
    big_ones_in_flight.set()
    for thread in bigs:
        thread.start()
    for thread in bigs:
        thread.join()
    big_ones_in_flight.clear()
    done.set()
    for thread in helpers:
        thread.join()

    assert len(answers) == 4
    for answer in answers:
        assert answer.status_code == 413, answer.text
        error = answer.json()["error"]  # OpenAI's error body, as the gateway's others
        assert error["code"] == 413 and error["type"] == "invalid_request_error"
        assert f"more JSON objects and arrays than the {MAX_JSON_CONTAINERS}" in error["message"]
    # Ours: held as it arrives, then once whole (starlette joins the chunks): nothing
    # parsed. Before the fix: 1.95 GB for the 32 MiB bodies, +270 MB for the others.
    assert peak - rss_before <= 2 * 4 * len(body) + 32 * MIB
    assert small, "no small call was made while the big bodies were read"
    assert all(status == 200 for status, _ in small), small
    assert max(took for _, took in small) < SLOWEST_SMALL_CALL_S, small


def _raw(value: object) -> bytes:
    """JSON text in which a lone surrogate is the escape ``\\ud800`` (as a client writes it)."""
    return json.dumps(value).encode()


LONE = "a\ud800"


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"kind": "session_start", "session_id": "s", "agent": LONE}, "agent"),
        ({"kind": "session_start", "session_id": "s", "metadata": {LONE: "x"}}, "metadata"),
        ({"kind": "session_start", "session_id": LONE}, "session_id"),
        ({"kind": "tool_start", "session_id": "s", "call_id": "c", "tool": LONE}, "tool"),
        ({"kind": "llm_end", "session_id": "s", "call_id": "c", "error": LONE}, "error"),
        (
            {
                "kind": "kv_stats",
                "total_blocks": 1,
                "free_blocks": 1,
                "used_blocks": 0,
                "released": {LONE: 1},
            },
            "released",
        ),
    ],
)
def test_a_lone_surrogate_in_an_event_is_a_400_naming_the_field(
    twin: Twin, event: dict[str, object], field: str
) -> None:
    auth = {"authorization": f"Bearer {twin.token}", "content-type": "application/json"}
    before = httpx.get(f"{twin.base}/healthz", timeout=10).json()["events"]
    for body in (_raw({"v": 1, **event}), _raw([{"v": 1, **event}])):  # JSONL, JSON array
        answer = httpx.post(f"{twin.base}/v1/events", content=body, headers=auth, timeout=10)
        assert answer.status_code == 400, answer.text
        message = answer.json()["detail"]["message"]
        assert field in message and ("surrogate" in message or "unicode" in message), message
    assert httpx.get(f"{twin.base}/healthz", timeout=10).json()["events"] == before


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**SMALL, "session_id": LONE}),
        ("/v1/chat/completions", {**SMALL, "messages": [{"role": "user", "content": LONE}]}),
        ("/v1/chat/completions", {**SMALL, "messages": [{"role": LONE, "content": "x"}]}),
        (
            "/v1/chat/completions",
            {**SMALL, "stream": True, "messages": [{"role": "user", "content": LONE}]},
        ),
        ("/v1/chat/completions", {**SMALL, "model": LONE}),
        ("/v1/chat/completions", {**SMALL, "session_id": "s", "vllm_xargs": {"agent": LONE}}),
        ("/v1/chat/completions", {**SMALL, "session_id": "s", "vllm_xargs": {"next_tool": LONE}}),
        ("/v1/chat/completions", {**SMALL, "prompt_cache_key": LONE}),
        ("/v1/chat/completions", {**SMALL, LONE: 1}),
        ("/v1/completions", {"model": "cpu-tiny", "prompt": LONE, "max_tokens": 1}),
        ("/v1/messages", {**SMALL, "metadata": {"user_id": LONE}}),
    ],
)
def test_a_lone_surrogate_in_an_llm_call_is_a_4xx(
    twin: Twin, path: str, body: dict[str, object]
) -> None:
    headers = {"content-type": "application/json"}
    answer = httpx.post(f"{twin.base}{path}", content=_raw(body), headers=headers, timeout=30)
    assert 400 <= answer.status_code < 500, answer.text
    assert httpx.post(f"{twin.base}/v1/chat/completions", json=SMALL, timeout=30).is_success
