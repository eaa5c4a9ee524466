"""The wall-clock simulated engine behind its OpenAI-compatible API, on real loopback
servers: modelled timing, prefix hits of pinned sessions, the policy's order, the
streaming format, aborts and bad input.

Timing expectations are worked out from ``cpu-tiny``'s fitted step time
``c0 + c1*prefill + c2*attention + c3*seqs + c4*context`` with c0 = 3.90 ms,
c1 = 10.2 us/token, c2 = 6.00 ns/pair (profiles/cpu-tiny.json); block size 128.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentmars.sdk.events import ToolEnd, ToolStart
from agentmars.server.engines.twin.app import call_request, create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.policies.registry import make_policy, policy_names
from agentmars.server.profiles.cost_model import (
    FittedCost,
    Profile,
    StepShape,
    chunk_attention,
    load_profile,
)
from agentmars.server.web.serving import serve_in_thread
from tests.server.engines.twin.conftest import scrape

MODEL = "cpu-tiny"
TIMER_SLACK_S = 0.03
"""What a client sees beyond the modelled time: HTTP, JSON and the event loop's timer
(about 3 ms here when idle; room for a loaded 2-core machine)."""
RUNS = 3
"""Each timing is measured this many times. The modelled time is a floor every run must
respect; the slack is a ceiling for the fastest run, because a busy machine can only
ever add time (a CI run once saw one stream 40 ms late)."""


def _profile(**limits: int) -> Profile:
    base = load_profile(MODEL)
    return Profile.model_validate({**base.model_dump(), **limits})


SETTINGS: dict[str, dict[str, Any]] = {"continuum": {"ttl_s": 60.0}}
"""Pins outlive any test, however slow the machine (the TTL is tested on its own)."""


def _serve(profile: Profile, policy: str) -> Any:
    engine = LiveEngine(profile, make_policy(policy, **SETTINGS.get(policy, {})))
    return serve_in_thread(create_live_app(engine))


def test_the_agent_instance_named_by_the_client_reaches_the_policys_view() -> None:
    # The gateway forwards the SDK's task id in vllm_xargs (seed 004's unit, VTC's
    # client); a session without one is its own instance. The engine is not started:
    # the calls stay in its waiting queue, as its policy sees them.
    engine = LiveEngine(load_profile(MODEL), make_policy("vtc"))
    for session, xargs in (("t.0", {"task_id": "T"}), ("t.1", {"task_id": "T"}), ("x", {})):
        body = {"prompt": "hi", "max_tokens": 2, "vllm_xargs": {"session_id": session, **xargs}}
        engine.submit(call_request(body, {}, chat=False, max_model_len=4096))
    assert [(call.session_id, call.task_id) for call in engine.waiting] == [
        ("t.0", "T"), ("t.1", "T"), ("x", "x"),
    ]  # fmt: skip


def _stream(client: httpx.Client, body: dict[str, Any], session: str | None) -> dict[str, Any]:
    """Stream a completion; its first-token time, chunk times and usage."""
    headers = {"X-Session-ID": session} if session else {}
    body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True}, **body}
    started = time.monotonic()
    times, usage = [], None
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                chunk = httpx.Response(200, content=line[6:]).json()
                if chunk["choices"]:
                    times.append(time.monotonic() - started)
                usage = chunk.get("usage") or usage
    return {"ttft": times[0], "times": times, "usage": usage}


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[httpx.Client, LiveEngine]]:
    engine = LiveEngine(load_profile(MODEL), make_policy("fcfs"))
    with serve_in_thread(create_live_app(engine)) as url, httpx.Client(base_url=url) as client:
        _stream(client, {"prompt": "warm up", "max_tokens": 2}, None)
        yield client, engine


def test_a_lone_call_takes_the_modelled_prefill_then_decode_steps(
    tiny: tuple[httpx.Client, LiveEngine],
) -> None:
    client, engine = tiny
    # 8000 characters are 2000 synthetic tokens, one chunk (budget 2048):
    # 3.90 + 10.2e-3 * 2000 + 6.00e-6 * 2000 * 2001 / 2 ms = 3.90 + 20.44 + 12.01 = 36.35 ms.
    prefill = 0.0039013 + 1.0219e-5 * 2000 + 6.0039e-9 * 2000 * 2001 / 2
    assert engine.cost.step_time(StepShape(2000, chunk_attention(2000, 0))) == pytest.approx(
        prefill, rel=1e-3
    )
    # Then one token a step: c0 + c3 + c4 * context, about 4.37 ms at 2001..2010 tokens.
    decode = sum(engine.cost.decode_time(2000 + k) for k in range(1, 11))
    ttfts, totals = [], []
    for letter in "xyz"[:RUNS]:  # a new prompt each run: no prefix hit from the last
        result = _stream(client, {"prompt": letter * 8000, "max_tokens": 11}, None)
        assert result["usage"]["prompt_tokens"] == 2000
        assert result["usage"]["completion_tokens"] == 11
        ttfts.append(result["ttft"])
        totals.append(result["times"][-1])
    # Each step starts where the previous one was due to end, so no token comes before
    # its modelled time; the gaps between tokens as a client sees them can be shorter
    # (a late first chunk), so the floor is on the times since the request.
    assert prefill <= min(ttfts) <= prefill + TIMER_SLACK_S, ttfts
    assert prefill + decode <= min(totals) <= prefill + decode + TIMER_SLACK_S, totals


def _session_after_other_traffic(policy: str) -> tuple[dict[str, Any], float]:
    """Session s: a 2900-token call, two 2900-token calls of other (unnamed) sessions,
    then s's next call extending its context to 3000 tokens; on 48 blocks."""
    profile = _profile(num_gpu_blocks=48, max_model_len=4096)
    with _serve(profile, policy) as url, httpx.Client(base_url=url) as client:
        first = "a" * 11600
        _stream(client, {"prompt": first, "max_tokens": 4}, "s")
        for filler in "bc":
            _stream(client, {"prompt": filler * 11600, "max_tokens": 4}, None)
        again = _stream(client, {"prompt": first + "d" * 400, "max_tokens": 4}, "s")
        return again, scrape(client)["vllm:prefix_cache_hits_total"]


