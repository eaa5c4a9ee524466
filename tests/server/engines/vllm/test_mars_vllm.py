"""MARS (``AGENTMARS_POLICY=mars``, the default policy) on vLLM 0.32 CPU with the
agentmars plugin: its engine half's two KV mechanisms (docs/mars.md).

- Warm resumes, on the real stack: vLLM with the plugin behind the gateway (whose
  admission half is MARS's control plane), the two linked by the side channel as
  ``agentmars serve`` links them. A call that ends in a tool call (``expects_tool``,
  sent in ``vllm_xargs`` with the session in ``X-Session-ID``, as the SDK sends them
  through the gateway) has its session's KV pinned across the tool; the session's
  next call (``follows_tool``) finds its prefix cached after traffic that evicted
  every unpinned block, and takes the pin over (released, reason ``next_call``). A
  call that expects no tool is not pinned: the same traffic evicts its prefix.
- Chunk shrinking and partial starts, in-process: vLLM's own ``Scheduler`` with the
  plugin, built as ``engines.vllm.bench_schedule`` builds it (the real scheduler, KV
  cache manager and block pool; no model: each step's output is made up), so the
  tokens each step schedules are known exactly. A long prompt that does not fit the
  free blocks while other calls run starts on the whole blocks that fit (less what
  the running calls still need to finish) and goes on, chunk by chunk, on the blocks
  that free up; under ``fcfs`` the same queue keeps it waiting until it fits whole.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.sdk.events import LLMEnd, SessionEnd, ToolEnd, ToolStart
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, SERVED_MODEL_NAME
from agentmars.server.engines.vllm.smoke import model_vocab_size, random_prompt
from agentmars.server.gateway.app import Gateway
from tests.server.engines.vllm.helpers import (
    LinkedEngine,
    blocks,
    engine_metric,
    kv_status,
    linked_gateway,
    linked_vllm,
    post_events,
    released,
)

TOKEN = "mars-token"
KV_BLOCKS = 64
USABLE_BLOCKS = KV_BLOCKS - 1
"""vLLM keeps block 0 as its null block."""
CONTEXT_TOKENS = 1300
"""A session's first prompt: 1,300 + 4 output tokens, 10 full blocks (1,280 tokens)
hashed, and pinned."""
CONTEXT_BLOCKS = CONTEXT_TOKENS // CPU_BLOCK_SIZE
TOOL_RESULT_TOKENS = 20
DISPLACING_TOKENS = 2600
"""Each of ``DISPLACING_CALLS`` session-less calls takes 21 blocks: 84 distinct blocks,
more than the 53 left beside the pin, so every unpinned cached block is evicted."""
DISPLACING_CALLS = 4


@pytest.fixture(scope="module")
def mars_engine(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LinkedEngine]:
    folder = tmp_path_factory.mktemp("mars")
    with linked_vllm(vllm_python, folder, "mars", num_blocks=KV_BLOCKS) as engine:
        yield engine


def _call(
    client: httpx.Client,
    session: str,
    prompt: list[int],
    *,
    turn: int,
    follows_tool: bool,
    expects_tool: bool,
) -> dict[str, Any]:
    """One call of ``session`` through the gateway, with the markers the SDK sends."""
    response = client.post(
        "/v1/completions",
        json={
            "model": SERVED_MODEL_NAME,
            "prompt": prompt,
            "max_tokens": 4,
            "ignore_eos": True,
            "vllm_xargs": {
                "turn": turn,
                "follows_tool": int(follows_tool),
                "expects_tool": int(expects_tool),
                "next_tool": "bash",
            },
        },
        headers={"X-Session-ID": session},
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["usage"]["completion_tokens"] == 4
    return answer


def _tool(client: httpx.Client, session: str, turn: int) -> None:
    """A 50 ms ``bash`` between two calls, reported as the SDK reports it."""
    ids = {"session_id": session, "call_id": f"{session}-tool{turn}", "turn": turn}
    post_events(
        client,
        TOKEN,
        ToolStart(tool="bash", **ids),
        ToolEnd(tool="bash", duration_s=0.05, **ids),
    )


def _displace(engine: LinkedEngine, vocab_size: int) -> None:
    """Session-less traffic straight to vLLM (no session: never pinned)."""
    with httpx.Client(base_url=engine.url, timeout=120.0) as client:
        for seed in range(DISPLACING_CALLS):
            response = client.post(
                "/v1/completions",
                json={
                    "model": SERVED_MODEL_NAME,
                    "prompt": random_prompt(DISPLACING_TOKENS, vocab_size, 300 + seed),
                    "max_tokens": 1,
                },
            )
            assert response.status_code == 200, response.text


def _hits(engine: LinkedEngine) -> float:
    return engine_metric(engine.url, "vllm:prefix_cache_hits")


def _ends(gateway: Gateway, session: str) -> list[LLMEnd]:
    return [e for e in gateway.hub.events() if isinstance(e, LLMEnd) and e.session_id == session]


@pytest.mark.slow
def test_a_call_ending_in_a_tool_call_is_pinned_and_its_next_call_resumes_warm(
    mars_engine: LinkedEngine, vllm_python: Path
) -> None:
    vocab_size = model_vocab_size(mars_engine.config.model)
    warm_context = random_prompt(CONTEXT_TOKENS, vocab_size, seed=1)
    cold_context = random_prompt(CONTEXT_TOKENS, vocab_size, seed=2)
    with linked_gateway(mars_engine, TOKEN, "mars") as (client, gateway):
        start = kv_status(mars_engine.status)
        assert blocks(start) == (USABLE_BLOCKS, 0, 0)

        # The warm session's first call ends in a tool call: MARS pins its 10 blocks
        # (no call waits, so holding them costs nothing and the pin pays).
        _call(client, "warm", warm_context, turn=0, follows_tool=False, expects_tool=True)
        pinned = kv_status(mars_engine.status)
        assert blocks(pinned) == (USABLE_BLOCKS - CONTEXT_BLOCKS, CONTEXT_BLOCKS, 1)
        assert released(pinned, start) == {}

        # The cold session's call is its answer (no tool follows): not pinned.
        _call(client, "cold", cold_context, turn=0, follows_tool=False, expects_tool=False)
        assert blocks(kv_status(mars_engine.status)) == blocks(pinned)

        # While the warm session's tool runs, other traffic evicts every unpinned block;
        # MARS's pin review (every 0.5 s) keeps the pin: no call waits meanwhile.
        _tool(client, "warm", 0)
        _displace(mars_engine, vocab_size)
        kept = kv_status(mars_engine.status)
        assert (kept.pinned_blocks, kept.pins) == (CONTEXT_BLOCKS, 1)
        assert released(kept, start) == {}

        # The warm resume: the same context and the tool's result.
        before = _hits(mars_engine)
        warm_next = warm_context + random_prompt(TOOL_RESULT_TOKENS, vocab_size, seed=3)
        _call(client, "warm", warm_next, turn=1, follows_tool=True, expects_tool=False)
        assert _hits(mars_engine) - before == CONTEXT_BLOCKS * CPU_BLOCK_SIZE  # 1,280 tokens
        # Found by the plugin's lookup (prefix_lookup): the tiny model's layout is plain.
        assert "agentmars: prefix lookups by the plugin" in mars_engine.log.read_text()
        resumed = kv_status(mars_engine.status)
        # The next call took the pin over; it expected no tool, so it pinned nothing.
        assert released(resumed, pinned) == {"next_call": 1}
        assert blocks(resumed) == (USABLE_BLOCKS, 0, 0)
        # The gateway's record of the call agrees, where vLLM reports cached tokens.
        (_, warm_end) = _ends(gateway, "warm")
        assert warm_end.prompt_tokens == CONTEXT_TOKENS + TOOL_RESULT_TOKENS
        assert warm_end.cached_tokens in (None, CONTEXT_BLOCKS * CPU_BLOCK_SIZE)

        # The cold session's next call finds nothing: the same traffic evicted it.
        before = _hits(mars_engine)
        cold_next = cold_context + random_prompt(TOOL_RESULT_TOKENS, vocab_size, seed=4)
        _call(client, "cold", cold_next, turn=1, follows_tool=False, expects_tool=False)
        assert _hits(mars_engine) - before == 0
        assert released(kv_status(mars_engine.status), pinned) == {"next_call": 1}
        post_events(client, TOKEN, SessionEnd(session_id="warm"), SessionEnd(session_id="cold"))


# --- chunk shrinking, on vLLM's scheduler in this process ------------------------------

SHRINK_PROBE = """
import json, random, sys
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

