"""SDK benchmarks: what instrumentation costs the agent, and how fast events leave the process.

``bench_emission`` times every event boundary of an LLM call and a tool call
inside a session (SDK to a ``MemorySink``) against a no-op Python call with
the same arguments. ``bench_http_sink`` pushes events through ``HttpSink`` to
the real collector (``python -m agentmars.server.web.ingest``, decoding into an
``EventHub``, in its own process) on loopback, against a bare ``httpx`` loop
posting the same batches pre-serialized; the baseline pays the same for the
collector side, so the ratio isolates the sink's own cost.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from agentmars.bench.report import (
    ProgressFn,
    ignore_progress,
    percentiles_us,
    progress_bars,
    publish,
    verdict,
)
from agentmars.sdk.calls import LLMCall, ToolCall
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import Event, encode_jsonl
from agentmars.sdk.session import Session
from agentmars.sdk.sinks.http import HttpSink
from agentmars.sdk.sinks.memory import MemorySink
from agentmars.server.web.ingest import EVENTS_PATH, TOKEN_ENV
from agentmars.server.web.serving import serve_in_subprocess

EMISSION_TARGET_P50_US = 20.0
HTTP_TARGET_EVENTS_PER_S = 50_000.0
COLLECTOR_TOKEN = "agentmars-bench"  # a loopback collector that lives for one run
WARMUP_TURNS = 200
DELIVERY_TIMEOUT_S = 120.0

LLM_ARGS: dict[str, Any] = {
    "model": "qwen2.5-coder-7b",
    "stream": True,
    "projected_prompt_tokens": 6144,
    "max_tokens": 1024,
    "expects_tool": True,
}
TOOL_ARGS: dict[str, Any] = {"tool": "terminal", "priority": 0}
USAGE: dict[str, Any] = {
    "prompt_tokens": 6150,
    "cached_tokens": 4096,
    "output_tokens": 212,
    "finish_reason": "tool_calls",
    "ended_in_tool_call": True,
}
EVENTS_PER_TURN = 6


def _noop(**kwargs: Any) -> None:
    """The baseline: a plain Python call carrying the arguments and doing nothing."""


def _time_turn(sdk_ns: list[int], bare_ns: list[int]) -> None:
    """One LLM call that ends in a tool call, then the tool call: six events, each
    boundary timed beside a no-op call with the arguments its call was made with."""
    clock = time.perf_counter_ns
    llm = LLMCall(**LLM_ARGS)
    for boundary in (llm.submit, llm.first_token):
        start = clock()
        boundary()
        sdk_ns.append(clock() - start)
        start = clock()
        _noop(**LLM_ARGS)
        bare_ns.append(clock() - start)
    llm.record_usage(**USAGE)
    start = clock()
    llm.end()
    sdk_ns.append(clock() - start)
    start = clock()
    _noop(**LLM_ARGS)
    bare_ns.append(clock() - start)

    tool = ToolCall(TOOL_ARGS["tool"], priority=TOOL_ARGS["priority"])
    for tool_boundary in (tool.enqueue, tool.start, tool.end):
        start = clock()
        tool_boundary()
        sdk_ns.append(clock() - start)
        start = clock()
        _noop(**TOOL_ARGS)
        bare_ns.append(clock() - start)


def bench_emission(n: int = 200_000, *, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Per-event cost of recording LLM and tool boundaries in a session (to a
    ``MemorySink``), against a no-op call with the same arguments; p50/p90/p99 in µs.
    Building the call objects is not timed: only the calls that emit an event are."""
    report = progress or ignore_progress
    turns = max(1, math.ceil(n / EVENTS_PER_TURN))
    sink = MemorySink()
    sdk_ns: list[int] = []
    bare_ns: list[int] = []
    emitted = 0
    with Session(agent="bench", emitter=Emitter([sink])):
        for _ in range(WARMUP_TURNS):
            _time_turn([], [])
        sink.clear()
        for turn in range(turns):
            _time_turn(sdk_ns, bare_ns)
            # Keep memory flat: a few hundred thousand events held would make GC
            # pauses, not the SDK, dominate the tail.
            emitted += len(sink.events)
            sink.clear()
            if turn % 1000 == 0:
                report("emission", len(sdk_ns), turns * EVENTS_PER_TURN)
    report("emission", len(sdk_ns), turns * EVENTS_PER_TURN)
    if emitted != len(sdk_ns):
        raise RuntimeError(f"timed {len(sdk_ns)} boundaries but the sink got {emitted} events")
    sdk = percentiles_us(sdk_ns)
    bare = percentiles_us(bare_ns)
    return {
        "events": len(sdk_ns),
        "sdk_us": sdk,
        "baseline_us": bare,
        "ratio_p50": sdk["p50"] / bare["p50"],
        "target_p50_us": EMISSION_TARGET_P50_US,
        "passed": sdk["p50"] <= EMISSION_TARGET_P50_US,
    }