def test_a_pinned_session_hits_its_prefix_and_starts_sooner_than_a_displaced_one() -> None:
    runs = [_session_after_other_traffic("continuum") for _ in range(RUNS)]
    displaced, displaced_hits = _session_after_other_traffic("fcfs")
    # Pinned: s's first call leaves 2903 computed tokens, 22 full blocks (2816 tokens),
    # pinned; the other calls fit beside the pin (26 free blocks, 23 needed). The next
    # call computes 184 tokens after 2816: 3.90 + 1.88 + 3.21 = 9.0 ms.
    assert [hits for _, hits in runs] == [2816] * RUNS
    assert [pinned["usage"]["prompt_tokens_details"]["cached_tokens"] for pinned, _ in runs] == [
        2816
    ] * RUNS
    pinned_prefill = 0.0039013 + 1.0219e-5 * 184 + 6.0039e-9 * 184 * (2 * 2816 + 185) / 2
    ttfts = [pinned["ttft"] for pinned, _ in runs]
    assert pinned_prefill <= min(ttfts) <= pinned_prefill + TIMER_SLACK_S, ttfts
    # Released: the free queue hands out the 25 never-used blocks first, then s's blocks
    # from its tail (freed in reverse); the second other call takes 21 of them, leaving
    # s's first two blocks: 256 tokens hit, 2744 computed in two chunks (2048 after 256,
    # 696 after 2304): 40.6 + 22.1 = 62.7 ms.
    assert displaced["usage"]["prompt_tokens_details"]["cached_tokens"] == 256
    assert displaced_hits == 256
    displaced_prefill = (0.0039013 + 1.0219e-5 * 2048 + 6.0039e-9 * 2048 * (2 * 256 + 2049) / 2) + (
        0.0039013 + 1.0219e-5 * 696 + 6.0039e-9 * 696 * (2 * 2304 + 697) / 2
    )
    assert displaced["ttft"] >= displaced_prefill
    assert min(ttfts) < displaced["ttft"], (ttfts, displaced["ttft"])