shape = b.SchedulerShape(kv_blocks=24, block_size=16, max_num_seqs=4, max_model_len=1024)
scheduler = b.make_scheduler(sys.argv[1], ensure_tiny_model(), shape)
factory = b.RequestFactory(shape.block_size)
pool = scheduler.kv_cache_manager.block_pool
live, steps = {}, []

def submit(session, prompt, max_tokens):
    rng = random.Random(session)
    tokens = tuple(rng.randrange(1, b.VOCAB) for _ in range(prompt))
    request = factory.make(b.CallSpec(session, 0, tokens, max_tokens, last=True), [])
    live[request.request_id] = request
    scheduler.add_request(request)
    return request

def step():
    output = scheduler.schedule()
    scheduler.update_from_output(output, b.synthetic_output(output, live))
    done = sorted(r for r, request in live.items() if request.is_finished())
    steps.append({
        "tokens": dict(output.num_scheduled_tokens),
        "free": pool.get_num_free_blocks(),
        "finished": done,
    })
    for request_id in done:
        live.pop(request_id)

calls = [submit("decoder", 64, 40), submit("brief", 64, 3)]
step()
calls.append(submit("long", 340, 2))
while live and len(steps) < 200:
    step()
scheduler.shutdown()
print(json.dumps({"steps": steps, "preemptions": sum(c.num_preemptions for c in calls)}))
"""
"""Three calls on 24 blocks of 16 tokens. ``decoder`` (64 prompt tokens, 40 out:
7 blocks at its end) and ``brief`` (64 + 3: 5 blocks) start at once: 8 blocks, 16
free. Then ``long`` arrives, 340 prompt tokens: 22 blocks, more than are free while
``decoder`` runs (at most 24 - 7 = 17), so with its whole prompt reserved it waits for
``decoder`` to end. Prints each step's scheduled tokens, the free blocks after it and
the calls that finished in it."""

BLOCK = 16
LONG_PROMPT = 340


def _shrink_trace(vllm_python: Path, policy: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(vllm_python), "-c", SHRINK_PROBE, policy],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    trace: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return trace


def _chunks(trace: dict[str, Any], call: str) -> list[tuple[int, int]]:
    """(step, tokens) of each step that scheduled ``call``'s prompt."""
    scheduled = [(i, step["tokens"].get(call, 0)) for i, step in enumerate(trace["steps"])]
    return [(i, tokens) for i, tokens in scheduled if tokens > 1]  # decode steps: 1


