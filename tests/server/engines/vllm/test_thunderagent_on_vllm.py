"""ThunderAgent on the real vLLM CPU engine behind the gateway, the two linked by the side
channel as ``agentmars serve`` links them: the engine half (in vLLM) pauses a session
when the contexts it counts exceed the KV capacity, the engine publishes
``session_pause`` to the gateway, whose admission half then holds new sessions; when
the other sessions end, the engine half resumes the paused one and its held call runs.

This is also the first direction of "two halves, both directions" (docs/policies.md):
the gateway's admission depends on an event the engine published.

One vLLM server (64 blocks of 128 tokens) for the module; each test runs its own
gateway in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentmars.sdk.events import (
    AnyEvent,
    LLMEnd,
    LLMSubmit,
    SessionEnd,
    SessionPause,
    SessionResume,
    ToolEnd,
    ToolStart,
)
from agentmars.sdk.integrations.request import project_prompt_tokens
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, SERVED_MODEL_NAME
from agentmars.server.engines.vllm.smoke import model_vocab_size, random_prompt
from agentmars.server.gateway.app import Gateway
from tests.server.engines.vllm.helpers import (
    LinkedEngine,
    blocks,
    engine_metric,
    eventually,
    in_background,
    kv_status,
    linked_gateway,
    linked_vllm,
    post_events,
    released,
)

TOKEN = "thunder-token"
CHECK_INTERVAL_S = 0.3
SETTINGS = {"check_interval_s": CHECK_INTERVAL_S}
KV_BLOCKS = 64
USABLE_BLOCKS = KV_BLOCKS - 1
"""vLLM keeps block 0 as its null block."""
CAPACITY = USABLE_BLOCKS * CPU_BLOCK_SIZE
"""8,064 tokens: what ThunderAgent's engine half compares the contexts with."""

# The sessions' contexts, and what ThunderAgent counts of them. A finished call's pin
# holds its full hashed blocks (prompt + output, less the last sampled token, whose KV
# is never computed); ThunderAgent counts a pin as its blocks x 128 tokens and a call
# in vLLM as all its tokens.
A_PROMPT = 2700
"""A's first call: 2,700 + 4 output tokens, 2,703 computed -> 21 full blocks pinned
(2,688 tokens counted)."""
B_PROMPT = 2900
"""B's first call: 2,900 + 4, 2,903 computed -> 22 full blocks pinned (2,816 tokens)."""
C_EXTRA = 1000
"""C's long call continues B's context (a sub-agent forked from B's conversation):
B's 2,900 tokens + 1,000 of its own = 3,900 + 4 -> 31 blocks, of which the first 22
are B's pinned blocks (a prefix hit), so it takes 9 free blocks of the 20 left
(63 - 21 - 22): no pin is dropped under pressure. Finished, its pin holds 30 full
blocks (3,840 tokens), 22 of them shared with B's pin.

ThunderAgent sums the contexts without looking at what they share: while C's call
runs, 2,688 + 2,816 + 3,900 = 9,404 > 8,064; once it is pinned, 2,688 + 2,816 + 3,840 =
9,344 > 8,064. The excess (1,280 tokens at least) is less than A's 2,688, and A goes
first (it runs a tool, "Acting"; it is also the shortest context), so its next check
pauses A alone: A's pin is released (reason "paused"), and 2,816 + 3,840 = 6,656
leaves 1,408 tokens of room, less than A's 2,688, so A stays paused. The KV then
holds B's 22 blocks and C's 8 own ones: 30 used (all pinned), 33 free, 2 pins."""
PAUSED_FREE = USABLE_BLOCKS - 22 - 8
SHORT_PROMPT = 20
"""A short first call (no full block: nothing pinned). ThunderAgent's admission lets a
new session in only if its first prompt (projected at ~4 characters a token; a list
of token ids projects to ~1.25 x its length) fits in the free KV of the plugin's
figures, so C opens its session with one before B's context fills the KV."""


@pytest.fixture(scope="class")
def thunder(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinkedEngine]:
    folder = tmp_path_factory.mktemp("thunderagent")
    with linked_vllm(vllm_python, folder, "thunderagent", settings=SETTINGS) as engine:
        yield engine


@pytest.fixture(scope="class")
def vocab_size(thunder: LinkedEngine) -> int:
    return model_vocab_size(thunder.config.model)


def streamed(client: httpx.Client, session: str, prompt: list[int], turn: int) -> int:
    """One call of ``session`` through the gateway, streamed to its end (so the gateway
    records its first token, which is when ThunderAgent's admission stops counting the
    session's first prompt as not started); returns the status."""
    body = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
        "session_id": session,
        "vllm_xargs": {"session_id": session, "turn": turn},
    }
    with client.stream("POST", "/v1/completions", json=body) as response:
        chunks = [line for line in response.iter_lines() if line.startswith("data: {")]
    assert response.status_code != 200 or len(chunks) == 4, chunks
    return response.status_code


def _of(gateway: Gateway, kind: type[AnyEvent]) -> list[AnyEvent]:
    return [event for event in gateway.hub.events() if isinstance(event, kind)]


def _waiting(gateway: Gateway) -> list[str]:
    return list(gateway.admission.waiting)