def test_a_session_whose_context_does_not_grow_starts_over() -> None:
    with _serve(_profile(), "continuum") as url, httpx.Client(base_url=url) as client:
        _stream(client, {"prompt": "a" * 4000, "max_tokens": 2}, "s")
        grown = _stream(client, {"prompt": "a" * 4000 + "b" * 40, "max_tokens": 2}, "s")
        other = _stream(client, {"prompt": "z" + "a" * 4100, "max_tokens": 2}, "s")
    # 1000 tokens + 1 computed output: 7 full blocks (896 tokens) are pinned and hit.
    assert grown["usage"]["prompt_tokens_details"]["cached_tokens"] == 896
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def _finish_order(url: str) -> list[str]:
    """One call running alone (max_num_seqs 1); then x (a new session) and s (whose
    previous call is pinned, under continuum) queue behind it, x first. Each is sent
    once the engine shows the one before it running or waiting (a loaded host may hold
    a task past any fixed sleep)."""
    order: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def call(name: str, session: str, tokens: int) -> None:
            body = {"model": MODEL, "prompt": name * 400, "max_tokens": tokens}
            reply = await client.post(
                "/v1/completions", json=body, headers={"X-Session-ID": session}
            )
            assert reply.status_code == 200, reply.text
            order.append(name)

        async def until(series: str, value: float) -> None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                text = (await client.get("/metrics")).text
                if any(f"{series}{{" in line and line.endswith(f" {value}") for line in
                       text.splitlines()):  # fmt: skip
                    return
                await asyncio.sleep(0.002)
            raise AssertionError(f"the engine never showed {series} = {value}")

        await call("s", "s", 2)
        order.clear()
        blocker = asyncio.create_task(call("b", "b", 400))
        await until("vllm:num_requests_running", 1.0)
        later = [asyncio.create_task(call("x", "x", 2))]
        await until("vllm:num_requests_waiting", 1.0)
        later.append(asyncio.create_task(call("s", "s", 2)))
        await until("vllm:num_requests_waiting", 2.0)
        await asyncio.gather(blocker, *later)
    return order


@pytest.mark.parametrize(("policy", "order"), [("fcfs", "bxs"), ("continuum", "bsx")])
def test_waiting_calls_run_in_the_policy_order(policy: str, order: str) -> None:
    # Continuum serves waiting calls of pinned sessions first; FCFS by arrival.
    with _serve(_profile(max_num_seqs=1), policy) as url:
        assert "".join(asyncio.run(_finish_order(url))) == order


