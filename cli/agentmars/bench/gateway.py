"""Latency the gateway adds: the same short completion sent straight to an engine and
through the gateway (its own process, FCFS, on loopback), alternating call by call so
both see the same machine (and each path first every other time). Each path's calls
reuse one connection (keep-alive, as the openai client does); ``fresh_connections``
opens one per call instead.

Two engines: our scripted OpenAI-compatible server, by default answering at once
(``engine_latency_ms`` makes it wait that long first), where the difference is the
gateway's own cost (parsing, session metadata, events, admission, one more loopback
hop); and vLLM CPU with the tiny model (``vllm_python``), the issue's "over direct
vLLM", where the same difference sits in the engine's variance. An engine that takes
a few ms makes the hop dearer than one that answers at once: the proxy's process is
idle in between and its next step runs cold. Target (issue 5): p50 added latency
<= 2 ms.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from agentmars.bench.report import ProgressFn, percentiles_us, progress_bars, publish, verdict
from agentmars.server.engines.scripted.app import ScriptedLatency, create_scripted_llm_app
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME, VllmServerConfig, serve_vllm
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.web.serving import serve_in_subprocess, serve_in_thread

TARGET_ADDED_P50_MS = 2.0
MODEL = "scripted"
TOKEN = "agentmars-bench"  # a loopback gateway that lives for one run
WARMUP = 50


def _body(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "hello there", "max_tokens": 1}


def _client(fresh_connections: bool) -> httpx.Client:
    """One connection per origin, reused call after call; or none kept, one per call."""
    if fresh_connections:
        return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
    return httpx.Client()


def _one(client: httpx.Client, url: str, body: dict[str, Any]) -> int:
    started = time.perf_counter_ns()
    response = client.post(url + "/v1/completions", json=body, headers={"X-Session-ID": "bench"})
    elapsed = time.perf_counter_ns() - started
    response.raise_for_status()
    return elapsed


@contextlib.contextmanager
def _engine(vllm_python: Path | None, latency_s: float) -> Iterator[tuple[str, str]]:
    """The engine's URL and model name: the scripted server (answering after
    ``latency_s``), or vLLM CPU with the tiny model on core 0."""
    if vllm_python is None:
        latency = ScriptedLatency(first_token_s=latency_s, per_token_s=0.0)
        app = create_scripted_llm_app(latency, MODEL)
        with serve_in_thread(app) as url:
            yield url, MODEL
        return
    config = VllmServerConfig(
        python=vllm_python, model=tiny_model_made_by(vllm_python), max_model_len=2048, cores="0"
    )
    with (
        tempfile.TemporaryDirectory(prefix="agentmars-bench-") as folder,
        serve_vllm(config, Path(folder) / "vllm.log") as url,
    ):
        yield url, SERVED_MODEL_NAME


@dataclass(frozen=True)
class Hop:
    """A proxy in front of the engine: its command (the engine's URL is filled in; the
    port is appended as ``--port N``) and the path that answers once it is up."""

    argv: tuple[str, ...]
    health_path: str = "/healthz"

    def command(self, engine_url: str) -> list[str]:
        return [part.replace("{engine_url}", engine_url) for part in self.argv]


def python_module(module: str, *args: str) -> Hop:
    return Hop((sys.executable, "-m", module, "--upstream", "{engine_url}", *args))


PROXIES = {
    "gateway": python_module("agentmars.server.gateway.app"),
    "pass-through": python_module("agentmars.bench.passthrough"),
}
"""The gateway, and a bare proxy of its server stack (what the hop alone costs). Each is
measured in a phase of its own, alternating call by call with direct calls: a third
path in the same rotation slows all of them (by 0.4 ms here)."""


def measure(
    calls: int,
    progress: ProgressFn,
    vllm_python: Path | None = None,
    engine_latency_ms: float = 0,
    proxies: Mapping[str, Hop] = PROXIES,
    fresh_connections: bool = False,
) -> dict[str, tuple[list[int], list[int]]]:
    """Per proxy: the direct and the proxied latencies (ns) of its phase; each path on a
    connection of its own, reused (else a new one per call: ``fresh_connections``)."""
    if vllm_python is not None and engine_latency_ms:
        raise ValueError("an engine latency is for the scripted engine, not vLLM")
    if engine_latency_ms < 0:
        raise ValueError(f"the engine latency must be >= 0 ms, not {engine_latency_ms:g}")
    phases = {}
    engine = _engine(vllm_python, engine_latency_ms / 1000)
    with engine as (engine_url, model), _client(fresh_connections) as client:
        body = _body(model)
        for name, hop in proxies.items():
            env = {"AGENTMARS_GATEWAY_TOKEN": TOKEN}
            served = serve_in_subprocess(
                hop.command(engine_url), env=env, health_path=hop.health_path
            )
            with served as proxy_url:
                direct, through = [], []
                for i in range(WARMUP + calls):
                    # Each path goes first every other time: neither is always the
                    # one that follows the other's call.
                    if i % 2:
                        b, a = _one(client, proxy_url, body), _one(client, engine_url, body)
                    else:
                        a, b = _one(client, engine_url, body), _one(client, proxy_url, body)
                    if i >= WARMUP:
                        direct.append(a)
                        through.append(b)
                    progress(f"direct and through the {name}", i + 1, WARMUP + calls)
            phases[name] = (direct, through)
    return phases


def run(
    calls: int,
    json_out: Path | None,
    vllm_python: Path | None = None,
    engine_latency_ms: float = 0,
    fresh_connections: bool = False,
) -> dict[str, Any]:
    with progress_bars() as progress:
        phases = measure(
            calls, progress, vllm_python, engine_latency_ms, fresh_connections=fresh_connections
        )
    if vllm_python is None:
        engine = f"scripted engine answering after {engine_latency_ms:g} ms"
    else:
        engine = "vLLM CPU, tiny model"
    connections = "a new connection per call" if fresh_connections else "keep-alive"
    title = f"gateway overhead: {calls} short completions, alternating, {connections} ({engine})"
    table, figures = phase_table(title, phases, target_path="gateway")
    figures["engine"] = "scripted" if vllm_python is None else "vllm"
    figures["calls"] = calls
    figures["engine_latency_ms"] = engine_latency_ms
    figures["connections"] = "fresh" if fresh_connections else "keep-alive"
    figures["added_p50_ms"] = figures["gateway"]["added_p50_ms"]
    figures["target_added_p50_ms"] = TARGET_ADDED_P50_MS
    figures["passed"] = figures["added_p50_ms"] <= TARGET_ADDED_P50_MS
    return publish(table, figures, json_out)


def phase_table(
    title: str, phases: Mapping[str, tuple[list[int], list[int]]], target_path: str | None
) -> tuple[Table, dict[str, Any]]:
    """A row per proxy (the added p50 judged against the target for ``target_path``),
    and its figures under its name (dashes as underscores)."""
    table = Table(title=title)
    columns = ["path", "direct p50 ms", "p50 ms", "p90 ms", "p99 ms", "added p50 ms"]
    for column in columns + (["target", "result"] if target_path else []):
        table.add_column(column, justify="right")
    figures: dict[str, Any] = {}
    for name, (direct, through) in phases.items():
        direct_us, through_us = percentiles_us(direct), percentiles_us(through)
        added_ms = (through_us["p50"] - direct_us["p50"]) / 1000
        row = [
            name,
            f"{direct_us['p50'] / 1000:.2f}",
            *(f"{through_us[q] / 1000:.2f}" for q in ("p50", "p90", "p99")),
            f"{added_ms:.2f}",
        ]
        if target_path:
            judged = name == target_path
            row.append(f"<= {TARGET_ADDED_P50_MS:g}" if judged else "")
            row.append(verdict(added_ms <= TARGET_ADDED_P50_MS) if judged else "")
        table.add_row(*row)
        figures[name.replace("-", "_")] = {
            "direct_ms": {k: v / 1000 for k, v in direct_us.items()},
            "through_ms": {k: v / 1000 for k, v in through_us.items()},
            "added_p50_ms": added_ms,
        }
    return table, figures
