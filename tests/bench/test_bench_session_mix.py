"""The session-mix benchmark's parts that need no vLLM: the mix it replays, reading a
completion stream, the figures, the runs (their order, their means, the ratios), and
the replay with its tools in the sandbox pool, against the gateway in front of the
twin (the replay on vLLM needs minutes: tests/cli/test_bench_vllm.py, slow)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from fastapi import FastAPI
from rich.console import Console

from agentmars.bench import session_mix
from agentmars.bench.session_mix import (
    FIRST_PLAIN_TOKEN,
    TINY_VOCAB,
    TOKEN,
    EngineShape,
    MixShape,
    ReplaySession,
    ReplayTurn,
    SandboxShape,
    SessionMixError,
    SessionResult,
    aggregate,
    build_mix,
    check_model,
    ratios,
    replay,
    run_order,
    sandbox_tools,
    sse_lines,
    stream_token_ids,
    summarize,
    throughput,
)
from agentmars.cli.serve_sim import SimServeOptions, live_engine
from agentmars.sandbox.config import allowed_cores
from agentmars.sdk.events import SessionEnd, ToolEnd, ToolEnqueue, ToolStats
from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.web.ingest import EventHub
from agentmars.server.web.serving import serve_in_thread
from tests.bench.serve_killer import run_killing


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


def test_a_workload_whose_sessions_wait_for_others_is_refused() -> None:
    # 300 task-parallel agents hold MRS agents, whose reduce waits for their maps.
    with pytest.raises(SessionMixError, match="wait for others"):
        build_mix(MixShape(workload="task-parallel", sessions=300))


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


def test_a_model_serves_the_mix_when_its_vocabulary_holds_the_prompts_token_ids(
    tmp_path: Path,
) -> None:
    # A deeper random model from the tiny_model module shares the tiny vocabulary; a
    # model whose vocabulary stops below the prompts' ids would fail every call.
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": TINY_VOCAB}))
    assert check_model(tmp_path) == tmp_path
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": TINY_VOCAB - 1}))
    with pytest.raises(SessionMixError, match="must hold the prompts' token ids"):
        check_model(tmp_path)


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


# --- runs, their order and their aggregation ---------------------------------------------


def test_the_policies_are_interleaved_run_by_run_each_run_rotated() -> None:
    assert run_order(["fcfs", "continuum", "mars"], 4) == [
        (1, "fcfs"), (1, "continuum"), (1, "mars"),
        (2, "continuum"), (2, "mars"), (2, "fcfs"),
        (3, "mars"), (3, "fcfs"), (3, "continuum"),
        (4, "fcfs"), (4, "continuum"), (4, "mars"),
    ]  # fmt: skip
    assert run_order(["fcfs"], 1) == [(1, "fcfs")]
    with pytest.raises(SessionMixError, match="--runs"):
        run_order(["fcfs"], 0)


def _timed(
    name: str, started: float, latency: float, tokens: int, error: str | None = None
) -> SessionResult:
    return SessionResult(
        name, latency_s=latency, ttft_after_tool_s=[latency / 10], error=error,
        started_s=started, ended_s=started + latency, output_tokens=tokens,
    )  # fmt: skip


def test_throughput_is_over_the_first_start_to_the_last_end() -> None:
    results = [
        _timed("a", 10.0, 30.0, 100),  # 10 -> 40
        _timed("b", 12.0, 13.0, 50),  # 12 -> 25
        _timed("c", 15.0, 55.0, 30, error="ValueError: boom"),  # 15 -> 70: the last end
    ]
    counters = {"prefix_cache_queries": 10.0, "prefix_cache_hits": 5.0, "num_preemptions": 0.0}
    figures = summarize("fcfs", results, counters, startup_s=0, replay_s=61)
    # 2 sessions completed in 60 s; every call's tokens, the failed session's included.
    assert figures["throughput"] == {
        "sessions_per_min": pytest.approx(2.0),
        "output_tokens_per_s": pytest.approx(180 / 60),
        "span_s": pytest.approx(60.0),
    }
    assert throughput([_result("a", 1.0, [])]) == {
        "sessions_per_min": pytest.approx(math.nan, nan_ok=True),
        "output_tokens_per_s": pytest.approx(math.nan, nan_ok=True),
        "span_s": pytest.approx(math.nan, nan_ok=True),
    }  # no replayed times (a simulated run): no throughput


def _run_figures(policy: str, run: int, latency: float, hits: float) -> dict[str, Any]:
    results = [_timed("a", 0.0, latency, 40), _timed("b", 1.0, latency + 2, 20)]
    counters = {"prefix_cache_queries": 100.0, "prefix_cache_hits": hits, "num_preemptions": 1.0}
    figures = summarize(policy, results, counters, startup_s=30.0, replay_s=latency + 3)
    load = {"samples": 4, "busy_fraction": 0.5, "running_mean": 1.0, "waiting_mean": run,
            "waiting_max": 2 * run, "kv_usage_mean": 0.5, "kv_usage_max": 0.9}  # fmt: skip
    return {"run": run, **figures, "engine_load": load}


def test_runs_are_summed_up_by_their_means_and_the_spread_of_the_mean_latency() -> None:
    runs = [_run_figures("fcfs", 1, 4.0, 20.0), _run_figures("fcfs", 2, 6.0, 40.0)]
    runs[1]["failed"] = ["b: ValueError: boom"]
    figures = aggregate(runs)
    assert figures["policy"] == "fcfs" and figures["sessions"] == 2
    # Run 1: latencies 4, 6 (mean 5); run 2: 6, 8 (mean 7).
    assert figures["session_latency_s"] == {"mean": 6.0, "p50": 5.0, "p95": 7.0}
    assert figures["session_latency_mean_spread_s"] == {"min": 5.0, "max": 7.0}
    assert figures["ttft_after_tool_s"]["mean"] == pytest.approx(0.6)
    assert figures["ttft_after_tool_s"]["calls"] == 4
    assert figures["prefix_cache_hit_rate"] == pytest.approx(0.3)
    # Throughput: 2 sessions in 7 s, then in 9 s; 60 tokens in each.
    assert figures["throughput"]["sessions_per_min"] == pytest.approx((120 / 7 + 120 / 9) / 2)
    assert figures["throughput"]["output_tokens_per_s"] == pytest.approx((60 / 7 + 60 / 9) / 2)
    assert figures["failed"] == ["run 2: b: ValueError: boom"]
    assert (figures["engine_load"]["waiting_mean"], figures["engine_load"]["waiting_max"]) == (
        1.5, 4,
    )  # fmt: skip
    assert figures["runs"] == runs
    # One run reads as that run's figures did.
    (single,) = [aggregate([runs[0]])]
    for name in ("session_latency_s", "prefix_cache_hit_rate", "throughput", "failed"):
        assert single[name] == runs[0][name], name


def test_the_ratios_are_of_the_means_over_the_runs() -> None:
    fcfs = aggregate([_run_figures("fcfs", 1, 4.0, 20.0), _run_figures("fcfs", 2, 6.0, 40.0)])
    other = aggregate([_run_figures("mars", 1, 2.0, 30.0), _run_figures("mars", 2, 4.0, 60.0)])
    figures = ratios([fcfs, other])["mars"]
    assert figures["session latency mean s"] == pytest.approx(4.0 / 6.0)
    assert figures["prefix-cache hit rate"] == pytest.approx(0.45 / 0.3)
    assert figures["sessions per minute"] == pytest.approx(
        other["throughput"]["sessions_per_min"] / fcfs["throughput"]["sessions_per_min"]
    )
    assert figures["output tokens per s"] > 1  # shorter sessions, the same tokens


def test_run_serves_the_policies_interleaved_and_reports_each_run_and_the_means(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[tuple[int | None, str]] = []

    def serve(
        engine: EngineShape,
        policy: str,
        mix: list[ReplaySession],
        *,
        sandbox: SandboxShape | None = None,
        run_index: int | None = None,
    ) -> dict[str, Any]:
        assert sandbox == SandboxShape(tool_slots=2)
        served.append((run_index, policy))
        assert run_index is not None
        latency = {"fcfs": 4.0, "continuum": 3.0}[policy] + run_index
        return _run_figures(policy, run_index, latency, 30.0)

    monkeypatch.setattr(session_mix, "run_policy", serve)
    engine = EngineShape(
        vllm_python=Path(os.devnull), model=Path(os.devnull), cores=None, agent_cores=None,
        log_dir=tmp_path,
    )  # fmt: skip
    out = tmp_path / "mix.json"
    figures = session_mix.run(
        engine, MixShape(sessions=2, max_turns=2), ["fcfs", "continuum"], out, runs=3,
        sandbox=SandboxShape(tool_slots=2),
    )  # fmt: skip
    assert served == [
        (1, "fcfs"), (1, "continuum"), (2, "continuum"), (2, "fcfs"),
        (3, "fcfs"), (3, "continuum"),
    ]  # fmt: skip
    assert json.loads(out.read_text()) == figures
    assert figures["runs"] == 3
    assert figures["order"] == [{"run": r, "policy": p} for r, p in served]
    # The figures keep the policies in the order given (the ratios are to the first),
    # whatever order they were served in.
    assert figures["sandbox"] == {"tool_slots": 2, "tool_cores": None}
    fcfs, continuum = figures["policies"]
    assert [r["run"] for r in fcfs["runs"]] == [1, 2, 3]
    # fcfs: run means 6, 7, 8 (latencies L and L + 2 for L = 5, 6, 7); continuum: 5, 6, 7.
    assert fcfs["session_latency_s"]["mean"] == pytest.approx(7.0)
    assert continuum["session_latency_s"]["mean"] == pytest.approx(6.0)
    assert fcfs["session_latency_mean_spread_s"] == {"min": 6.0, "max": 8.0}
    ratio = figures["ratio_to_first"]["continuum"]
    assert ratio["session latency mean s"] == pytest.approx(6.0 / 7.0)
    printed = capsys.readouterr().out
    assert "each run" in printed and "means over 3 runs" in printed and "min-max" in printed


def test_a_failed_run_is_kept_out_of_the_means_and_shown_failed_in_the_tables(
    tmp_path: Path,
) -> None:
    # fcfs: run 1 ended, run 2 failed; mars: its one run failed; continuum: not served.
    fcfs_done = {"status": "done", **_run_figures("fcfs", 1, 4.0, 20.0)}
    fcfs_failed = {"run": 2, "policy": "fcfs", "status": "failed", "error": "RuntimeError: x"}
    mars_failed = {"run": 1, "policy": "mars", "status": "failed", "error": "RuntimeError: y"}
    served = {"fcfs": [fcfs_done, fcfs_failed], "mars": [mars_failed], "continuum": []}
    engine = EngineShape(vllm_python=Path(os.devnull), model=Path(os.devnull), log_dir=tmp_path)
    shape = MixShape(sessions=2, max_turns=2)
    order = run_order(["fcfs", "mars", "continuum"], 2)
    figures = session_mix._figures(engine, shape, build_mix(shape), 2, order, None, served)
    fcfs, mars, continuum = figures["policies"]
    assert (fcfs["status"], mars["status"], continuum["status"]) == ("done", "failed", "pending")
    # fcfs's figures are its ended run's; every run is listed.
    assert fcfs["session_latency_s"] == aggregate([fcfs_done])["session_latency_s"]
    assert fcfs["runs"] == [fcfs_done, fcfs_failed]
    assert mars["error"] == "RuntimeError: y" and figures["ratio_to_first"] == {}
    assert figures["runs_failed"] == [
        {"run": 2, "policy": "fcfs", "error": "RuntimeError: x"},
        {"run": 1, "policy": "mars", "error": "RuntimeError: y"},
    ]
    assert session_mix.failed_runs_line(figures) == "2 of 6 runs failed: fcfs (run 2), mars (run 1)"
    console = Console(record=True, width=300)
    console.print(session_mix.table(figures))
    console.print(session_mix.runs_table(figures))
    text = console.export_text()
    assert re.search(r"session latency mean s .*5\.000 .*run failed .*run pending", text)
    assert re.search(r"failed runs .*1 .*1 .*0", text)
    assert re.search(r"2 .*fcfs .* - .*run failed", text)
    assert re.search(r"1 .*continuum .* - .*run pending", text)


# --- the tools in the sandbox pool -------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "cores", "message"),
    [
        (SandboxShape(tool_slots=0), None, "--tool-slots must be at least 1"),
        (SandboxShape(), "x", "--agent-cores 'x'"),
        (SandboxShape(), "4096", "not cores this process may use"),
    ],
)
def test_a_sandbox_that_cannot_start_is_refused(
    shape: SandboxShape, cores: str | None, message: str
) -> None:
    with pytest.raises(SessionMixError, match=message):
        shape.check(cores)


def test_the_pool_gets_the_agent_cores_and_the_slots_asked_for(tmp_path: Path) -> None:
    core = allowed_cores()[-1]
    config = SandboxShape().config(str(core), tmp_path)
    assert (config.resolved_tool_cores(), config.resolved_slots()) == ([core], 1)
    assert SandboxShape(tool_slots=3).config(str(core), tmp_path).resolved_slots() == 3


def _turn(first: int, tool: str | None, tool_s: float) -> ReplayTurn:
    return ReplayTurn(tuple(range(first, first + 48)), 3, tool, tool_s)


TOOL_S = 0.3
MIX = [
    ReplaySession(
        f"s-{i}", 0.02 * i, (_turn(3 + 100 * i, f"tool{i}", TOOL_S), _turn(60 + 100 * i, None, 0))
    )
    for i in range(3)
]
PRIORITIES = {"s-0": 5, "s-1": -2, "s-2": 0}
"""What the gateway answers each session's calls with (the policy's word, patched in)."""


@pytest.fixture
def twin_gateway() -> Iterator[tuple[str, FastAPI]]:
    """The twin (cpu-tiny) and the gateway in front of it, as ``serve --engine sim``
    makes them, in threads of this process (the gateway's events in reach)."""
    hub = EventHub()
    options = SimServeOptions("cpu-tiny", "fcfs", "127.0.0.1", 0, TOKEN, num_blocks=64)
    engine = live_engine(options, hub)
    with serve_in_thread(create_live_app(engine)) as engine_url:
        config = GatewayConfig(
            upstream_url=engine_url, token=TOKEN, block_size=engine.profile.block_size,
            kv_source=engine,
        )  # fmt: skip
        app = create_gateway_app(config, hub=hub)
        hub.subscribe(engine.observe_threadsafe)
        with serve_in_thread(app) as url:
            yield url, app


def _sandboxed_processes() -> list[str]:
    """What this process has started that runs a sandbox or a tool."""
    names = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            names.append(child.name())
    return [name for name in names if name in ("bwrap", "sleep")]


def test_the_tools_run_in_the_sandbox_pool_at_the_gateways_priority(
    twin_gateway: tuple[str, FastAPI],
) -> None:
    url, app = twin_gateway
    gateway = app.state.gateway
    gateway.admission.half.tool_priority = lambda session_id: PRIORITIES.get(session_id, 0)
    core = allowed_cores()[-1]

    async def replay_in_the_sandbox() -> tuple[list[SessionResult], dict[str, Any]]:
        async with sandbox_tools(url, MIX, SandboxShape(tool_slots=1), str(core)) as tools:
            results = await replay(url, MIX, "cpu-tiny", tools)
        return results, tools.figures()

    results, figures = asyncio.run(replay_in_the_sandbox())
    assert [r.error for r in results] == [None] * len(MIX)
    assert {r.session_id: r.tool_priorities for r in results} == {
        sid: [p] for sid, p in PRIORITIES.items()
    }
    assert all(r.output_tokens == 6 for r in results)
    assert figures["slots"] == [[core]] and figures["tools"] == len(MIX)
    assert figures["events_dropped"] == 0 and figures["events_sent"] > 0
    # Every tool event the gateway got is the pool's; none is the replayer's own.
    events = gateway.hub.events()
    tool_events = [e for e in events if e.kind.startswith("tool_")]
    assert {e.source for e in tool_events} == {"sandbox"}
    enqueued = {e.session_id: e.priority for e in tool_events if isinstance(e, ToolEnqueue)}
    assert enqueued == PRIORITIES
    ended = [e for e in tool_events if isinstance(e, ToolEnd)]
    assert sorted(e.session_id for e in ended) == sorted(PRIORITIES)
    for end in ended:
        assert (end.status, end.exit_status) == ("ok", 0)
        assert end.duration_s >= TOOL_S  # the sleep really ran
        assert end.tool == f"tool{end.session_id[-1]}" and end.turn == 0
    assert any(isinstance(e, ToolStats) for e in tool_events)
    assert [e.session_id for e in events if isinstance(e, SessionEnd)] != []
    # The pool is shut down: nothing it started is left.
    assert _sandboxed_processes() == []


def test_without_the_sandbox_the_replayer_reports_its_own_tools(
    twin_gateway: tuple[str, FastAPI],
) -> None:
    url, app = twin_gateway
    gateway = app.state.gateway
    gateway.admission.half.tool_priority = lambda session_id: PRIORITIES.get(session_id, 0)
    results = asyncio.run(replay(url, MIX[:2], "cpu-tiny"))
    assert [r.error for r in results] == [None, None]
    # The header is read all the same (the sleeps have no queue to put it in).
    assert [r.tool_priorities for r in results] == [[5], [-2]]
    tool_events = [e for e in gateway.hub.events() if e.kind.startswith("tool_")]
    assert sorted(e.kind for e in tool_events) == ["tool_end"] * 2 + ["tool_start"] * 2
    assert {e.source for e in tool_events} == {"sdk"}
    # Sleeps: no CPU time, as the simulator's replayed tools (fidelity.mix_workload).
    assert {e.cpu_time_s for e in tool_events if isinstance(e, ToolEnd)} == {0.0}


def test_a_run_on_the_served_twin_runs_its_tools_in_the_sandbox(tmp_path: Path) -> None:
    # The whole run of one policy as the bench makes it: ``agentmars serve --engine sim``
    # started, a warm-up, the replay with a pool for it, everything stopped after.
    engine = EngineShape(
        vllm_python=Path(os.devnull), model=Path(os.devnull), cores=None, agent_cores=None,
        log_dir=tmp_path, twin=True, max_model_len=1024,
    )  # fmt: skip
    figures = session_mix.run_policy(engine, "fcfs", MIX, sandbox=SandboxShape(), run_index=2)
    assert figures["failed"] == []
    assert figures["sandbox"]["tools"] == len(MIX) and figures["sandbox"]["events_dropped"] == 0
    # Each tool's enqueue, start and end, each followed by the pool's stats gauge.
    assert figures["sandbox"]["events_sent"] == 6 * len(MIX)
    assert figures["throughput"]["sessions_per_min"] > 0
    assert (tmp_path / "serve-twin-fcfs-run2.log").exists()
    assert _sandboxed_processes() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tool-slots", "2"], "--tool-slots needs --sandbox"),
        (["--sandbox", "--agent-cores", "4096"], "not cores this process may use"),
        (["--runs", "0"], "Invalid value for '--runs'"),
    ],
)
def test_the_command_refuses_runs_and_a_sandbox_it_cannot_use(
    args: list[str], message: str
) -> None:
    # Any existing file passes the vLLM python check; nothing is started.
    done = subprocess.run(
        [sys.executable, "-m", "agentmars.cli.main", "bench", "session-mix",
         "--vllm-python", sys.executable, *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr


def test_a_run_whose_engine_dies_is_reported_failed_and_the_others_are_kept(
    tmp_path: Path,
) -> None:
    # continuum's server (the gateway and the twin) is killed once its replay has
    # begun: fcfs's figures are in the JSON by then, continuum's run is recorded as
    # failed with why, and mars still runs, on a server of its own.
    logs, out = tmp_path / "logs", tmp_path / "mix.json"
    stdout, stderr, code, killer = run_killing(
        [sys.executable, "-m", "agentmars.cli.main", "bench", "session-mix", "--twin",
         "--policies", "fcfs,continuum,mars", "--sessions", "2", "--rate", "2",
         "--max-turns", "2", "--tool-scale", "0.2", "--log-dir", str(logs),
         "--json", str(out)],
        "continuum", logs, out,
    )  # fmt: skip
    assert killer.killed_pid is not None, stdout + stderr
    # Written as fcfs's run ended, before continuum's failed.
    assert killer.snapshot_text is not None
    before = json.loads(killer.snapshot_text)
    assert [(r["policy"], r["status"]) for r in before["policies"]] == [
        ("fcfs", "done"), ("continuum", "pending"), ("mars", "pending")
    ]  # fmt: skip
    assert before["policies"][0]["session_latency_s"]["mean"] > 0
    assert code == 1, stdout + stderr
    figures = json.loads(out.read_text())
    fcfs, continuum, mars = figures["policies"]
    assert (fcfs["status"], continuum["status"], mars["status"]) == ("done", "failed", "done")
    assert fcfs["failed"] == mars["failed"] == []
    error = continuum["error"]
    assert error.startswith("RuntimeError: continuum") and len(error) <= 300
    assert figures["runs_failed"] == [{"run": 1, "policy": "continuum", "error": error}]
    # The ratios are of the runs that ended.
    assert set(figures["ratio_to_first"]) == {"mars"}
    # The table's continuum column says the run failed; no traceback; one line names it.
    assert re.search(r"session latency mean s\s.*run failed", stdout), stdout
    assert "Traceback" not in stdout + stderr
    assert "error: 1 of 3 runs failed: continuum" in stderr
    assert not list(tmp_path.glob(".mix.json.*"))  # no temporary file left