def test_the_openai_client_reads_the_streams_and_the_whole_answers(
    tiny: tuple[httpx.Client, LiveEngine],
) -> None:
    base = str(tiny[0].base_url).rstrip("/")
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    # Rendered "<|user|>hello\n": 14 characters, 4 tokens.
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "lorem ipsum dolor "
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 3)
    whole = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=2)
    assert whole.choices[0].text == "lorem ipsum "
    assert whole.usage is not None and whole.usage.prompt_tokens == 3
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_token_ids_come_back_when_asked_and_extend_the_next_prompt(
    tiny: tuple[httpx.Client, LiveEngine],
) -> None:
    # An agent replaying token ids (agentmars bench session-mix, fidelity) appends the
    # answer's ids to its next prompt, as with vLLM's return_token_ids.
    client, _ = tiny
    prompt = list(range(3, 3 + 300))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 5, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}  # fmt: skip
    ids: list[int] = []
    with client.stream("POST", "/v1/completions", json=body, headers={"X-Session-ID": "ids"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    ids += choice["token_ids"]
    assert ids == [0, 1, 2, 3, 4]  # each answer word's place in the vocabulary
    whole = client.post(
        "/v1/completions",
        json={**body, "prompt": [*prompt, *ids, 7, 7], "stream": False},
        headers={"X-Session-ID": "ids"},
    ).json()
    assert whole["choices"][0]["token_ids"] == [0, 1, 2, 3, 4]
    # The second prompt extends the first: its computed blocks are a hit.
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    plain = client.post("/v1/completions", json={"model": MODEL, "prompt": [5], "max_tokens": 1})
    assert "token_ids" not in plain.json()["choices"][0]


def test_a_client_leaving_mid_stream_aborts_the_call_and_frees_its_blocks() -> None:
    with _serve(_profile(), "continuum") as url, httpx.Client(base_url=url) as client:
        before = scrape(client)
        body = {"model": MODEL, "prompt": "q" * 4000, "max_tokens": 2000, "stream": True}
        with client.stream("POST", "/v1/completions", json=body, headers={"X-Session-ID": "s"}):
            pass  # the status line came: the call runs; leave without reading on
        deadline = time.monotonic() + 5
        while (after := scrape(client))["agentmars_sim_requests_aborted_total"] < 1:
            assert time.monotonic() < deadline, after
            time.sleep(0.02)
    assert after["agentmars_sim_kv_blocks[free]"] == before["agentmars_sim_kv_blocks[free]"] == 512
    assert after["agentmars_sim_kv_pinned_sessions"] == 0
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"model": "gpt-5", "prompt": "hi"}', 404, "does not exist"),
        (b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"prompt": ["a", "b"]}', 400, "prompt"),
        (b'{"prompt": "hi", "n": 2}', 400, "n=1"),
        (b'{"prompt": "hi", "stream": "yes"}', 400, "stream"),
        (b'{"model": 7, "prompt": "hi"}', 400, "model"),
        (b'{"prompt": "hi", "vllm_xargs": {"turn": "one"}}', 400, "turn"),
        # 32769 tokens (a prompt of exactly 32768 leaves no room: vLLM's "max_tokens
        # must be at least 1", test_hostile_input).
        (b'{"prompt": "' + b"w" * 131073 + b'"}', 400, "maximum context length is 32768"),
    ],
)
def test_bad_input_gets_a_4xx_with_a_message(
    tiny: tuple[httpx.Client, LiveEngine], body: bytes, status: int, says: str
) -> None:
    reply = tiny[0].post("/v1/completions", content=body)
    assert reply.status_code == status
    assert says in reply.json()["error"]["message"]


def test_bad_chat_messages_get_a_400(tiny: tuple[httpx.Client, LiveEngine]) -> None:
    for messages in ([], [{"content": "no role"}], "hello", [{"role": "user", "content": 3}]):
        reply = tiny[0].post("/v1/chat/completions", json={"messages": messages})
        assert reply.status_code == 400, messages


async def _two_turn_sessions(url: str, sessions: int) -> list[int]:
    """Sessions of two calls each at once (a 500-token prompt, 20 tokens out, then the
    context grown by the answer and a tool's output); the tokens each call got."""
    got: list[int] = []

    async def session(client: httpx.AsyncClient, name: str) -> None:
        context = name * 2000
        for turn in range(2):
            xargs = {"session_id": name, "turn": turn, "expects_tool": 1 - turn}
            body = {"prompt": context, "max_tokens": 100, "vllm_xargs": xargs}
            reply = await client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            got.append(reply.json()["usage"]["completion_tokens"])
            context += reply.json()["choices"][0]["text"] + "tool output " * 50

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(session(client, chr(ord("a") + i)) for i in range(sessions)))
    return got


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_serves_concurrent_sessions_without_leaking_blocks(policy: str) -> None:
    # 20 blocks of 128 tokens: four sessions whose second calls reach ~850 tokens
    # (7 blocks) each crowd the cache, so cached blocks are evicted (and pins reclaimed).
    profile = _profile(num_gpu_blocks=20, max_model_len=2048)
    with _serve(profile, policy) as url, httpx.Client(base_url=url) as client:
        assert asyncio.run(_two_turn_sessions(url, 4)) == [100] * 8
        after = scrape(client)
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    # Every block is free again except what the policy still pins.
    free, pinned = after["agentmars_sim_kv_blocks[free]"], after["agentmars_sim_kv_blocks[pinned]"]
    assert free + pinned == 20
    assert after["agentmars_sim_evicted_blocks_total"] > 0


