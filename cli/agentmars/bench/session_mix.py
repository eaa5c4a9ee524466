"""Scheduling policies compared on the real serving path: a replayed mix of multi-turn
agent sessions through the gateway, on vLLM CPU with the agentmars plugin and the tiny
model (issue 5: FCFS vs Continuum vs MARS; MARS does not exist yet).

For each policy in turn, ``agentmars serve`` starts vLLM (the plugin, the policy, a
small KV cache so that keeping a session's KV across its tool calls matters) and the
gateway in front of it; the mix is replayed against the gateway and everything is
stopped before the next policy starts. The mix comes from a registered workload
generator (``workloads.registry``), scaled to the tiny model: contexts capped at
``max_context`` tokens, at most ``max_turns`` calls a session. A session is an agent:
each call a streamed completion whose prompt is the session's whole context so far
(prompt, then the previous calls' outputs and the tool results, as token ids), with the
session metadata and tool markers an agent sends in ``vllm_xargs``; between calls it
sleeps for the tool's duration (scaled by ``tool_scale``) and reports the tool to the
gateway's event endpoint, as the SDK and the sandbox do.

Per policy: session latency (first call's submit to the last call's end), time to first
token of the calls that follow a tool, and vLLM's prefix-cache hit rate over the replay
(``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` from the engine's
``/metrics``); then each policy's figures over the first policy's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from agentmars.bench.report import progress_bars, publish
from agentmars.cli.sandbox import parse_cores
from agentmars.sdk.events import SessionEnd, ToolEnd, ToolStart, encode_jsonl
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME, check_kv_holds_context
from agentmars.server.engines.vllm.smoke import metric_total
from agentmars.server.web.serving import serve_in_subprocess
from agentmars.server.workloads.registry import build_workload

TOKEN = "agentmars-bench"  # a loopback gateway that lives for one policy's run
FIRST_PLAIN_TOKEN = 3
"""Token ids below this are the tiny tokenizer's special tokens."""
TINY_VOCAB = 512
STARTUP_TIMEOUT_S = 600.0
CALL_TIMEOUT_S = 300.0
ENGINE_LINE = re.compile(r"engine\b[^\n]*?(http://\S+)")
"""How ``agentmars serve`` names the engine's URL on its first line (vLLM's, or the
twin's after its profile and policy)."""
SAMPLE_INTERVAL_S = 0.5
"""How often the engine's load is read during a replay."""


class SessionMixError(ValueError):
    """The benchmark cannot run as asked; the message says what to change."""


# --- the mix (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayTurn:
    """One call of a replayed session and the tool after it."""

    append: tuple[int, ...]
    """Token ids the call's prompt adds to the session's context."""
    output_tokens: int
    tool: str | None
    tool_s: float


@dataclass(frozen=True)
class ReplaySession:
    session_id: str
    arrival_s: float
    turns: tuple[ReplayTurn, ...]


@dataclass(frozen=True)
class MixShape:
    """Which sessions to replay, and how they are scaled to the tiny model."""

    workload: str = "react"
    sessions: int = 16
    rate: float = 1.0
    """Session arrivals per second (Poisson)."""
    seed: int = 1
    max_context: int = 4096
    max_turns: int = 4
    tool_scale: float = 1.0

    def check(self) -> None:
        if self.sessions < 1 or self.max_turns < 1:
            raise SessionMixError("--sessions and --max-turns must be at least 1")
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise SessionMixError(f"--rate must be a positive number, not {self.rate}")
        if not (math.isfinite(self.tool_scale) and self.tool_scale >= 0):
            raise SessionMixError(f"--tool-scale must be 0 or more, not {self.tool_scale}")
        if self.max_context < 256:
            raise SessionMixError(f"--max-context must be at least 256, not {self.max_context}")