def _finished_at(trace: dict[str, Any], call: str) -> int:
    return next(i for i, step in enumerate(trace["steps"]) if call in step["finished"])


@pytest.mark.slow
def test_a_long_prompt_starts_and_goes_on_on_the_blocks_that_fit(vllm_python: Path) -> None:
    """Under MARS ``long`` starts while ``decoder`` and ``brief`` run: of the 14 free
    blocks (after both took their first decode block), ``decoder`` still needs 2 to
    finish (blocks_for(104) - blocks_for(65)), so ``long`` takes 12 whole blocks, 192
    tokens, leaving exactly those 2 free. When ``brief`` ends (5 blocks back, 7 free)
    it goes on with 5 blocks, 80 tokens, again leaving ``decoder``'s 2; it computes the
    last 68 once ``decoder`` has ended. Under ``fcfs`` (vLLM's whole-prompt admission)
    the same queue computes its 340 tokens in one chunk after ``decoder`` ended. A
    chunk that did not shrink (340 tokens, 22 blocks, in 14) would not be allocated:
    ``long`` would not run before ``decoder`` ends."""
    mars = _shrink_trace(vllm_python, "mars")
    fcfs = _shrink_trace(vllm_python, "fcfs")
    for trace in (mars, fcfs):
        assert trace["preemptions"] == 0
        assert {r for step in trace["steps"] for r in step["finished"]} == {
            "decoder-t0",
            "brief-t0",
            "long-t0",
        }

    decoder_end = _finished_at(mars, "decoder-t0")
    brief_end = _finished_at(mars, "brief-t0")
    chunks = _chunks(mars, "long-t0")
    assert [tokens for _, tokens in chunks] == [192, 80, 68]
    assert sum(tokens for _, tokens in chunks) == LONG_PROMPT
    # Every chunk but the last is whole blocks, and the first two run beside decoder.
    assert all(tokens % BLOCK == 0 for _, tokens in chunks[:-1])
    (first, _), (second, _), (last, _) = chunks
    assert first == 1 and first < brief_end < second < decoder_end < last
    # Each shrunk chunk left free exactly the 2 blocks decoder needs to finish.
    assert mars["steps"][first]["free"] == mars["steps"][second]["free"] == 2

    # fcfs: the same prompt waits for decoder's end, then goes in one chunk.
    assert _finished_at(fcfs, "decoder-t0") == decoder_end
    ((fcfs_start, fcfs_tokens),) = _chunks(fcfs, "long-t0")
    assert (fcfs_tokens, fcfs_start) == (LONG_PROMPT, decoder_end + 1)
