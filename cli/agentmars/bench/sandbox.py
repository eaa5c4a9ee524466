"""Sandbox benchmarks: what the pool adds to running a tool, and how many it runs.

``bench_dispatch`` times a trivial command (``true``) three ways in one run: a
bare ``subprocess.run`` (the baseline), through the pool in process (admission,
events, bubblewrap, cgroups), and through the service over loopback HTTP.
``bench_throughput`` runs 1000 short tools through the pool with all slots busy,
against bare subprocesses at the same concurrency.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from agentmars.bench.report import (
    ProgressFn,
    ignore_progress,
    percentiles_us,
    progress_bars,
    publish,
    verdict,
)
from agentmars.sandbox.client import SandboxClient
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecSpec
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.sinks.memory import MemorySink
from agentmars.server.web.serving import serve_in_subprocess

DISPATCH_TARGET_P50_MS = 10.0
TRIVIAL = ["true"]
TOKEN = "agentmars-bench"  # a loopback service that lives for one run
WARMUP = 20


def _time_ns(samples: list[int], started: int) -> None:
    samples.append(time.perf_counter_ns() - started)


def _bare(n: int, report: ProgressFn) -> list[int]:
    samples: list[int] = []
    for i in range(WARMUP + n):
        started = time.perf_counter_ns()
        subprocess.run(TRIVIAL, check=True)
        if i >= WARMUP:
            _time_ns(samples, started)
            report("bare subprocess.run", i - WARMUP + 1, n)
    return samples


async def _through_pool(pool: SandboxPool, n: int, report: ProgressFn) -> list[int]:
    pool.open_session("bench")
    spec = ExecSpec(command=TRIVIAL)
    samples: list[int] = []
    for i in range(WARMUP + n):
        started = time.perf_counter_ns()
        result = await pool.run("bench", spec, tool="true")
        if result.status != "ok":
            raise RuntimeError(f"benchmark command failed in the pool: {result}")
        if i >= WARMUP:
            _time_ns(samples, started)
            report("pool, in process", i - WARMUP + 1, n)
    return samples


def _through_service(config: SandboxConfig, n: int, report: ProgressFn) -> list[int]:
    command = [
        sys.executable, "-m", "agentmars.cli.main", "sandbox", "serve",
        "--workspace-root", str(config.workspace_root / "service"),
    ]  # fmt: skip
    samples: list[int] = []
    env = {"AGENTMARS_SANDBOX_TOKEN": TOKEN}
    with serve_in_subprocess(command, env=env) as url, SandboxClient(url, TOKEN) as client:
        client.open_session("bench")
        spec = ExecSpec(command=TRIVIAL)
        for i in range(WARMUP + n):
            started = time.perf_counter_ns()
            if client.run("bench", spec, tool="true").status != "ok":
                raise RuntimeError("benchmark command failed through the service")
            if i >= WARMUP:
                _time_ns(samples, started)
                report("service over HTTP", i - WARMUP + 1, n)
    return samples


def bench_dispatch(
    n: int = 300, *, workspace_root: Path, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """p50/p90/p99 latency (ms) of a trivial command: bare, pool, service."""
    report = progress or ignore_progress
    config = SandboxConfig(workspace_root=workspace_root, slots=1)
    bare = percentiles_us(_bare(n, report))

    async def in_pool() -> list[int]:
        async with SandboxPool(config, emitter=Emitter([MemorySink()])) as pool:
            return await _through_pool(pool, n, report)

    pool = percentiles_us(asyncio.run(in_pool()))
    service = percentiles_us(_through_service(config, n, report))
    overhead_ms = (pool["p50"] - bare["p50"]) / 1000
    return {
        "calls": n,
        "bare_ms": {k: v / 1000 for k, v in bare.items()},
        "pool_ms": {k: v / 1000 for k, v in pool.items()},
        "service_ms": {k: v / 1000 for k, v in service.items()},
        "pool_overhead_p50_ms": overhead_ms,
        "service_overhead_p50_ms": (service["p50"] - bare["p50"]) / 1000,
        "target_overhead_p50_ms": DISPATCH_TARGET_P50_MS,
        "passed": overhead_ms <= DISPATCH_TARGET_P50_MS,
    }


async def _bare_concurrent(n: int, concurrency: int, report: ProgressFn) -> float:
    gate = asyncio.Semaphore(concurrency)
    done = 0

    async def one() -> None:
        nonlocal done
        async with gate:
            process = await asyncio.create_subprocess_exec(*TRIVIAL)
            await process.wait()
        done += 1
        report("bare, same concurrency", done, n)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - started


async def _pool_concurrent(pool: SandboxPool, n: int, report: ProgressFn) -> float:
    pool.open_session("bench")
    spec = ExecSpec(command=TRIVIAL)
    done = 0

    async def one() -> None:
        nonlocal done
        if (await pool.run("bench", spec, tool="true")).status != "ok":
            raise RuntimeError("benchmark command failed in the pool")
        done += 1
        report("pool, all slots busy", done, n)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - started


def bench_throughput(
    n: int = 1000, *, workspace_root: Path, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Tools per second for ``n`` short tools submitted at once."""
    report = progress or ignore_progress
    config = SandboxConfig(workspace_root=workspace_root)

    async def measure() -> tuple[float, float]:
        async with SandboxPool(config, emitter=Emitter([MemorySink()])) as pool:
            pool_s = await _pool_concurrent(pool, n, report)
        return pool_s, await _bare_concurrent(n, len(pool.slots), report)

    pool_s, bare_s = asyncio.run(measure())
    return {
        "tools": n,
        "slots": config.resolved_slots(),
        "pool_per_s": n / pool_s,
        "bare_per_s": n / bare_s,
        "ratio": bare_s / pool_s,
    }


def results_table(dispatch: dict[str, Any], throughput: dict[str, Any]) -> Table:
    table = Table(title="agentmars bench sandbox (process backend)")
    for column in ("figure", "p50", "p90", "p99", "overhead p50", "target", "result"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    rows = [("bare subprocess.run", "bare_ms"), ("pool, in process", "pool_ms"),
            ("service over HTTP", "service_ms")]  # fmt: skip
    for label, key in rows:
        figures = dispatch[key]
        is_pool = key == "pool_ms"
        overhead = figures["p50"] - dispatch["bare_ms"]["p50"]
        table.add_row(
            f"{label} (ms, n={dispatch['calls']})",
            *(f"{figures[q]:.2f}" for q in ("p50", "p90", "p99")),
            "" if key == "bare_ms" else f"{overhead:+.2f} ms",
            f"<= {dispatch['target_overhead_p50_ms']:g} ms" if is_pool else "",
            verdict(dispatch["passed"]) if is_pool else "",
        )
    table.add_row(
        f"{throughput['tools']} short tools, {throughput['slots']} slot(s): pool / bare (tools/s)",
        f"{throughput['pool_per_s']:.0f}",
        f"{throughput['bare_per_s']:.0f}",
        f"{throughput['ratio']:.2f}x",
        "",
        "",
        "",
    )
    return table


def run(dispatch_calls: int, tools: int, json_out: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="agentmars-bench-") as scratch, progress_bars() as bars:
        root = Path(scratch)
        dispatch = bench_dispatch(dispatch_calls, workspace_root=root / "d", progress=bars)
        throughput = bench_throughput(tools, workspace_root=root / "t", progress=bars)
    results = {"dispatch": dispatch, "throughput": throughput}
    return publish(results_table(dispatch, throughput), results, json_out)