def build_mix(shape: MixShape) -> list[ReplaySession]:
    """The workload's sessions, cut to ``max_turns`` calls (the last kept call ends the
    session: no tool after it), with seeded token ids for every append."""
    shape.check()
    workload = build_workload(
        shape.workload,
        sessions=shape.sessions,
        seed=shape.seed,
        rate=shape.rate,
        max_context=shape.max_context,
    )
    rng = random.Random(shape.seed)
    mix = []
    for session in workload.sessions:
        kept = session.turns[: shape.max_turns]
        turns = []
        for i, turn in enumerate(kept):
            tool = turn.tool if i < len(kept) - 1 else None
            append = tuple(
                rng.randrange(FIRST_PLAIN_TOKEN, TINY_VOCAB) for _ in range(turn.append_tokens)
            )
            turns.append(
                ReplayTurn(
                    append=append,
                    output_tokens=turn.output_tokens,
                    tool=None if tool is None else tool.kind,
                    tool_s=0.0 if tool is None else tool.wall_s * shape.tool_scale,
                )
            )
        mix.append(ReplaySession(session.session_id, session.arrival_s, tuple(turns)))
    return mix


# --- the replay (an agent per session, over HTTP) ---------------------------------------


@dataclass
class SessionResult:
    session_id: str
    latency_s: float = 0.0
    ttft_after_tool_s: list[float] = field(default_factory=list)
    error: str | None = None