def _agent_sessions() -> Iterator[Event]:
    """An endless stream of realistic events: sessions of a few LLM turns with tool calls."""
    for index in itertools.count():
        sink = MemorySink()
        with Session(agent="bench", metadata={"task": f"task-{index}"}, emitter=Emitter([sink])):
            for _ in range(4):
                with LLMCall(**LLM_ARGS) as llm:
                    llm.first_token()
                    llm.record_usage(**USAGE)
                with ToolCall(TOOL_ARGS["tool"], priority=TOOL_ARGS["priority"]):
                    pass
        yield from sink.events


def realistic_events(n: int) -> list[Event]:
    """``n`` events as the SDK records them for a run of agent sessions."""
    return list(itertools.islice(_agent_sessions(), n))


def _post_batches(url: str, batches: list[bytes], report: ProgressFn) -> float:
    """Seconds for a bare client to post every batch (each must be accepted)."""
    headers = {
        "authorization": f"Bearer {COLLECTOR_TOKEN}",
        "content-type": "application/x-ndjson",
    }
    with httpx.Client(headers=headers, timeout=DELIVERY_TIMEOUT_S) as client:
        client.post(url, content=batches[0]).raise_for_status()  # warm-up, untimed
        start = time.perf_counter()
        for number, batch in enumerate(batches, start=1):
            client.post(url, content=batch).raise_for_status()
            report("baseline: bare httpx posts", number, len(batches))
        return time.perf_counter() - start


def _send_through_sink(
    url: str, events: list[Event], batch_size: int, report: ProgressFn
) -> dict[str, Any]:
    """Emit every event and wait until the sink reports all of them resolved."""
    phase = "HttpSink: emit, then wait for acks"
    # The run emits in one burst, faster than any network path drains: a queue
    # below n would count the excess as dropped and measure the bound instead.
    sink = HttpSink(url, token=COLLECTOR_TOKEN, batch_size=batch_size, max_queue=len(events))
    try:
        start = time.perf_counter()
        for number, event in enumerate(events, start=1):
            sink.emit(event)
            if number % batch_size == 0:
                report(phase, sink.stats().sent, len(events))
        emit_s = time.perf_counter() - start
        deadline = start + DELIVERY_TIMEOUT_S
        while not (drained := sink.flush(timeout_s=0.2)) and time.perf_counter() < deadline:
            report(phase, sink.stats().sent, len(events))
        elapsed_s = time.perf_counter() - start
    finally:
        sink.close()
    stats = sink.stats()
    report(phase, stats.sent, len(events))
    return {
        "drained": drained,
        "emit_s": emit_s,
        "elapsed_s": elapsed_s,
        "sent": stats.sent,
        "dropped": stats.dropped,
        "retries": stats.retries,
    }


def _collector_count(base_url: str) -> int:
    return int(httpx.get(base_url + "/healthz", timeout=10).json()["events"])