class TestThunderAgentOnVllm:
    @pytest.mark.slow
    def test_thrashing_pauses_a_session_holds_new_ones_and_resumes_when_room_returns(
        self, thunder: LinkedEngine, vocab_size: int
    ) -> None:
        a_context = random_prompt(A_PROMPT, vocab_size, seed=1)
        b_context = random_prompt(B_PROMPT, vocab_size, seed=2)
        with linked_gateway(thunder, TOKEN, "thunderagent", policy_settings=SETTINGS) as (
            client,
            gateway,
        ):
            start = kv_status(thunder.status)
            assert blocks(start) == (USABLE_BLOCKS, 0, 0)
            assert streamed(client, "c", random_prompt(SHORT_PROMPT, vocab_size, 3), 0) == 200
            assert streamed(client, "a", a_context, 0) == 200
            assert streamed(client, "b", b_context, 0) == 200
            # ThunderAgent pins every finished call: 21 + 22 blocks, 5,504 tokens counted.
            assert blocks(kv_status(thunder.status)) == (USABLE_BLOCKS - 43, 43, 2)
            post_events(client, TOKEN, ToolStart(session_id="a", call_id="a-0", tool="bash"))

            # (a) C's long call: the contexts exceed the capacity; the engine pauses A.
            c_context = b_context + random_prompt(C_EXTRA, vocab_size, seed=4)
            assert streamed(client, "c", c_context, 1) == 200
            eventually(lambda: bool(_of(gateway, SessionPause)), "the engine pauses a session")
            (pause,) = _of(gateway, SessionPause)
            assert (pause.session_id, pause.source) == ("a", "engine")
            paused = kv_status(thunder.status)
            assert released(paused, start) == {"paused": 1}
            # Pinned blocks are counted once each (B's 22, shared with C's pin, and C's 8).
            assert blocks(paused) == (PAUSED_FREE, USABLE_BLOCKS - PAUSED_FREE, 2)

            # (b) A's tool ends and A calls again: held in the plugin. A new session, D:
            # held at the gateway, as the admission half heard of the pause.
            post_events(
                client,
                TOKEN,
                ToolEnd(session_id="a", call_id="a-0", tool="bash", duration_s=0.5),
            )
            a_tail = random_prompt(SHORT_PROMPT, vocab_size, seed=5)
            a_next = in_background(lambda: streamed(client, "a", a_context + a_tail, 1))
            d_first = in_background(
                lambda: streamed(client, "d", random_prompt(SHORT_PROMPT, vocab_size, 6), 0)
            )
            eventually(lambda: _waiting(gateway) == ["d"], "D waits at the gateway")
            eventually(
                lambda: any(e.session_id == "a" and e.turn == 1 for e in _of(gateway, LLMSubmit)),
                "A's call reaches the gateway",
            )
            for _ in range(5):  # ThunderAgent checks five times meanwhile
                assert not (a_next.done.wait(CHECK_INTERVAL_S) or d_first.done.is_set())
            assert _waiting(gateway) == ["d"]
            assert not _of(gateway, SessionResume)
            # A's call is held out of vLLM's queues; nothing else runs.
            assert engine_metric(thunder.url, "vllm:num_requests_running") == 0
            assert engine_metric(thunder.url, "vllm:num_requests_waiting") == 0
            assert blocks(kv_status(thunder.status)) == blocks(paused)

            # (c) B and C end: their pins go, ThunderAgent sees room for A's 2,688 tokens
            # and resumes A; its held call runs; D is let in at the gateway.
            post_events(client, TOKEN, SessionEnd(session_id="b"), SessionEnd(session_id="c"))
            assert a_next.join() == 200
            assert d_first.join() == 200
            (resume,) = _of(gateway, SessionResume)
            assert (resume.session_id, resume.source) == ("a", "engine")
            events = gateway.hub.events()
            order = {
                "resume": events.index(resume),
                "a_end": next(
                    i
                    for i, e in enumerate(events)
                    if isinstance(e, LLMEnd) and (e.session_id, e.turn) == ("a", 1)
                ),
                "d_submit": next(
                    i
                    for i, e in enumerate(events)
                    if isinstance(e, LLMSubmit) and e.session_id == "d"
                ),
            }
            assert order["resume"] < order["a_end"] and order["resume"] < order["d_submit"], order
            ended = kv_status(thunder.status)
            # A's second call is pinned in turn (21 blocks; D's short one has no full block).
            assert released(ended, start) == {"paused": 1, "session_end": 2}
            assert (ended.pins, ended.pinned_blocks) == (1, 21)
            post_events(client, TOKEN, SessionEnd(session_id="a"), SessionEnd(session_id="d"))

    @pytest.mark.slow
    def test_calls_answered_whole_do_not_use_up_the_admission_room(
        self, thunder: LinkedEngine, vocab_size: int
    ) -> None:
        """Three calls of no session, one after the other, answered whole (not streamed),
        each of 2,900 token ids (projected exactly): each fits the KV (8,064 tokens, empty
        between the calls: a call of no session is not pinned), so each is admitted at once.
        A call answered whole has no first token: its end (and the gateway's
        ``session_end`` of its one-call session) is what tells the admission half that
        its prompt is no longer waiting for blocks (5,800 of 8,064 tokens would
        otherwise stay counted, and the third would wait for good)."""
        bodies = [
            {
                "model": SERVED_MODEL_NAME,
                "prompt": random_prompt(2900, vocab_size, seed=100 + i),
                "max_tokens": 1,
            }
            for i in range(3)
        ]
        projected = [project_prompt_tokens(body) or 0 for body in bodies]
        assert max(projected) < CAPACITY < sum(projected), projected
        with linked_gateway(thunder, TOKEN, "thunderagent", policy_settings=SETTINGS) as (
            client,
            _,
        ):
            for body in bodies:
                response = client.post("/v1/completions", json=body, timeout=10.0)
                assert response.status_code == 200, response.text
