"""Latency the gateway adds: the same short completion sent straight to an engine and
through the gateway (its own process, FCFS, on loopback), alternating call by call so
both see the same machine.

The engine is our scripted OpenAI-compatible server with no modelled latency, so the
difference is the gateway's own cost (parsing, session metadata, events, admission,
one more loopback hop); against vLLM the same difference would hide in the engine's
variance. Target (issue 5): p50 added latency <= 2 ms.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from agentmars.bench.report import ProgressFn, percentiles_us, progress_bars, publish, verdict
from agentmars.server.background import serve_in_subprocess, serve_in_thread
from agentmars.server.scripted_llm import ScriptedLatency, create_scripted_llm_app

TARGET_ADDED_P50_MS = 2.0
MODEL = "scripted"
TOKEN = "agentmars-bench"  # a loopback gateway that lives for one run
WARMUP = 50
BODY: dict[str, Any] = {"model": MODEL, "prompt": "hello there", "max_tokens": 1}


def _one(client: httpx.Client, url: str) -> int:
    started = time.perf_counter_ns()
    response = client.post(url + "/v1/completions", json=BODY, headers={"X-Session-ID": "bench"})
    elapsed = time.perf_counter_ns() - started
    response.raise_for_status()
    return elapsed


def measure(calls: int, progress: ProgressFn) -> tuple[list[int], list[int]]:
    engine_app = create_scripted_llm_app(ScriptedLatency(first_token_s=0.0, per_token_s=0.0), MODEL)
    with serve_in_thread(engine_app) as engine_url:
        gateway_argv = [
            sys.executable,
            "-m",
            "agentmars.server.gateway.app",
            "--upstream",
            engine_url,
        ]
        env = {"AGENTMARS_GATEWAY_TOKEN": TOKEN}
        with serve_in_subprocess(gateway_argv, env=env) as gateway_url, httpx.Client() as client:
            direct, through = [], []
            for i in range(WARMUP + calls):
                a, b = _one(client, engine_url), _one(client, gateway_url)
                if i >= WARMUP:
                    direct.append(a)
                    through.append(b)
                progress("direct and through the gateway", i + 1, WARMUP + calls)
    return direct, through


def run(calls: int, json_out: Path | None) -> dict[str, Any]:
    with progress_bars() as progress:
        direct, through = measure(calls, progress)
    direct_us, through_us = percentiles_us(direct), percentiles_us(through)
    added_ms = (through_us["p50"] - direct_us["p50"]) / 1000
    table = Table(title=f"gateway overhead: {calls} short completions, alternating")
    for column in ("path", "p50 ms", "p90 ms", "p99 ms", "added p50 ms", "target", "result"):
        table.add_column(column, justify="right")
    table.add_row(
        "direct", *(f"{direct_us[q] / 1000:.2f}" for q in ("p50", "p90", "p99")), "", "", ""
    )
    table.add_row(
        "gateway",
        *(f"{through_us[q] / 1000:.2f}" for q in ("p50", "p90", "p99")),
        f"{added_ms:.2f}",
        f"<= {TARGET_ADDED_P50_MS:g}",
        verdict(added_ms <= TARGET_ADDED_P50_MS),
    )
    figures = {
        "calls": calls,
        "direct_ms": {k: v / 1000 for k, v in direct_us.items()},
        "gateway_ms": {k: v / 1000 for k, v in through_us.items()},
        "added_p50_ms": added_ms,
        "target_added_p50_ms": TARGET_ADDED_P50_MS,
        "passed": added_ms <= TARGET_ADDED_P50_MS,
    }
    return publish(table, figures, json_out)