def bench_http_sink(
    n: int = 200_000, batch_size: int = 1000, *, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Events/s through ``HttpSink`` until the real collector route acknowledged all
    ``n``, against a bare ``httpx`` post loop sending the same batches pre-serialized."""
    report = progress or ignore_progress
    report("preparing events", 0, n)
    events = realistic_events(n)
    batches = [encode_jsonl(events[i : i + batch_size]).encode() for i in range(0, n, batch_size)]
    report("preparing events", n, n)
    # The collector runs in its own process, as the gateway does in a deployment:
    # sharing this process's GIL would charge its decoding to the sink.
    command = [sys.executable, "-m", "agentmars.server.web.ingest"]
    with serve_in_subprocess(command, env={TOKEN_ENV: COLLECTOR_TOKEN}) as base_url:
        url = base_url + EVENTS_PATH
        baseline_s = _post_batches(url, batches, report)
        before = _collector_count(base_url)
        sink = _send_through_sink(url, events, batch_size, report)
        acknowledged = _collector_count(base_url) - before
    delivered = sink["drained"] and sink["sent"] == n and acknowledged == n
    events_per_s = n / sink["elapsed_s"] if delivered else sink["sent"] / sink["elapsed_s"]
    baseline_per_s = n / baseline_s
    return {
        "events": n,
        "batch_size": batch_size,
        "collector": f"agentmars.server.web.ingest: POST {EVENTS_PATH}, decode + EventHub",
        "events_per_s": events_per_s,
        "baseline_events_per_s": baseline_per_s,
        "ratio": events_per_s / baseline_per_s,
        "emit_s": sink["emit_s"],
        "elapsed_s": sink["elapsed_s"],
        "baseline_s": baseline_s,
        "sent": sink["sent"],
        "dropped": sink["dropped"],
        "retries": sink["retries"],
        "acknowledged": acknowledged,
        "delivered_all": delivered,
        "target_events_per_s": HTTP_TARGET_EVENTS_PER_S,
        "passed": delivered and events_per_s >= HTTP_TARGET_EVENTS_PER_S,
    }


# --- presentation -------------------------------------------------------------------


def results_table(emission: dict[str, Any], http: dict[str, Any]) -> Table:
    """The figures beside their baselines, ratios and targets."""
    table = Table(title="agentmars bench sdk")
    for column in ("figure", "value", "baseline", "ratio", "target", "result"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    sdk, bare = emission["sdk_us"], emission["baseline_us"]
    for q in ("p50", "p90", "p99"):
        is_target = q == "p50"
        table.add_row(
            f"emission {q} (µs/event, n={emission['events']:,})",
            f"{sdk[q]:.2f}",
            f"{bare[q]:.2f}",
            f"{sdk[q] / bare[q]:.1f}x",
            f"<= {emission['target_p50_us']:g} µs" if is_target else "",
            verdict(emission["passed"]) if is_target else "",
        )
    table.add_row(
        f"HttpSink throughput (events/s, n={http['events']:,}, batch={http['batch_size']})",
        f"{http['events_per_s']:,.0f}",
        f"{http['baseline_events_per_s']:,.0f}",
        f"{http['ratio']:.2f}x",
        f">= {http['target_events_per_s']:,.0f}/s",
        verdict(http["passed"]),
    )
    table.caption = (
        f"emission baseline: no-op Python call with the same arguments; HttpSink baseline: "
        f"bare httpx posts of the same batches pre-serialized; collector: {http['collector']} "
        f"(own process, loopback); delivered {http['sent']:,}/{http['events']:,}, "
        f"acknowledged {http['acknowledged']:,}, dropped {http['dropped']:,}"
    )
    return table


def run(n_events: int, http_events: int, json_out: Path | None) -> dict[str, Any]:
    """Run both benchmarks, print the table, optionally write the figures as JSON."""
    with progress_bars() as report:
        emission = bench_emission(n_events, progress=report)
        http = bench_http_sink(http_events, progress=report)
    return publish(
        results_table(emission, http), {"emission": emission, "http_sink": http}, json_out
    )
