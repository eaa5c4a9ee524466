"""The session-affinity router (docs/ray-serve.md): its choice logic on stand-in
replicas (``affinity.SessionPlacer``, no Ray), and the router itself on a local Ray
cluster with two twin replicas (slow; the Ray env's python, ``AGENTMARS_RAY_PYTHON``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from agentmars.sdk.events import KVStats
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.policies.capabilities import PolicyRefused
from agentmars.server.routing.affinity import EngineRequest, SessionPlacer, routing_stats

BLOCK = 16
DRIVER = Path(__file__).with_name("ray_driver.py")
RESULT = "ray-driver result: "
"""What ``ray_driver.py`` puts before its result line."""


def stand_in(free: int, total: int = 100, sessions: int = 0) -> dict[str, Any]:
    """A stand-in replica's routing stats: what ``TwinReplica.record_routing_stats``
    answers, with these many free blocks."""
    kv = KVStats(total_blocks=total, free_blocks=free, used_blocks=total - free, source="engine")
    return routing_stats(kv, sessions)


def call(session: str, prompt_tokens: int = 10, call_id: str = "c") -> CallMeta:
    return CallMeta(
        session_id=session,
        call_id=call_id,
        turn=None,
        follows_tool=False,
        expects_tool=False,
        prompt_tokens=prompt_tokens,
        ephemeral=False,
    )


def live(**replicas: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Stand-in live replicas by key, in the order given."""
    return list(replicas.items())


def test_first_call_is_placed_by_the_policy() -> None:
    """mori (ThunderAgent's fit): the replica with the most KV room."""
    placer = SessionPlacer("mori", block_size=BLOCK)
    assert placer.choose(call("a"), live(r0=stand_in(free=10), r1=stand_in(free=60))) == "r1"
    assert placer.choose(call("b"), live(r0=stand_in(free=70), r1=stand_in(free=60))) == "r0"


def test_later_calls_stay_on_the_replica_while_it_lives() -> None:
    placer = SessionPlacer("mori", block_size=BLOCK)
    assert placer.choose(call("a"), live(r0=stand_in(free=10), r1=stand_in(free=60))) == "r1"
    # The figures now favour r0: the session stays where its KV is.
    replicas = live(r0=stand_in(free=90), r1=stand_in(free=1))
    assert placer.choose(call("a", call_id="c2"), replicas) == "r1"
    assert placer.replica_of("a") == "r1"


def test_a_session_whose_replica_is_gone_is_placed_again() -> None:
    placer = SessionPlacer("mori", block_size=BLOCK)
    assert placer.choose(call("a"), live(r0=stand_in(free=10), r1=stand_in(free=60))) == "r1"
    assert placer.choose(call("a"), live(r0=stand_in(free=10), r2=stand_in(free=5))) == "r0"
    placer.forget("r0")
    assert placer.replica_of("a") is None


def test_a_session_the_policy_holds_gets_no_replica_until_admitted() -> None:
    """mori admits only on KV figures of every replica, and only what fits."""
    placer = SessionPlacer("mori", block_size=BLOCK)
    assert placer.choose(call("a"), live(r0={}, r1=stand_in(free=60))) is None
    assert placer.replica_of("a") is None
    # 50 blocks of 16 tokens free on each: a first prompt of 700 tokens fits one, a
    # second does not fit what is left while the first has not started.
    replicas = live(r0=stand_in(free=50), r1=stand_in(free=50))
    assert placer.choose(call("a", 700), replicas) == "r0"
    assert placer.choose(call("b", 700), replicas) == "r1"
    assert placer.choose(call("c", 700), replicas) is None
    # a's call ended (the router is told by Ray): its prompt no longer counts.
    placer.call_ended(call("a", 700))
    assert placer.choose(call("c", 700), replicas) == "r0"


def test_the_default_placement_spreads_sessions_between_reports() -> None:
    """fcfs keeps ``AdmissionHalf.place``: the fewest sessions, counting those placed
    since the replica's last figures."""
    placer = SessionPlacer("fcfs", block_size=BLOCK)
    replicas = live(r0=stand_in(free=50, sessions=1), r1=stand_in(free=50, sessions=0))
    assert [placer.choose(call(s), replicas) for s in "abc"] == ["r1", "r0", "r1"]


def test_a_policy_needing_what_the_router_lacks_is_refused() -> None:
    with pytest.raises(PolicyRefused, match="tool-figures"):
        SessionPlacer("mars", block_size=BLOCK)


def test_the_request_names_its_session_as_the_gateway_reads_it() -> None:
    body = {"prompt": "x" * 40, "vllm_xargs": {"call_id": "k1"}}
    meta = EngineRequest("/v1/completions", {"x-session-id": "s1"}, body).meta()
    assert meta is not None
    assert (meta.session_id, meta.call_id, meta.prompt_tokens) == ("s1", "k1", 10)
    body = {"messages": [{"role": "user", "content": "hi"}], "session_id": "s2"}
    meta = EngineRequest("/v1/chat/completions", {}, body).meta()
    assert meta is not None and meta.session_id == "s2"
    # A malformed one is left to the replica's 400.
    assert EngineRequest("/v1/completions", {}, {"vllm_xargs": 3}).meta() is None


def test_a_call_naming_no_session_is_forgotten_when_it_ends() -> None:
    placer = SessionPlacer("fcfs", block_size=BLOCK)
    meta = EngineRequest("/v1/completions", {}, {"prompt": "hi"}).meta()
    assert meta is not None and meta.ephemeral
    assert placer.choose(meta, live(r0=stand_in(free=50))) == "r0"
    placer.call_ended(meta)
    assert placer.replica_of(meta.session_id) is None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _processes_under(directory: str) -> list[str]:
    """Processes whose command line names ``directory`` (Ray's own, of that cluster)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if directory in cmdline:
            found.append(f"{process.info['pid']}: {cmdline[:120]}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sessions_stay_on_one_replica_on_ray(ray_python: Path) -> None:
    """Four sessions of three calls each, interleaved, through Ray Serve's proxy to two
    twin replicas under mori: each session's calls reach one replica, both replicas
    serve sessions, and Ray leaves no process behind."""
    # Short: Ray's sockets live under it (a Unix socket path has at most 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="am-ray-", dir="/tmp")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        done = subprocess.run(
            [str(ray_python), str(DRIVER), temp_dir, str(_free_port()), "mori", "4", "3"],
            capture_output=True,
            text=True,
            timeout=540,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        result = next(line for line in done.stdout.splitlines() if line.startswith(RESULT))
        seen: dict[str, list[str]] = json.loads(result.removeprefix(RESULT))
        assert sorted(seen) == ["s0", "s1", "s2", "s3"]
        for session, replicas in seen.items():
            assert len(replicas) == 3 and len(set(replicas)) == 1, (session, seen)
        assert len({replicas[0] for replicas in seen.values()}) == 2, seen
        assert _processes_under(temp_dir) == []
    finally:
        for leftover in psutil.process_iter(["cmdline"]):
            if temp_dir in " ".join(leftover.info["cmdline"] or ()):
                leftover.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)
