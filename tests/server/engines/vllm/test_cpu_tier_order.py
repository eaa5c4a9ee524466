"""The CPU tier's typed eviction order (``cpu_tier.labels``, no vLLM): inactive sessions'
chunks first, then busy, then idle; the least recently used session first within a
label; a session's tail before its head; a shared chunk kept as its best-kept session's;
and a session's end returning the chunks only it owned. The last tests run the tier over
vLLM's own classes (its LRU, its manager's interface, the spec) in the vLLM environment
and, at the unit level, in vLLM 0.33's (slow)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

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
import inspect, json
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy
from agentmars.server.engines.vllm.cpu_tier.labels import Label
from agentmars.server.engines.vllm.cpu_tier.offload import AgentmarsCachePolicy

def fill(policy):
    # vLLM 0.33's insert takes the storing request's context, 0.32's does not.
    with_context = "req_context" in inspect.signature(policy.insert).parameters
    for session, keys in (("idle", [b"i0", b"i1"]), ("gone", [b"g0", b"g1"])):
        context = ReqContext(req_id="req-" + session)
        for i, key in enumerate(keys):
            context.set_offload_key_position(key, 128 * (i + 1))
            chunk = ChunkStatus(len(policy.chunks))
            chunk.ref_cnt = 0
            policy.insert(key, chunk, *([context] if with_context else []))
        if hasattr(policy, "book"):
            policy.book.request(context.req_id, session)
        policy.on_request_finished([keys], set(keys), set(), context)

def order(policy):
    return [key.decode() for key, _ in policy.evict(4, set())]

lru, ours = LRUCachePolicy(8), AgentmarsCachePolicy(8)
fill(lru), fill(ours)
ours.book.label("idle", Label.IDLE)
ours.book.label("gone", Label.INACTIVE)
out = {"lru": order(lru), "untyped": order(ours)}
typed = AgentmarsCachePolicy(8)
fill(typed)
typed.book.typed = True
typed.book.label("idle", Label.IDLE)
out["typed"] = order(typed)
out["typed_left"] = [typed.chunks, typed.book.key_sessions] == [{}, {}]
print(json.dumps(out))
"""

TIER_SCRIPT = """
import json
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig, OffloadingModelConfig,
    OffloadingParallelConfig,
)
from agentmars.server.engines.vllm.cpu_tier import kv_transfer_config
from agentmars.server.engines.vllm.cpu_tier.labels import Label
from agentmars.server.engines.vllm.cpu_tier.offload import AgentmarsOffloadingSpec, CpuTier

# The spec as vLLM's OffloadingConnector builds it from kv_transfer_config (no worker).
spec = AgentmarsOffloadingSpec(OffloadingConfig(
    groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer",), group_id=0),),
    worker_kv_bytes_per_block=4096,
    enable_kv_cache_events=True,
    extra_config=json.loads(kv_transfer_config(4))["kv_connector_extra_config"],
    engine_id="engine",
    model=OffloadingModelConfig(name="tiny", dtype="float32"),
    cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
    parallel=OffloadingParallelConfig(
        rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
        data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
        is_parallelism_agnostic=True,
    ),
))
manager = spec.get_manager()
tier = CpuTier(manager)
# vLLM 0.33's manager reports the tier its spec sized (config_info); 0.32's has no report.
reported = manager.config_info()[0]["cpu_num_chunks"] if hasattr(manager, "config_info") else None
out = {"chunks": [spec.num_chunks, tier.total_blocks], "reported": reported}

def keys(session):
    return [make_offload_key(bytes([ord(session), i]) * 16, 0) for i in range(2)]

def store(session):
    # What vLLM's connector does for a request that stores its two blocks and ends.
    context = ReqContext(req_id="req-" + session)
    tier.request(context.req_id, session)
    manager.on_new_request(context)
    for i, key in enumerate(keys(session)):
        context.set_offload_key_position(key, 16 * (i + 1))
    prepared = manager.prepare_store(keys(session), context)
    manager.complete_store(prepared.keys_to_store, context)
    manager.on_request_finished(context)
    return [chr(key[0]) + str(key[1]) for key in prepared.evicted_keys]  # session, block

out["stores"] = [store("a"), store("b")]
out["free"] = [tier.free_blocks, manager.stored_prefix(keys("a"))]
tier.label("b", Label.BUSY)
out["offloaded"] = tier.offload("a", keys("a"), finished=False)
out["free_offloaded"] = [tier.label_of("a").value, tier.free_blocks]
evicted = store("c")
out["third"] = [evicted, manager.stored_prefix(keys("a")), manager.stored_prefix(keys("b"))]
out["hit"] = manager.lookup(keys("a")[0], ReqContext(req_id="x")) is LookupResult.HIT
list(manager.take_events())
out["ended"] = [tier.end("a"), manager.stored_prefix(keys("a"))]
removed = [sorted(e.keys) for e in manager.take_events() if e.removed]
out["removed"] = removed == [sorted(keys("a"))]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def on_vllm(scheduler_vllm_python: Path) -> dict[str, Any]:
    """Both scripts' findings, from one interpreter of the vLLM series (one import of
    vLLM), each script's on its last line."""
    done = subprocess.run(
        [str(scheduler_vllm_python), "-c", f"{POLICY_SCRIPT}\n{TIER_SCRIPT}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    policy, tier = done.stdout.strip().splitlines()[-2:]
    return {"policy": json.loads(policy), "tier": json.loads(tier)}


@pytest.mark.slow
def test_vllms_lru_until_typed_then_the_labels_order(on_vllm: dict[str, Any]) -> None:
    """``AgentmarsCachePolicy`` over vLLM's classes: it evicts as vLLM's
    ``LRUCachePolicy`` until the first offload, then in the labels' order."""
    policy = on_vllm["policy"]
    # Until a policy offloads, vLLM's own LRU: the idle session's chunks go first here.
    assert policy["untyped"] == policy["lru"] == ["i1", "i0", "g1", "g0"]
    assert policy["typed"] == ["g1", "g0", "i1", "i0"]
    assert policy["typed_left"]


@pytest.mark.slow
def test_the_tier_over_vllms_spec_and_manager(on_vllm: dict[str, Any]) -> None:
    """The spec sizes the tier from ``agentmars_cpu_blocks`` and builds our manager; a
    store, an offload, an eviction and a session's end go through vLLM's manager
    interface as vLLM's connector drives it: the idle session's chunks outlive a busy
    one's, and its end discards them with a removal event."""
    tier = on_vllm["tier"]
    assert tier["chunks"] == [4, 4]
    assert tier["reported"] in (4, None)  # 0.33 reports it, 0.32 has no report
    assert tier["stores"] == [[], []]
    assert tier["free"] == [4, 2]  # no free chunk, four evictable copies; a's two stored
    assert tier["offloaded"] and tier["free_offloaded"] == ["idle", 2]
    # The third session's store takes the busy session's chunks, tail first.
    assert tier["third"] == [["b1", "b0"], 2, 0]
    assert tier["hit"]
    assert tier["ended"] == [2, 0] and tier["removed"]