class Replayer:
    """Replays sessions against a gateway: streamed completions and tool events."""

    def __init__(
        self, client: httpx.AsyncClient, gateway: str, model: str = SERVED_MODEL_NAME
    ) -> None:
        self._client = client
        self._gateway = gateway
        self._model = model

    async def session(self, session: ReplaySession, start: float) -> SessionResult:
        await asyncio.sleep(max(0.0, start + session.arrival_s - time.monotonic()))
        result = SessionResult(session.session_id)
        began = time.monotonic()
        context: list[int] = []
        try:
            for turn_index, turn in enumerate(session.turns):
                prompt = [*context, *turn.append]
                ttft, output = await self._call(session, turn_index, turn, prompt)
                if turn_index > 0:
                    result.ttft_after_tool_s.append(ttft)
                context = [*prompt, *output]
                if turn.tool is not None:
                    await self._tool(session, turn_index, turn)
        except (httpx.HTTPError, ValueError) as error:
            result.error = f"{type(error).__name__}: {error}"
        result.latency_s = time.monotonic() - began
        await self._events([SessionEnd(session_id=session.session_id, turns=len(session.turns))])
        return result

    async def _call(
        self, session: ReplaySession, turn_index: int, turn: ReplayTurn, prompt: list[int]
    ) -> tuple[float, list[int]]:
        body = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": turn.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
            "vllm_xargs": {
                "turn": turn_index,
                "follows_tool": int(turn_index > 0),
                "expects_tool": int(turn.tool is not None),
                **({"next_tool": turn.tool} if turn.tool else {}),
            },
        }
        sent = time.monotonic()
        ttft: float | None = None
        output: list[int] = []
        headers = {"X-Session-ID": session.session_id}
        async with self._client.stream(
            "POST", self._gateway + "/v1/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                raise ValueError(f"{response.status_code}: {(await response.aread())[:300]!r}")
            async for line in sse_lines(response):
                ids = stream_token_ids(line)
                if ids and ttft is None:
                    ttft = time.monotonic() - sent
                output += ids
        if ttft is None or len(output) != turn.output_tokens:
            raise ValueError(f"got {len(output)} of {turn.output_tokens} tokens")
        return ttft, output

    async def _tool(self, session: ReplaySession, turn_index: int, turn: ReplayTurn) -> None:
        assert turn.tool is not None
        call_id = f"{session.session_id}-tool{turn_index}"
        ids = {"session_id": session.session_id, "call_id": call_id, "turn": turn_index}
        await self._events([ToolStart(tool=turn.tool, **ids)])
        await asyncio.sleep(turn.tool_s)
        await self._events([ToolEnd(tool=turn.tool, duration_s=turn.tool_s, **ids)])

    async def _events(self, events: Sequence[Any]) -> None:
        response = await self._client.post(
            self._gateway + "/v1/events",
            content=encode_jsonl(events),
            headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/x-ndjson"},
        )
        response.raise_for_status()


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The lines of an SSE stream, split at ``\n`` only: a generated token's text may
    hold U+2028, U+0085 or a lone ``\r`` unescaped (valid in JSON), which
    ``aiter_lines`` would split a ``data:`` line at."""
    rest = ""
    async for text in response.aiter_text():
        *lines, rest = (rest + text).split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if rest:
        yield rest


def stream_token_ids(line: str) -> list[int]:
    """The output token ids of one SSE line of a completion stream."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return []
    chunk = json.loads(line[len("data: ") :])
    if "error" in chunk:
        raise ValueError(f"stream error: {chunk['error']}")
    return [int(t) for choice in chunk.get("choices", []) for t in choice.get("token_ids") or []]


async def replay(
    gateway: str, mix: list[ReplaySession], model: str = SERVED_MODEL_NAME
) -> list[SessionResult]:
    """Every session of the mix at its arrival time, all at once."""
    limits = httpx.Limits(max_connections=len(mix) * 2 + 4)
    timeout = httpx.Timeout(CALL_TIMEOUT_S, connect=5.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        replayer = Replayer(client, gateway, model)
        start = time.monotonic()
        return list(await asyncio.gather(*(replayer.session(s, start) for s in mix)))


# --- one policy: serve, warm up, replay, read the engine's counters ---------------------


@dataclass(frozen=True)
class EngineShape:
    """The vLLM server each policy runs on."""

    vllm_python: Path
    model: Path
    num_blocks: int = 64
    max_model_len: int = 4096
    """The longest context (``MixShape.max_context``)."""
    cores: str | None = "0"
    """CPUs for vLLM (or for the twin, which is the engine in the gateway's process)."""
    agent_cores: str | None = "1"
    """CPUs for the gateway and the replaying agents (this process), apart from the
    engine's, as a serving node keeps its API tier off the engine's cores."""
    log_dir: Path = Path("out/bench-session-mix")
    profile: str | None = "cpu-tiny"
    """The plugin's cost profile (policies that need time estimates): a registered name
    or a profile file, e.g. the one ``agentmars calibrate`` fitted to this host."""
    twin: bool = False
    """Serve with the wall-clock twin paced from ``profile`` (``serve --engine sim``)
    instead of vLLM."""
    vllm_args: tuple[str, ...] = ()
    """More vLLM arguments (``serve --vllm-arg``), e.g. its per-step log."""


def _serve_argv(engine: EngineShape, policy: str) -> list[str]:
    argv = [
        sys.executable, "-m", "agentmars.cli.main", "serve", "--policy", policy,
        "--num-blocks", str(engine.num_blocks), "--max-model-len", str(engine.max_model_len),
    ]  # fmt: skip
    if engine.profile is not None:
        # The server may resolve a relative file against another directory.
        profile = Path(engine.profile)
        argv += ["--profile", str(profile.resolve()) if profile.is_file() else engine.profile]
    if engine.twin:
        # The twin steps in the gateway's process: that process is the engine.
        argv += ["--engine", "sim"]
        return argv if engine.cores is None else ["taskset", "-c", engine.cores, *argv]
    argv += [
        "--engine", "vllm", "--model", str(engine.model),
        "--vllm-python", str(engine.vllm_python),
        "--log", str(engine.log_dir / f"vllm-{policy}.log"),
    ]  # fmt: skip
    if engine.cores is not None:
        argv += ["--cores", engine.cores]
    argv += [f"--vllm-arg={arg}" for arg in engine.vllm_args]
    return argv if engine.agent_cores is None else ["taskset", "-c", engine.agent_cores, *argv]


@contextlib.contextmanager
def pinned(cores: str | None) -> Iterator[None]:
    """This process (the replaying agents) on ``cores`` for the block ("1", "1-3", "1,3")."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, parse_cores(cores, "--agent-cores") or [])
    except (ValueError, OSError) as error:
        raise SessionMixError(f"cannot run the agents on CPUs {cores!r}: {error}") from None
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _engine_url(serve_log: Path) -> str:
    match = ENGINE_LINE.search(serve_log.read_text(errors="replace"))
    if match is None:
        raise RuntimeError(f"agentmars serve did not name its engine in {serve_log}")
    return match.group(1).rstrip(",")


def _counters(engine_url: str) -> dict[str, float]:
    text = httpx.get(engine_url + "/metrics", timeout=10.0).text
    names = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions")
    return {name: metric_total(text, f"vllm:{name}") for name in names}


LOAD_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")


class LoadSampler:
    """Reads the engine's load gauges (vLLM's, which the twin writes too) every
    ``SAMPLE_INTERVAL_S`` in a thread, for the figures of where the time goes."""

    def __init__(self, engine_url: str) -> None:
        self._url = engine_url + "/metrics"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="load-sampler", daemon=True)
        self.samples: list[tuple[float, float, float, float]] = []
        """(seconds since start, running, waiting, KV usage 0-1)."""

    def __enter__(self) -> LoadSampler:
        self._began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        with httpx.Client(timeout=5.0) as client:
            while not self._stop.wait(SAMPLE_INTERVAL_S):
                try:
                    text = client.get(self._url).text
                except httpx.HTTPError:
                    continue  # a missed sample; the replay reports a dead engine
                running, waiting, kv = (metric_total(text, f"vllm:{g}") for g in LOAD_GAUGES)
                self.samples.append((time.monotonic() - self._began, running, waiting, kv))

    def figures(self) -> dict[str, Any]:
        """Busy fraction (samples with a call running), queue and KV over the replay."""
        if not self.samples:
            return {"samples": 0}
        running = [s[1] for s in self.samples]
        waiting = [s[2] for s in self.samples]
        kv = [s[3] for s in self.samples]
        return {
            "samples": len(self.samples),
            "interval_s": SAMPLE_INTERVAL_S,
            "busy_fraction": sum(r > 0 for r in running) / len(running),
            "running_mean": statistics.fmean(running),
            "waiting_mean": statistics.fmean(waiting),
            "waiting_max": max(waiting),
            "kv_usage_mean": statistics.fmean(kv),
            "kv_usage_max": max(kv),
            "series": [list(s) for s in self.samples],
        }


def _served_model(engine_url: str) -> str:
    """The model the engine serves (vLLM: the tiny model's name; the twin: its profile's)."""
    return str(httpx.get(engine_url + "/v1/models", timeout=10.0).json()["data"][0]["id"])


async def _warm_up(gateway: str, tokens: int, model: str) -> None:
    """A first prefill and decode (vLLM compiles and allocates on first use), sharing
    no prefix with the mix (its ids descend; the mix's are random)."""
    prompt = [TINY_VOCAB - 1 - i % (TINY_VOCAB - FIRST_PLAIN_TOKEN) for i in range(tokens)]
    mix = [ReplaySession("warm-up", 0.0, (ReplayTurn(tuple(prompt), 16, None, 0.0),))]
    (result,) = await replay(gateway, mix, model)
    if result.error:
        raise RuntimeError(f"the warm-up call failed: {result.error}")


def run_policy(engine: EngineShape, policy: str, mix: list[ReplaySession]) -> dict[str, Any]:
    """Serve with ``policy``, replay the mix, stop; the policy's figures."""
    engine.log_dir.mkdir(parents=True, exist_ok=True)
    serve_log = engine.log_dir / f"serve-{'twin-' if engine.twin else ''}{policy}.log"
    started = time.monotonic()
    with serve_in_subprocess(
        _serve_argv(engine, policy),
        env={"AGENTMARS_GATEWAY_TOKEN": TOKEN},
        health_path="/healthz",
        startup_timeout_s=STARTUP_TIMEOUT_S,
        log_path=serve_log,
        stop_grace_s=60.0,
    ) as gateway:
        startup_s = time.monotonic() - started
        engine_url = _engine_url(serve_log)
        try:
            model = _served_model(engine_url)
            asyncio.run(_warm_up(gateway, engine.max_model_len // 2, model))
            before = _counters(engine_url)
            replay_started = time.monotonic()
            with LoadSampler(engine_url) as load:
                results = asyncio.run(replay(gateway, mix, model))
            replay_s = time.monotonic() - replay_started
            after = _counters(engine_url)
        except httpx.HTTPError as error:
            # A call's own failure is a failed session; this is the gateway or vLLM gone.
            raise RuntimeError(f"{policy}: {error!r} (logs in {engine.log_dir})") from None
    deltas = {name: after[name] - before[name] for name in before}
    figures = summarize(policy, results, deltas, startup_s=startup_s, replay_s=replay_s)
    figures["engine_load"] = load.figures()
    return figures


def summarize(
    policy: str,
    results: list[SessionResult],
    counters: dict[str, float],
    *,
    startup_s: float,
    replay_s: float,
) -> dict[str, Any]:
    """A policy's figures from its sessions and the engine's counter increments."""
    done = [r for r in results if r.error is None]
    latencies = sorted(r.latency_s for r in done)
    ttfts = [t for r in done for t in r.ttft_after_tool_s]
    queries = counters["prefix_cache_queries"]
    return {
        "policy": policy,
        "sessions": len(results),
        "failed": [f"{r.session_id}: {r.error}" for r in results if r.error is not None],
        "session_latency_s": {
            "mean": statistics.fmean(latencies) if latencies else math.nan,
            "p50": _nearest_rank(latencies, 50),
            "p95": _nearest_rank(latencies, 95),
        },
        "ttft_after_tool_s": {
            "mean": statistics.fmean(ttfts) if ttfts else math.nan,
            "calls": len(ttfts),
        },
        "prefix_cache_hit_rate": counters["prefix_cache_hits"] / queries if queries else math.nan,
        "prefix_cache_queries": queries,
        "preemptions": counters["num_preemptions"],
        "startup_s": startup_s,
        "replay_s": replay_s,
    }


def _nearest_rank(ordered: list[float], q: int) -> float:
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# --- the comparison -----------------------------------------------------------------

Figure = Callable[[dict[str, Any]], float]
FIGURES: tuple[tuple[str, Figure], ...] = (
    ("session latency mean s", lambda r: r["session_latency_s"]["mean"]),
    ("session latency p50 s", lambda r: r["session_latency_s"]["p50"]),
    ("session latency p95 s", lambda r: r["session_latency_s"]["p95"]),
    ("TTFT after a tool, mean s", lambda r: r["ttft_after_tool_s"]["mean"]),
    ("prefix-cache hit rate", lambda r: r["prefix_cache_hit_rate"]),
)


def run(
    engine: EngineShape,
    shape: MixShape,
    policies: Sequence[str],
    json_out: Path | None,
) -> dict[str, Any]:
    """Every policy in turn on the same mix; print the table, write the JSON."""
    check_fits(engine.num_blocks, shape.max_context)
    mix = build_mix(shape)
    results = []
    with pinned(engine.agent_cores), progress_bars() as show:
        for i, policy in enumerate(policies):
            show("policies (each: start vLLM, replay, stop)", i, len(policies))
            results.append(run_policy(engine, policy, mix))
        show("policies (each: start vLLM, replay, stop)", len(policies), len(policies))
    figures = {
        "mix": asdict(shape),
        "calls": sum(len(s.turns) for s in mix),
        "engine": {"num_blocks": engine.num_blocks, "max_model_len": engine.max_model_len,
                   "cores": engine.cores},
        "policies": results,
        "ratio_to_first": ratios(results),
    }  # fmt: skip
    return publish(table(figures), figures, json_out)


def check_fits(num_blocks: int, max_context: int) -> None:
    """A session's longest context must fit the engine's KV."""
    try:
        check_kv_holds_context(num_blocks, max_context)
    except ValueError as error:
        raise SessionMixError(str(error)) from None


def ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each later policy's figures over the first policy's."""
    base = results[0]
    return {
        r["policy"]: {name: _ratio(read(r), read(base)) for name, read in FIGURES}
        for r in results[1:]
    }


def _ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) else math.nan


def table(figures: dict[str, Any]) -> Table:
    results = figures["policies"]
    mix = figures["mix"]
    title = (
        f"{mix['sessions']} {mix['workload']} sessions ({figures['calls']} calls) at "
        f"{mix['rate']:g}/s, contexts <= {mix['max_context']} tokens, "
        f"{figures['engine']['num_blocks']} KV blocks"
    )
    out = Table(title=title)
    out.add_column("figure")
    for r in results:
        out.add_column(r["policy"], justify="right")
    for r in results[1:]:
        out.add_column(f"{r['policy']} / {results[0]['policy']}", justify="right")
    for name, read in FIGURES:
        row = [f"{read(r):.3f}" for r in results]
        row += [f"{figures['ratio_to_first'][r['policy']][name]:.3f}" for r in results[1:]]
        out.add_row(name, *row)
    out.add_row("preemptions", *(f"{r['preemptions']:g}" for r in results))
    out.add_row(
        "engine busy fraction",
        *(f"{r['engine_load'].get('busy_fraction', math.nan):.2f}" for r in results),
    )
    out.add_row(
        "calls waiting, mean / max",
        *(
            f"{r['engine_load'].get('waiting_mean', math.nan):.1f} / "
            f"{r['engine_load'].get('waiting_max', math.nan):g}"
            for r in results
        ),
    )
    out.add_row("failed sessions", *(str(len(r["failed"])) for r in results))
    return out
