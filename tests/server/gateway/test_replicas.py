"""The gateway over several engine replicas (``GatewayConfig.more_replicas``): each
session is placed once by the policy's ``place`` and all its calls go to that replica;
its events go to that replica's plugin, a session's end and what names no placed
session to every plugin; the admission view reads each replica's KV figures from its
own side channel. Real servers on loopback: two scripted engines, the plugin's own KV
publisher and hint inbox on ZMQ ipc sockets."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    SessionEnd,
    SessionMove,
    ToolStart,
    ToolStats,
    encode_jsonl,
)
from agentmars.server.engines.scripted.app import ScriptedLatency, create_scripted_llm_app
from agentmars.server.engines.vllm.hints import HintInbox
from agentmars.server.engines.vllm.kv_status import KVStatusPublisher
from agentmars.server.gateway.app import EngineReplica, GatewayConfig, create_gateway_app
from agentmars.server.gateway.metrics import replicas_exposition
from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.policies.registry import make_policy
from agentmars.server.policies.views import AdmissionView, SessionView
from agentmars.server.web.serving import serve_in_thread
from tests.server.gateway.conftest import AUTH, MODEL, TOKEN

FAST = ScriptedLatency(first_token_s=0.0, per_token_s=0.0)


@contextlib.contextmanager
def _engines(count: int) -> Iterator[list[tuple[str, Any]]]:
    """``count`` scripted engines: (URL, app state whose ``requests`` they recorded)."""
    with contextlib.ExitStack() as stack:
        engines = []
        for _ in range(count):
            app = create_scripted_llm_app(FAST, model=MODEL)
            engines.append((stack.enter_context(serve_in_thread(app)), app.state))
        yield engines


@contextlib.contextmanager
def _gateway(
    replicas: Sequence[EngineReplica], policy: Policy | None = None, **config: Any
) -> Iterator[tuple[str, Any]]:
    first, *more = replicas
    app = create_gateway_app(
        GatewayConfig(
            upstream_url=first.url,
            token=TOKEN,
            plugin_kv_address=first.kv_address,
            plugin_hints_address=first.hints_address,
            more_replicas=tuple(more),
            **config,
        ),
        policy=policy,
    )
    with serve_in_thread(app) as url:
        yield url, app.state.gateway


def _call(url: str, session: str, prompt: str = "go") -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "session_id": session}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
    assert response.status_code == 200, response.text


def _sessions_served(state: Any) -> list[str]:
    return [request.body["session_id"] for request in state.requests]


def test_each_sessions_calls_go_to_the_replica_it_was_placed_on() -> None:
    with _engines(2) as engines, _gateway([EngineReplica(url) for url, _ in engines]) as (url, gw):
        # fcfs places on the replica with the fewest sessions, the first among equals.
        for session in ("a", "b", "c"):
            _call(url, session)
        for session in ("c", "a", "a", "b"):
            _call(url, session)
        assert _sessions_served(engines[0][1]) == ["a", "c", "c", "a", "a"]
        assert _sessions_served(engines[1][1]) == ["b", "b"]
        assert gw.admission.placed == {"a": 0, "b": 1, "c": 0}
        # A session that ends frees its place: the next new one goes where there is room.
        _post(url, SessionEnd(session_id="a", turns=3), SessionEnd(session_id="c", turns=2))
        _eventually(lambda: not gw.admission.placed.keys() & {"a", "c"})
        _call(url, "d")
        assert gw.admission.placed == {"b": 1, "d": 0}


def test_a_replicas_kv_figures_place_a_session_where_there_is_room(tmp_path: Path) -> None:
    """ThunderAgent places a program on the replica with the most free KV (seed 003's
    best fit): replica 1 has more room here, so both sessions go there."""
    sockets = [(f"ipc://{tmp_path}/kv{i}", f"ipc://{tmp_path}/hints{i}") for i in range(2)]
    free = [10, 50]
    publishers = [
        KVStatusPublisher(lambda i=i: _figures(free[i]), path=None, address=kv, hz=50)
        for i, (kv, _) in enumerate(sockets)
    ]
    try:
        with _engines(2) as engines:
            replicas = [
                EngineReplica(url, kv, hints)
                for (url, _), (kv, hints) in zip(engines, sockets, strict=True)
            ]
            with _gateway(replicas, make_policy("thunderagent")) as (url, gw):
                view = gw.admission.view
                _eventually(lambda: all(r.kv is not None for r in view.replicas))
                assert [r.kv.free_blocks for r in view.replicas] == [10, 50]
                assert view.kv.free_blocks == 60  # the pool, summed
                _call(url, "x")
                _call(url, "y")
                assert _sessions_served(engines[1][1]) == ["x", "y"]
                assert _sessions_served(engines[0][1]) == []
    finally:
        for publisher in publishers:
            publisher.stop()


@contextlib.contextmanager
def _hinted(
    tmp_path: Path, policy: Policy | None = None
) -> Iterator[tuple[str, Any, list[HintInbox], list[tuple[str, Any]]]]:
    """A gateway over two scripted engines, each replica's hints read by the plugin's
    own inbox: (gateway URL, gateway, inboxes, engines)."""
    hints = [f"ipc://{tmp_path}/hints{i}" for i in range(2)]
    inboxes = [HintInbox(address) for address in hints]
    try:
        with _engines(2) as engines:
            replicas = [
                EngineReplica(url, hints_address=address)
                for (url, _), address in zip(engines, hints, strict=True)
            ]
            with _gateway(replicas, policy) as (url, gw):
                yield url, gw, inboxes, engines
    finally:
        for inbox in inboxes:
            inbox.stop()


def test_events_go_to_the_placed_replicas_plugin_and_ends_to_all(tmp_path: Path) -> None:
    with _hinted(tmp_path) as (url, _gw, inboxes, _):
        _call(url, "a")  # replica 0
        _call(url, "b")  # replica 1
        tool = ToolStart(session_id="b", call_id="t1", tool="pytest")
        unplaced = ToolStart(session_id="nobody", call_id="t2", tool="grep")
        stats = ToolStats(active=2)
        end = SessionEnd(session_id="b", turns=1)
        _post(url, tool, unplaced, stats, end)
        received = [_drained(inbox, lambda e: e == end) for inbox in inboxes]
    ours = [[e for e in events if e.kind != "llm_submit" and e.kind != "llm_first_token"]
            for events in received]  # fmt: skip
    on_0 = [e for e in ours[0] if e.kind in ("tool_start", "tool_stats", "session_end")]
    on_1 = [e for e in ours[1] if e.kind in ("tool_start", "tool_stats", "session_end")]
    assert on_0 == [unplaced, stats, end]
    assert on_1 == [tool, unplaced, stats, end]
    # Each session's call events reach its own replica's plugin only.
    assert {e.session_id for e in ours[0] if e.kind == "llm_end"} == {"a"}
    assert {e.session_id for e in ours[1] if e.kind == "llm_end"} == {"b"}


class _Hop(AdmissionHalf):
    """Moves a session to the next replica at each of its calls."""

    def moves(self, session: SessionView, current: int, view: AdmissionView) -> int | None:
        return (current + 1) % len(view.replicas)


class _Hopper(Policy):
    name = "test-gateway-hopper"

    def admission(self) -> AdmissionHalf:
        return _Hop()


def test_a_moved_sessions_calls_go_to_its_new_replica_and_the_old_one_hears_it_ended(
    tmp_path: Path,
) -> None:
    with _hinted(tmp_path, _Hopper()) as (url, gw, inboxes, engines):
        for _ in range(3):
            _call(url, "a")
        moved = [e for e in gw.hub.events() if isinstance(e, SessionMove)]
        assert [(m.from_replica, m.to_replica) for m in moved] == [(0, 1), (1, 0)]
        assert gw.admission.placed == {"a": 0}
        received = [_drained(inbox, lambda e: isinstance(e, SessionEnd)) for inbox in inboxes]
    assert _sessions_served(engines[0][1]) == ["a", "a"]
    assert _sessions_served(engines[1][1]) == ["a"]
    # The replica a session leaves hears that it ended there; the stream says it moved.
    ends = [[e.error for e in events if isinstance(e, SessionEnd)] for events in received]
    assert ends[0][0] == "moved to replica 1"
    assert ends[1][0] == "moved to replica 0"
    assert not any(isinstance(e, SessionMove) for events in received for e in events)


def test_replicas_are_given_whole_or_refused() -> None:
    mixed = GatewayConfig(
        upstream_url="http://127.0.0.1:1",
        token=TOKEN,
        plugin_kv_address="ipc:///tmp/kv0",
        more_replicas=(EngineReplica("http://127.0.0.1:2"),),
    )
    with pytest.raises(ValueError, match="some replicas have a plugin kv_address and some not"):
        create_gateway_app(mixed)


def test_the_replicas_series_are_merged_with_a_replica_label() -> None:
    text = (
        "# HELP vllm:num_requests_running Requests running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 2.0\n'
    )
    merged = replicas_exposition([text, None, text.replace("2.0", "5.0")]).decode()
    assert 'vllm:num_requests_running{engine="0",replica="0"} 2.0' in merged
    assert 'vllm:num_requests_running{engine="0",replica="2"} 5.0' in merged
    assert 'replica="1"' not in merged  # a replica that gave no series
    assert merged.count("# TYPE vllm:num_requests_running gauge") == 1


# --- helpers --------------------------------------------------------------------------


def _figures(free: int) -> KVStats:
    return KVStats(source="engine", total_blocks=63, free_blocks=free, used_blocks=63 - free)


def _post(url: str, *events: AnyEvent) -> None:
    body = encode_jsonl(events)
    assert httpx.post(f"{url}/v1/events", content=body, headers=AUTH).status_code == 200


def _eventually(check: Callable[[], Any], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _drained(inbox: HintInbox, last: Callable[[AnyEvent], bool]) -> list[AnyEvent]:
    """What ``inbox`` received up to the event ``last`` matches."""
    received: list[AnyEvent] = []

    def done() -> bool:
        received.extend(inbox.drain())
        return any(last(event) for event in received)

    _eventually(done)
    return received
