"""The CPU tier's typed eviction order (``cpu_tier.labels``, no vLLM): inactive sessions'
chunks first, then busy, then idle; the least recently used session first within a
label; a session's tail before its head; a shared chunk kept as its best-kept session's;
and a session's end returning the chunks only it owned. The last test runs vLLM's own
classes in the vLLM environment (slow)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentmars.server.engines.vllm.cpu_tier import kv_transfer_config
from agentmars.server.engines.vllm.cpu_tier.labels import CpuTierBook, Label


def _book(*sessions: tuple[str, Label, list[str]]) -> CpuTierBook[str]:
    """A book whose sessions used their keys in this order (head to tail each; a key's
    position is its index in its session's list)."""
    book: CpuTierBook[str] = CpuTierBook()
    book.typed = True
    for session, label, keys in sessions:
        book.request(f"req-{session}", session)
        book.label(session, label)
        positions = {key: (i + 1) * 128 for i, key in enumerate(keys)}
        book.note(f"req-{session}", keys, positions.get)
    return book


def test_inactive_go_first_then_busy_then_idle_whatever_the_recency() -> None:
    book = _book(
        ("idle", Label.IDLE, ["i0", "i1"]),
        ("busy", Label.BUSY, ["b0", "b1"]),
        ("gone", Label.INACTIVE, ["g0", "g1"]),
    )
    everything = ["i0", "i1", "b0", "b1", "g0", "g1"]
    assert book.choose(everything, 6, protected=set()) == ["g1", "g0", "b1", "b0", "i1", "i0"]


def test_within_a_label_the_least_recently_used_session_goes_first_tail_first() -> None:
    book = _book(
        ("old", Label.INACTIVE, ["o0", "o1", "o2"]),
        ("new", Label.INACTIVE, ["n0", "n1"]),
    )
    keys = ["o0", "o1", "o2", "n0", "n1"]
    assert book.choose(keys, 3, protected=set()) == ["o2", "o1", "o0"]
    # The old session used again: now it is the newer one.
    book.note("req-old", ["o0"], lambda key: None)
    assert book.choose(keys, 2, protected=set()) == ["n1", "n0"]


def test_protected_keys_stay_and_too_few_candidates_evict_nothing() -> None:
    book = _book(("s", Label.INACTIVE, ["k0", "k1", "k2"]))
    assert book.choose(["k0", "k1", "k2"], 2, protected={"k2"}) == ["k1", "k0"]
    assert book.choose(["k0", "k1", "k2"], 3, protected={"k2"}) is None


def test_a_shared_prefix_is_kept_as_its_best_kept_session() -> None:
    book = _book(
        ("idle", Label.IDLE, ["p0", "i1"]),
        ("gone", Label.INACTIVE, ["p0", "g1"]),
    )
    # p0 is both sessions' head: it goes with the idle session's chunks, last.
    assert book.choose(["p0", "i1", "g1"], 3, protected=set()) == ["g1", "i1", "p0"]


def test_a_chunk_no_session_owns_goes_first() -> None:
    book = _book(("busy", Label.BUSY, ["b0"]))
    book.note("req-anonymous", ["x0"], lambda key: 128)  # a request without a session
    assert book.choose(["b0", "x0"], 1, protected=set()) == ["x0"]


def test_labels_follow_the_sessions_and_an_end_returns_only_its_own_chunks() -> None:
    book = _book(
        ("a", Label.IDLE, ["p0", "a1"]),
        ("b", Label.BUSY, ["p0", "b1"]),
    )
    assert book.label_of("a") is Label.IDLE
    assert book.label_of("never-seen") is Label.INACTIVE
    assert book.end("a") == {"a1"}
    assert book.label_of("a") is Label.INACTIVE
    assert book.key_sessions["p0"] == {"b"}
    book.forget_key("b1")
    assert book.session_keys["b"] == {"p0"}


def test_the_connector_config_names_our_spec_and_policy_and_the_size_in_blocks() -> None:
    import json

    config = json.loads(kv_transfer_config(64))
    extra = config["kv_connector_extra_config"]
    assert config["kv_connector"] == "OffloadingConnector"
    assert (extra["spec_name"], extra["eviction_policy"]) == (
        "AgentmarsOffloadingSpec",
        "AgentmarsCachePolicy",
    )
    assert extra["spec_module_path"] == "agentmars.server.engines.vllm.cpu_tier.offload"
    assert (extra["agentmars_cpu_blocks"], extra["offload_prompt_only"]) == (64, False)


POLICY_SCRIPT = """
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy
from agentmars.server.engines.vllm.cpu_tier.labels import Label
from agentmars.server.engines.vllm.cpu_tier.offload import AgentmarsCachePolicy

def fill(policy):
    for session, keys in (("idle", [b"i0", b"i1"]), ("gone", [b"g0", b"g1"])):
        context = ReqContext(req_id="req-" + session)
        for i, key in enumerate(keys):
            context.set_offload_key_position(key, 128 * (i + 1))
            chunk = ChunkStatus(len(policy.chunks))
            chunk.ref_cnt = 0
            policy.insert(key, chunk)
        if hasattr(policy, "book"):
            policy.book.request(context.req_id, session)
        policy.on_request_finished([keys], set(keys), set(), context)

def order(policy):
    return [key for key, _ in policy.evict(4, set())]

lru, ours = LRUCachePolicy(8), AgentmarsCachePolicy(8)
fill(lru), fill(ours)
ours.book.label("idle", Label.IDLE)
ours.book.label("gone", Label.INACTIVE)
# Until a policy offloads, vLLM's own LRU: the idle session's chunks go first here.
assert order(ours) == order(lru) == [b"i1", b"i0", b"g1", b"g0"], order(ours)
typed = AgentmarsCachePolicy(8)
fill(typed)
typed.book.typed = True
typed.book.label("idle", Label.IDLE)
assert order(typed) == [b"g1", b"g0", b"i1", b"i0"]
assert typed.chunks == {} and typed.book.key_sessions == {}
print("ok")
"""


@pytest.mark.slow
def test_vllms_lru_until_typed_then_the_labels_order(vllm_python: Path) -> None:
    """``AgentmarsCachePolicy`` in the vLLM environment: it evicts as vLLM's
    ``LRUCachePolicy`` until the first offload, then in the labels' order."""
    done = subprocess.run(
        [str(vllm_python), "-c", POLICY_SCRIPT],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