def test_a_pin_goes_when_its_ttl_is_up() -> None:
    engine = LiveEngine(_profile(), make_policy("continuum", ttl_s=0.2))
    with serve_in_thread(create_live_app(engine)) as url, httpx.Client(base_url=url) as client:
        _stream(client, {"prompt": "a" * 2000, "max_tokens": 2}, "s")
        pinned = scrape(client)
        time.sleep(0.4)
        later = scrape(client)
    # 500 tokens + 1 computed output: 3 full blocks pinned for 0.2 s, then released.
    pins, blocks = "agentmars_sim_kv_pinned_sessions", "agentmars_sim_kv_blocks"
    assert (pinned[pins], pinned[f"{blocks}[pinned]"]) == (1, 3)
    assert (later[pins], later[f"{blocks}[free]"]) == (0, 512)
    # The gateway reads the release in the engine's KV figures, by reason.
    assert engine.kv_stats().released == {"expired": 1}


def test_tool_events_from_elsewhere_reach_the_policy_and_the_view() -> None:
    engine = LiveEngine(_profile(), make_policy("continuum"))
    stamp = {"session_id": "s", "call_id": "t1", "tool": "pytest", "source": "sandbox"}
    engine.observe([ToolStart(**stamp)])
    assert engine.active_tools == 1
    engine.observe([ToolEnd(duration_s=5.0, **stamp)])
    assert engine.active_tools == 0 and engine.tool_ema_s == {"pytest": 5.0}
    # Continuum learnt the tool's mean (5 s > its 2 s TTL): it would not pin for it.
    assert engine.half.mean_duration("pytest") == 5.0  # type: ignore[attr-defined]


FIELDS = ("model", "prompt", "messages", "max_tokens", "stream", "stream_options", "n",
          "session_id", "vllm_xargs", "max_completion_tokens")  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 300) | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=12,
)
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6) | json_values


@pytest.fixture(scope="module")
def quick_url() -> Iterator[str]:
    # Steps of 0.1 ms and a 256-token context: any call the fuzzer gets through is short.
    profile = _profile(max_model_len=256).model_copy(
        update={"cost": FittedCost(c0=1e-4, c1=0.0, c2=0.0, c3=0.0, c4=0.0)}
    )
    with _serve(profile, "continuum") as url:
        yield url


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, chat=st.booleans())
def test_no_request_body_gets_a_server_error(quick_url: str, body: Any, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    reply = httpx.post(quick_url + path, content=json.dumps(body), timeout=10)
    assert reply.status_code in (200, 400, 404), reply.text
    if reply.status_code != 200:
        assert reply.json()["error"]["message"]


def test_a_call_that_cannot_grow_preempts_the_newest_and_both_finish() -> None:
    # 8 blocks of 128 tokens; two calls of 256 prompt tokens (2 blocks) generating 600
    # (7 blocks each at the end). In lockstep both fill 4 blocks at 512 tokens; the
    # older one's next block preempts the newer (FCFS's victim: the last admitted),
    # which cannot come back (5 blocks needed, at most 3 free) until the older one
    # has finished, and then recomputes its context.
    profile = _profile(num_gpu_blocks=8, max_model_len=1024).model_copy(
        update={"cost": FittedCost(c0=1e-4, c1=0.0, c2=0.0, c3=0.0, c4=0.0)}
    )

    async def two_calls(url: str) -> list[str]:
        finished: list[str] = []
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def call(name: str) -> None:
                body = {"prompt": name * 1024, "max_tokens": 600}
                reply = await client.post("/v1/completions", json=body)
                assert reply.json()["usage"]["completion_tokens"] == 600
                finished.append(name)

            first = asyncio.create_task(call("a"))
            await asyncio.sleep(0.01)
            await asyncio.gather(first, call("b"))
        return finished

    with _serve(profile, "fcfs") as url, httpx.Client(base_url=url) as client:
        assert asyncio.run(two_calls(url)) == ["a", "b"]
        after = scrape(client)
    assert after["vllm:num_preemptions_total"] == 1
    assert after["agentmars_sim_kv_blocks[free]"] == 8
    # Prefill: 256 + 256 tokens, then b's context again: 256 + k tokens (1 <= k <= 257
    # generated before the preemption: at most 4 full blocks computed, plus the token
    # sampled last, when both run in lockstep, as a loaded machine can make them) less
    # its first block, still cached (a took the other three of b's freed blocks, last
    # first): 129 to 385 tokens.
    assert 512 + 129 <= after["agentmars_sim_prefill_tokens_total"] <= 512 + 385
