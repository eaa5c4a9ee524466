"""The plugin's CPU KV tier on the real vLLM CPU engine (docs/vllm-plugin.md "The CPU KV
tier"): vLLM's ``OffloadingConnector`` with the agentmars spec, manager and eviction
policy, on the tiny model with 64 KV blocks and a CPU tier as large (seed 003's tight
1x).

A session whose call the policy offloads (``offload_policy``: agent ``idle``) keeps its
KV in the CPU tier while four larger calls of other sessions pass (108 blocks, more
than either tier holds): its next call finds its prefix there (``cached_tokens`` and
``vllm:external_prefix_cache_hits``), loads it back (a memcpy here) and answers as the
first call did. Under plain LRU (``fcfs`` with the same tier: the policy never
offloads, so the tier is vLLM's own LRU) the same traffic evicts it. A session's end
(the gateway's ``session_end`` on the side channel) discards its chunks.

Two vLLM servers start, one at a time, on core 0."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.sdk.events import SessionEnd
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, SERVED_MODEL_NAME
from agentmars.server.engines.vllm.smoke import model_vocab_size, random_prompt
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from tests.server.engines.vllm.helpers import (
    LinkedEngine,
    engine_metric,
    kv_status,
    linked_vllm,
    send_hints,
)
from tests.server.engines.vllm.offload_policy import IDLE
from tests.server.engines.vllm.offload_policy import NAME as OFFLOAD_IDLE

KV_BLOCKS = 64
CPU_BLOCKS = KV_BLOCKS
"""The CPU tier as large as the GPU's (``agentmars serve``'s default)."""
IDLE_TOKENS = 1100
"""The idle session's prompt: 8 full blocks (1,024 tokens) are hashed and stored."""
IDLE_BLOCKS = IDLE_TOKENS // CPU_BLOCK_SIZE
BUSY_TOKENS = 3500
"""Each busy call: 27 blocks; four of them (108) overflow both tiers."""
BUSY_CALLS = 4
HITS = "vllm:external_prefix_cache_hits"


def _complete(url: str, prompt: list[int], session: str, agent: str) -> dict[str, Any]:
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0.0,
        "ignore_eos": True,
        "vllm_xargs": {"session_id": session, "agent": agent},
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _cached(answer: dict[str, Any]) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _busy_traffic(url: str, vocab: int, seed: int) -> None:
    for i in range(BUSY_CALLS):
        prompt = random_prompt(BUSY_TOKENS, vocab, seed=seed + i)
        _complete(url, prompt, f"busy-{seed}-{i}", "busy")


@pytest.fixture
def vocab(vllm_python: Path) -> int:
    return model_vocab_size(tiny_model_made_by(vllm_python))


@pytest.fixture
def typed(vllm_python: Path, tmp_path: Path) -> Iterator[LinkedEngine]:
    with linked_vllm(
        vllm_python,
        tmp_path,
        OFFLOAD_IDLE,
        modules=["tests.server.engines.vllm.offload_policy"],
        num_blocks=KV_BLOCKS,
        cpu_kv_blocks=CPU_BLOCKS,
    ) as engine:
        yield engine


@pytest.fixture
def plain_lru(vllm_python: Path, tmp_path: Path) -> Iterator[LinkedEngine]:
    with linked_vllm(
        vllm_python, tmp_path, "fcfs", num_blocks=KV_BLOCKS, cpu_kv_blocks=CPU_BLOCKS
    ) as engine:
        yield engine


@pytest.mark.slow
def test_an_idle_session_keeps_its_kv_in_the_cpu_tier_and_reloads_it(
    typed: LinkedEngine, vocab: int
) -> None:
    url = typed.url
    figures = kv_status(typed.status)
    assert (figures.cpu_total_blocks, figures.total_blocks) == (CPU_BLOCKS, KV_BLOCKS - 1)
    assert "agentmars: CPU KV tier of 64 blocks" in typed.log.read_text()

    prompt = random_prompt(IDLE_TOKENS, vocab, seed=1)
    first = _complete(url, prompt, "a", IDLE)
    assert _cached(first) == 0
    _busy_traffic(url, vocab, seed=100)
    hits = engine_metric(url, HITS)
    second = _complete(url, prompt, "a", IDLE)
    # The whole stored prefix came from the CPU tier (the GPU's cache lost it) ...
    assert _cached(second) == IDLE_BLOCKS * CPU_BLOCK_SIZE
    assert engine_metric(url, HITS) - hits == IDLE_BLOCKS * CPU_BLOCK_SIZE
    # ... and was loaded back as it was computed: the same greedy answer.
    assert second["choices"][0]["text"] == first["choices"][0]["text"]

    # The session ends: its chunks go now (the plugin takes the event at its next step).
    send_hints(typed.hints_address, SessionEnd(session_id="a", turns=2))
    time.sleep(0.5)
    _busy_traffic(url, vocab, seed=200)
    assert f"session a ended: {IDLE_BLOCKS} CPU-tier blocks discarded" in typed.log.read_text()
    assert _cached(_complete(url, prompt, "a", IDLE)) == 0
    log = typed.log.read_text()
    assert "Traceback" not in log and "EngineDeadError" not in log, log[-3000:]


@pytest.mark.slow
def test_under_plain_lru_the_same_traffic_evicts_it(plain_lru: LinkedEngine, vocab: int) -> None:
    url = plain_lru.url
    assert kv_status(plain_lru.status).cpu_total_blocks == CPU_BLOCKS
    prompt = random_prompt(IDLE_TOKENS, vocab, seed=1)
    _complete(url, prompt, "a", IDLE)
    _busy_traffic(url, vocab, seed=100)
    hits = engine_metric(url, HITS)
    assert _cached(_complete(url, prompt, "a", IDLE)) == 0
    assert engine_metric(url, HITS) == hits
