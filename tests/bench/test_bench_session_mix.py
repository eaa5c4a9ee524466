"""The session-mix benchmark's pure parts: the mix it replays, reading a completion
stream, and the figures (the replay itself needs vLLM and minutes: not a test)."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from agentmars.bench.session_mix import (
    FIRST_PLAIN_TOKEN,
    TINY_VOCAB,
    MixShape,
    SessionMixError,
    SessionResult,
    build_mix,
    ratios,
    sse_lines,
    stream_token_ids,
    summarize,
)


def test_the_mix_fits_the_tiny_model_and_ends_sessions_without_a_tool() -> None:
    shape = MixShape(workload="react", sessions=8, max_context=4096, max_turns=3)
    mix = build_mix(shape)
    assert len(mix) == 8
    assert [s.arrival_s for s in mix] == sorted(s.arrival_s for s in mix)
    for session in mix:
        assert 1 <= len(session.turns) <= 3
        *middle, last = session.turns
        assert last.tool is None and last.tool_s == 0
        assert all(t.tool is not None and t.tool_s > 0 for t in middle)
        context = sum(len(t.append) + t.output_tokens for t in session.turns)
        assert context <= 4096
        ids = [i for t in session.turns for i in t.append]
        assert all(FIRST_PLAIN_TOKEN <= i < TINY_VOCAB for i in ids)


def test_the_mix_is_fixed_by_its_seed_and_tool_scale_scales_the_tools() -> None:
    base = build_mix(MixShape(sessions=6, seed=3))
    assert build_mix(MixShape(sessions=6, seed=3)) == base
    half = build_mix(MixShape(sessions=6, seed=3, tool_scale=0.5))
    for a, b in zip(base, half, strict=True):
        assert [t.append for t in a.turns] == [t.append for t in b.turns]
        assert [t.tool_s / 2 for t in a.turns] == pytest.approx([t.tool_s for t in b.turns])


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (MixShape(rate=0), "--rate"),
        (MixShape(tool_scale=-1), "--tool-scale"),
        (MixShape(max_context=100), "--max-context"),
        (MixShape(sessions=0), "--sessions"),
    ],
)
def test_a_bad_mix_is_refused(shape: MixShape, message: str) -> None:
    with pytest.raises(SessionMixError, match=message):
        build_mix(shape)


def test_stream_lines_give_their_token_ids() -> None:
    assert stream_token_ids('data: {"choices": [{"text": "ab", "token_ids": [5, 9]}]}') == [5, 9]
    assert stream_token_ids('data: {"choices": [{"text": "", "token_ids": null}]}') == []
    assert stream_token_ids('data: {"choices": [], "usage": {"prompt_tokens": 3}}') == []
    assert stream_token_ids("data: [DONE]") == []
    assert stream_token_ids(": keep-alive") == []
    with pytest.raises(ValueError, match="stream error"):
        stream_token_ids('data: {"error": {"message": "boom"}}')


def _result(
    name: str, latency: float, ttfts: list[float], error: str | None = None
) -> SessionResult:
    return SessionResult(name, latency_s=latency, ttft_after_tool_s=ttfts, error=error)


def test_figures_of_a_policy() -> None:
    results = [
        _result("a", 4.0, [0.1, 0.3]),
        _result("b", 2.0, [0.2]),
        _result("c", 6.0, []),
        _result("d", 1.0, [9.0], error="ValueError: got 3 of 5 tokens"),
    ]
    counters = {"prefix_cache_queries": 1000.0, "prefix_cache_hits": 250.0, "num_preemptions": 2.0}
    figures = summarize("fcfs", results, counters, startup_s=50.0, replay_s=20.0)
    # The failed session counts in neither latency nor TTFT.
    assert figures["failed"] == ["d: ValueError: got 3 of 5 tokens"]
    assert figures["session_latency_s"] == {"mean": 4.0, "p50": 4.0, "p95": 6.0}
    assert figures["ttft_after_tool_s"]["mean"] == pytest.approx(0.2)
    assert figures["ttft_after_tool_s"]["calls"] == 3
    assert (figures["prefix_cache_hit_rate"], figures["preemptions"]) == (0.25, 2.0)


def test_ratios_are_over_the_first_policy() -> None:
    counters = {"prefix_cache_queries": 100.0, "prefix_cache_hits": 50.0, "num_preemptions": 0.0}
    fcfs = summarize("fcfs", [_result("a", 4.0, [0.2])], counters, startup_s=0, replay_s=0)
    counters = {**counters, "prefix_cache_hits": 75.0}
    other = summarize("continuum", [_result("a", 3.0, [0.1])], counters, startup_s=0, replay_s=0)
    ((name, figures),) = ratios([fcfs, other]).items()
    assert name == "continuum"
    assert figures["session latency mean s"] == pytest.approx(0.75)
    assert figures["TTFT after a tool, mean s"] == pytest.approx(0.5)
    assert figures["prefix-cache hit rate"] == pytest.approx(1.5)
    empty = summarize("x", [], {**counters, "prefix_cache_queries": 0}, startup_s=0, replay_s=0)
    assert math.isnan(empty["prefix_cache_hit_rate"])
    assert math.isnan(ratios([empty, other])["continuum"]["session latency mean s"])


def test_sse_lines_split_at_newlines_only() -> None:
    # A generated token's text can hold U+2028, U+0085 or a lone CR, unescaped in the
    # JSON (a run under thunderagent failed a session on one with aiter_lines).
    chunk = {"choices": [{"text": "a\u2028b\x85c\rd", "token_ids": [1, 2, 3, 4]}]}
    body = ("data: " + json.dumps(chunk, ensure_ascii=False) + "\n\ndata: [DONE]\n\n").encode()

    async def read() -> list[int]:
        response = httpx.Response(200, content=body)
        return [t async for line in sse_lines(response) for t in stream_token_ids(line)]

    assert asyncio.run(read()) == [1, 2, 3, 4]
