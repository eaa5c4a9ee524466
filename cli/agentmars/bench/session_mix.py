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

With ``sandbox`` (``--sandbox``) the tools run for real instead: each is ``sleep
<tool_s>`` in the project's sandbox pool (``agentmars.sandbox``, the bubblewrap backend),
its slots pinned to the agent cores, at the tool priority the gateway answered the call
before it with (``X-Agentmars-Tool-Priority``); the pool's own tool events reach the
gateway's event endpoint through an ``HttpSink`` in place of the replayer's.

Per policy: session latency (first call's submit to the last call's end), time to first
token of the calls that follow a tool, vLLM's prefix-cache hit rate over the replay
(``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` from the engine's
``/metrics``) and the throughput (sessions completed per minute and output tokens per
second of the replay); then each policy's figures over the first policy's. With ``runs``
(``--runs``) each policy is served and replayed that many times, the policies
interleaved run by run (so slow drift of the machine hits all alike): the figures of
each run, their means over the runs, the spread of the mean latency, and the ratios of
the means. The JSON is rewritten after each run; a run that fails as a whole (its
server does not start, its engine dies) is recorded as failed, with why, and the next
runs go on.
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
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentmars.bench.report import progress_bars, publish, short_error, write_json
from agentmars.cli.sandbox import BadOption, parse_cores

# The replay runtime's: token ids below FIRST_PLAIN_TOKEN are special tokens, prompts
# are drawn below the tiny model's vocabulary, a call may take CALL_TIMEOUT_S, a stuck
# sandboxed tool is killed TIMEOUT_MARGIN_S after its duration.
from agentmars.runtime.replay.agent import CALL_TIMEOUT_S, FIRST_PLAIN_TOKEN
from agentmars.runtime.replay.agent import VOCAB as TINY_VOCAB
from agentmars.runtime.replay.tools import TIMEOUT_MARGIN_S
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecSpec, SandboxError
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import SessionEnd, ToolEnd, ToolStart, encode_jsonl
from agentmars.sdk.integrations.request import tool_priority_of
from agentmars.sdk.sinks.http import HttpSink, HttpSinkStats
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME, check_kv_holds_context
from agentmars.server.engines.vllm.smoke import metric_total
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.web.serving import serve_in_subprocess
from agentmars.server.workloads.registry import build_workload

TOKEN = "agentmars-bench"  # a loopback gateway that lives for one policy's run
STARTUP_TIMEOUT_S = 600.0
ENGINE_LINE = re.compile(r"engine\b[^\n]*?(http://\S+)")
"""How ``agentmars serve`` names the engine's URL on its first line (vLLM's, or the
twin's after its profile and policy)."""
SAMPLE_INTERVAL_S = 0.5
"""How often the engine's load is read during a replay."""
EVENTS_PATH = "/v1/events"
SINK_FLUSH_INTERVAL_S = 0.005
"""The pool's ``HttpSink`` sends a batch this soon after its first event (each tool's
events are also flushed before its session goes on)."""


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
    if workload.has_dependencies:
        raise SessionMixError(
            f"workload {shape.workload!r} has sessions that wait for others (an agent's "
            "aggregation step); this benchmark replays independent sessions: use "
            "agentmars bench replay, which honours the waits"
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
    started_s: float | None = None
    """``time.monotonic()`` at the first call's submit (None: not replayed here)."""
    ended_s: float | None = None
    """``time.monotonic()`` at the session's end (its last call's, or its failure)."""
    output_tokens: int = 0
    """Output tokens of the session's calls that completed."""
    tool_priorities: list[int] = field(default_factory=list)
    """The gateway's tool priority for each of the session's tools (0 without one)."""


class ToolRunner(Protocol):
    """Runs a replayed tool (the call before it was answered with ``priority``)."""

    async def run(
        self, session: ReplaySession, turn_index: int, turn: ReplayTurn, priority: int
    ) -> None: ...


class Replayer:
    """Replays sessions against a gateway: streamed completions and tool events."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        gateway: str,
        model: str = SERVED_MODEL_NAME,
        tools: ToolRunner | None = None,
    ) -> None:
        self._client = client
        self._gateway = gateway
        self._model = model
        self._tools = tools
        """None: each tool is a sleep, with the replayer's own tool events."""

    async def session(self, session: ReplaySession, start: float) -> SessionResult:
        await asyncio.sleep(max(0.0, start + session.arrival_s - time.monotonic()))
        result = SessionResult(session.session_id)
        began = result.started_s = time.monotonic()
        context: list[int] = []
        try:
            for turn_index, turn in enumerate(session.turns):
                prompt = [*context, *turn.append]
                ttft, output, priority = await self._call(session, turn_index, turn, prompt)
                if turn_index > 0:
                    result.ttft_after_tool_s.append(ttft)
                result.output_tokens += len(output)
                context = [*prompt, *output]
                if turn.tool is not None:
                    result.tool_priorities.append(priority)
                    if self._tools is None:
                        await self._tool(session, turn_index, turn)
                    else:
                        await self._tools.run(session, turn_index, turn, priority)
        except (httpx.HTTPError, ValueError, SandboxError) as error:
            result.error = f"{type(error).__name__}: {error}"
        result.ended_s = time.monotonic()
        result.latency_s = result.ended_s - began
        await self._events([SessionEnd(session_id=session.session_id, turns=len(session.turns))])
        return result

    async def _call(
        self, session: ReplaySession, turn_index: int, turn: ReplayTurn, prompt: list[int]
    ) -> tuple[float, list[int], int]:
        """The call's time to first token, its output token ids, and the tool priority
        the gateway answered it with (0 without one)."""
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
            priority = tool_priority_of(response.headers) or 0
            async for line in sse_lines(response):
                ids = stream_token_ids(line)
                if ids and ttft is None:
                    ttft = time.monotonic() - sent
                output += ids
        if ttft is None or len(output) != turn.output_tokens:
            raise ValueError(f"got {len(output)} of {turn.output_tokens} tokens")
        return ttft, output, priority

    async def _tool(self, session: ReplaySession, turn_index: int, turn: ReplayTurn) -> None:
        assert turn.tool is not None
        call_id = f"{session.session_id}-tool{turn_index}"
        ids = {"session_id": session.session_id, "call_id": call_id, "turn": turn_index}
        await self._events([ToolStart(tool=turn.tool, **ids)])
        await asyncio.sleep(turn.tool_s)
        # A sleep uses no CPU; said, so that a policy does not count a core busy for it
        # (MARS's CPU pressure takes an unreported CPU time as the whole duration).
        end = ToolEnd(tool=turn.tool, duration_s=turn.tool_s, cpu_time_s=0.0, **ids)
        await self._events([end])

    async def _events(self, events: Sequence[Any]) -> None:
        response = await self._client.post(
            self._gateway + EVENTS_PATH,
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
    gateway: str,
    mix: list[ReplaySession],
    model: str = SERVED_MODEL_NAME,
    tools: ToolRunner | None = None,
) -> list[SessionResult]:
    """Every session of the mix at its arrival time, all at once (``tools``: where the
    tools run; None: sleeps, with the replayer's own tool events)."""
    limits = httpx.Limits(max_connections=len(mix) * 2 + 4)
    timeout = httpx.Timeout(CALL_TIMEOUT_S, connect=5.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        replayer = Replayer(client, gateway, model, tools)
        start = time.monotonic()
        return list(await asyncio.gather(*(replayer.session(s, start) for s in mix)))


# --- the tools in the sandbox pool ------------------------------------------------------


@dataclass(frozen=True)
class SandboxShape:
    """The sandbox pool the replayed tools run in (``--sandbox``)."""

    tool_slots: int | None = None
    """Tools running at once (``--tool-slots``); None: one per agent core."""

    def config(self, agent_cores: str | None, workspace_root: Path) -> SandboxConfig:
        """The pool's configuration: its slots pinned to ``agent_cores`` (None: the
        pool's default, every allowed core but the first)."""
        try:
            cores = parse_cores(agent_cores, "--agent-cores")
            return SandboxConfig(
                workspace_root=workspace_root,
                tool_cores=cores,
                # The engine's cores are another process's: only the tools' are set here.
                engine_cores=[] if cores is not None else None,
                slots=self.tool_slots,
            )
        except BadOption as error:
            raise SessionMixError(str(error)) from None
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'config'}: "
                f"{e['msg'].removeprefix('Value error, ')}"
                for e in error.errors()
            )
            raise SessionMixError(f"--sandbox with these cores and slots: {problems}") from None

    def check(self, agent_cores: str | None) -> None:
        """Refuse a pool that cannot start here, before any server is started."""
        if self.tool_slots is not None and self.tool_slots < 1:
            raise SessionMixError(f"--tool-slots must be at least 1, not {self.tool_slots}")
        self.config(agent_cores, Path(tempfile.gettempdir()))


class SandboxTools:
    """Runs each replayed tool as ``sleep <tool_s>`` in a session's sandbox of the pool,
    at the gateway's priority; the pool's events go to the gateway through ``sink``."""

    def __init__(self, pool: SandboxPool, sink: HttpSink) -> None:
        self.pool = pool
        self.sink = sink
        self.queue_waits_s: list[float] = []
        self.sink_stats: HttpSinkStats | None = None
        """The sink's counters once it is closed."""

    async def run(
        self, session: ReplaySession, turn_index: int, turn: ReplayTurn, priority: int
    ) -> None:
        assert turn.tool is not None
        call_id = f"{session.session_id}-tool{turn_index}"
        spec = ExecSpec(
            command=["sleep", f"{turn.tool_s:.6f}"],
            timeout_s=turn.tool_s + TIMEOUT_MARGIN_S,
        )
        result = await self.pool.run(
            session.session_id, spec, tool=turn.tool, priority=priority, call_id=call_id,
            turn=turn_index,
        )  # fmt: skip
        self.queue_waits_s.append(result.queue_wait_s)
        # The tool's events reach the gateway before the session's next call, as the
        # replayer's own do (the sink sends from its thread).
        await asyncio.to_thread(self.sink.flush)
        if result.status != "ok":
            detail = result.detail or result.stderr.strip()[-200:]
            raise ValueError(f"tool {call_id} in the sandbox: {result.status} ({detail})")

    def figures(self) -> dict[str, Any]:
        waits = self.queue_waits_s
        stats = self.sink_stats
        return {
            "backend": self.pool.backend.name,
            "slots": [list(slot.cores) for slot in self.pool.slots],
            "tools": len(waits),
            "queue_wait_s": {
                "mean": statistics.fmean(waits) if waits else math.nan,
                "max": max(waits) if waits else math.nan,
            },
            "events_sent": stats.sent if stats else None,
            "events_dropped": stats.dropped if stats else None,
            "warnings": list(self.pool.warnings),
        }


@contextlib.asynccontextmanager
async def sandbox_tools(
    gateway: str, mix: Sequence[ReplaySession], sandbox: SandboxShape, agent_cores: str | None
) -> AsyncIterator[SandboxTools]:
    """A started pool with a workspace per session of the mix (made before the replay:
    a workspace with a quota costs a ``mkfs`` and a ``mount``), its events posted to the
    gateway; every session closed and the pool shut down (its processes gone) after."""
    with tempfile.TemporaryDirectory(prefix="agentmars-bench-", ignore_cleanup_errors=True) as root:
        config = sandbox.config(agent_cores, Path(root) / "workspaces")
        sink = HttpSink(gateway + EVENTS_PATH, token=TOKEN, flush_interval_s=SINK_FLUSH_INTERVAL_S)
        tools: SandboxTools | None = None
        try:
            async with SandboxPool(config, emitter=Emitter([sink])) as pool:
                tools = SandboxTools(pool, sink)
                try:
                    for session in mix:
                        await asyncio.to_thread(pool.open_session, session.session_id)
                    yield tools
                finally:
                    for session_id in pool.sessions:
                        # One that cannot be closed is unmounted by the pool's close.
                        with contextlib.suppress(SandboxError):
                            await pool.close_session(session_id)
        finally:
            sink.close()
            if tools is not None:
                tools.sink_stats = sink.stats()


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


def _serve_argv(engine: EngineShape, policy: str, tag: str = "") -> list[str]:
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
        "--log", str(engine.log_dir / f"vllm-{policy}{tag}.log"),
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


ENGINE_COUNTERS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "num_preemptions",
    # the engine's own time to first token (arrival at its API server to the first
    # token), beside the agents' one: where a call's wait was spent
    "time_to_first_token_seconds_sum",
    "time_to_first_token_seconds_count",
)


def _counters(engine_url: str) -> dict[str, float]:
    text = httpx.get(engine_url + "/metrics", timeout=10.0).text
    return {name: metric_total(text, f"vllm:{name}") for name in ENGINE_COUNTERS}


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


async def _replay_measured(
    gateway: str,
    mix: list[ReplaySession],
    model: str,
    engine_url: str,
    sandbox: SandboxShape | None,
    agent_cores: str | None,
) -> tuple[list[SessionResult], float, dict[str, Any], dict[str, Any] | None]:
    """The replay (with its tools in the sandbox pool, set up before and shut down after
    it), its duration, the engine's load over it, and the sandbox's figures."""
    async with contextlib.AsyncExitStack() as stack:
        tools = None
        if sandbox is not None:
            tools = await stack.enter_async_context(
                sandbox_tools(gateway, mix, sandbox, agent_cores)
            )
        started = time.monotonic()
        with LoadSampler(engine_url) as load:
            results = await replay(gateway, mix, model, tools)
        replay_s = time.monotonic() - started
    return results, replay_s, load.figures(), None if tools is None else tools.figures()


@dataclass(frozen=True)
class Served:
    """A policy's stack, up and warmed: where to send calls and read the engine."""

    gateway: str
    engine_url: str
    model: str
    startup_s: float


@contextlib.contextmanager
def served(engine: EngineShape, policy: str, tag: str = "") -> Iterator[Served]:
    """``agentmars serve`` with ``policy`` (its log in ``engine.log_dir``), warmed up;
    stopped when the block ends. The gateway or the engine gone (an HTTP error) or the
    sandbox pool unable to start inside the block is a ``RuntimeError`` naming the
    policy (a call's own failure is a failed session, not this)."""
    engine.log_dir.mkdir(parents=True, exist_ok=True)
    serve_log = engine.log_dir / f"serve-{'twin-' if engine.twin else ''}{policy}{tag}.log"
    started = time.monotonic()
    with serve_in_subprocess(
        _serve_argv(engine, policy, tag),
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
            yield Served(gateway, engine_url, model, startup_s)
        except httpx.HTTPError as error:
            raise RuntimeError(f"{policy}: {error!r} (logs in {engine.log_dir})") from None
        except SandboxError as error:
            raise RuntimeError(f"{policy}: the sandbox pool: {error}") from None


def run_policy(
    engine: EngineShape,
    policy: str,
    mix: list[ReplaySession],
    *,
    sandbox: SandboxShape | None = None,
    run_index: int | None = None,
) -> dict[str, Any]:
    """Serve with ``policy``, replay the mix, stop; the policy's figures (``sandbox``:
    the tools run in a sandbox pool on the agent cores; ``run_index``: the run's
    number, in its logs' names)."""
    tag = "" if run_index is None else f"-run{run_index}"
    with served(engine, policy, tag) as stack:
        before = _counters(stack.engine_url)
        results, replay_s, load, tools = asyncio.run(
            _replay_measured(
                stack.gateway, mix, stack.model, stack.engine_url, sandbox, engine.agent_cores
            )
        )
        after = _counters(stack.engine_url)
    deltas = {name: after[name] - before[name] for name in before}
    figures = summarize(policy, results, deltas, startup_s=stack.startup_s, replay_s=replay_s)
    figures["engine_load"] = load
    if tools is not None:
        figures["sandbox"] = tools
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
        "throughput": throughput(results),
        "startup_s": startup_s,
        "replay_s": replay_s,
    }


def throughput(results: Sequence[SessionResult]) -> dict[str, float]:
    """Sessions completed per minute and output tokens per second of the replay: over
    the span from the first session's start to the last one's end (a failed session's
    time counts in the span, its calls' tokens in the tokens, it is not completed);
    NaN without replayed times (a simulated run)."""
    timed = [
        (r.started_s, r.ended_s, r)
        for r in results
        if r.started_s is not None and r.ended_s is not None
    ]
    span = max(e for _, e, _ in timed) - min(s for s, _, _ in timed) if timed else math.nan
    if not span > 0:
        return {"sessions_per_min": math.nan, "output_tokens_per_s": math.nan, "span_s": span}
    completed = sum(r.error is None for _, _, r in timed)
    return {
        "sessions_per_min": completed / span * 60.0,
        "output_tokens_per_s": sum(r.output_tokens for _, _, r in timed) / span,
        "span_s": span,
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
    ("sessions per minute", lambda r: r["throughput"]["sessions_per_min"]),
    ("output tokens per s", lambda r: r["throughput"]["output_tokens_per_s"]),
)


def run(
    engine: EngineShape,
    shape: MixShape,
    policies: Sequence[str],
    json_out: Path | None,
    *,
    runs: int = 1,
    sandbox: SandboxShape | None = None,
) -> dict[str, Any]:
    """Every policy on the same mix, ``runs`` times, interleaved run by run; print the
    tables, write the JSON (after each run: what is measured is on disk as soon as it
    is). A run that fails (its server does not start, its engine dies) is recorded as
    failed, with why, and the next runs go on, each on a server of its own."""
    check_fits(engine.num_blocks, shape.max_context)
    order = run_order(policies, runs)
    mix = build_mix(shape)
    served: dict[str, list[dict[str, Any]]] = {policy: [] for policy in policies}
    phase = "runs (each: start the engine, replay, stop)"
    with pinned(engine.agent_cores), progress_bars() as show:
        for i, (run_index, policy) in enumerate(order):
            show(phase, i, len(order))
            served[policy].append(
                _one_run(engine, policy, mix, sandbox, run_index, tagged=runs > 1)
            )
            if json_out is not None:
                write_json(json_out, _figures(engine, shape, mix, runs, order, sandbox, served))
        show(phase, len(order), len(order))
    figures = _figures(engine, shape, mix, runs, order, sandbox, served)
    console = Console()
    if runs > 1:
        console.print(runs_table(figures))
    publish(table(figures), figures, json_out)
    for failure in figures["runs_failed"]:
        why = escape(failure["error"])
        console.print(f"[red]run failed[/red] {_run_name(failure, runs)}: {why}")
    return figures


def _one_run(
    engine: EngineShape,
    policy: str,
    mix: list[ReplaySession],
    sandbox: SandboxShape | None,
    run_index: int,
    *,
    tagged: bool,
) -> dict[str, Any]:
    """One run's figures, or its failure: a bench asked wrongly (``SessionMixError``)
    stops the bench; anything else fails this run only (its server is stopped by
    ``served`` whatever happened, so the next run starts on a fresh one)."""
    try:
        figures = run_policy(
            engine, policy, mix, sandbox=sandbox, run_index=run_index if tagged else None
        )
    except SessionMixError:
        raise
    except Exception as error:
        return {"run": run_index, "policy": policy, "status": "failed", "error": short_error(error)}
    return {"run": run_index, "status": "done", **figures}


def _figures(
    engine: EngineShape,
    shape: MixShape,
    mix: list[ReplaySession],
    runs: int,
    order: list[tuple[int, str]],
    sandbox: SandboxShape | None,
    served: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """The figures of the runs served so far (a policy not yet served is ``pending``)."""
    results = [policy_figures(policy, its_runs) for policy, its_runs in served.items()]
    return {
        "mix": asdict(shape),
        "calls": sum(len(s.turns) for s in mix),
        "engine": {"num_blocks": engine.num_blocks, "max_model_len": engine.max_model_len,
                   "cores": engine.cores, "twin": engine.twin},
        "runs": runs,
        "order": [{"run": run_index, "policy": policy} for run_index, policy in order],
        "sandbox": None if sandbox is None else {
            "tool_slots": sandbox.tool_slots, "tool_cores": engine.agent_cores,
        },
        "policies": results,
        "ratio_to_first": ratios(results),
        "runs_failed": [
            {"run": run["run"], "policy": run["policy"], "error": run["error"]}
            for policy_runs in served.values()
            for run in policy_runs
            if run.get("status") == "failed"
        ],
    }  # fmt: skip


def policy_figures(policy: str, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A policy's figures over its runs: ``aggregate`` of those that ended (``status``
    ``done``), with every run, the failed ones included, under ``runs``; ``failed``
    (with ``error``, the first failed run's) when none ended; ``pending`` before any
    was served."""
    done = [run for run in runs if _has_figures(run)]
    if done:
        return {**aggregate(done), "status": "done", "runs": list(runs)}
    if runs:
        return {
            "policy": policy, "status": "failed", "error": runs[0]["error"], "failed": [],
            "runs": list(runs),
        }  # fmt: skip
    return {"policy": policy, "status": "pending", "failed": [], "runs": []}


def _run_name(failure: dict[str, Any], runs: int) -> str:
    return failure["policy"] if runs == 1 else f"{failure['policy']} (run {failure['run']})"


def failed_runs_line(figures: dict[str, Any]) -> str | None:
    """One line naming the runs that failed (None: none did)."""
    failures = figures.get("runs_failed") or []
    if not failures:
        return None
    names = ", ".join(_run_name(failure, figures.get("runs", 1)) for failure in failures)
    total = len(figures.get("order") or []) or len(failures)
    return f"{len(failures)} of {total} runs failed: {names}"


def run_order(policies: Sequence[str], runs: int) -> list[tuple[int, str]]:
    """(run, policy) in the order they are served: the policies interleaved run by run,
    each run's order rotated by one (fcfs, continuum, mars; continuum, mars, fcfs; ...),
    so slow drift of the machine (its load, its clock, the page cache) hits every policy
    alike, and with as many runs as policies each is served once in every place of a
    run: on a host whose speed moves within minutes, a fixed order gives the drift
    within a run to one policy. Runs count from 1."""
    if runs < 1:
        raise SessionMixError(f"--runs must be at least 1, not {runs}")
    if not policies:
        raise SessionMixError("give at least one policy")
    n = len(policies)
    return [
        (run_index, policies[(run_index - 1 + place) % n])
        for run_index in range(1, runs + 1)
        for place in range(n)
    ]


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A policy's figures over its runs (each ``summarize``'s, with its ``run``): each
    figure's mean over the runs, in the place a single run's has it (so one run reads
    as before), the spread (min-max) of the runs' mean latency, and the runs."""
    first = runs[0]

    def mean(*path: str) -> float:
        """The mean over the runs of the figure at ``path`` in their dicts."""
        values: list[float] = []
        for r in runs:
            value: Any = r
            for key in path:
                value = value[key]
            values.append(value)
        return statistics.fmean(values)

    latency_means = [r["session_latency_s"]["mean"] for r in runs]
    return {
        "policy": first["policy"],
        "sessions": first["sessions"],
        "failed": [
            failure if len(runs) == 1 else f"run {r.get('run', i + 1)}: {failure}"
            for i, r in enumerate(runs)
            for failure in r["failed"]
        ],
        "session_latency_s": {q: mean("session_latency_s", q) for q in ("mean", "p50", "p95")},
        "session_latency_mean_spread_s": {"min": min(latency_means), "max": max(latency_means)},
        "ttft_after_tool_s": {
            "mean": mean("ttft_after_tool_s", "mean"),
            "calls": sum(r["ttft_after_tool_s"]["calls"] for r in runs),
        },
        "prefix_cache_hit_rate": mean("prefix_cache_hit_rate"),
        "prefix_cache_queries": mean("prefix_cache_queries"),
        "preemptions": mean("preemptions"),
        "throughput": {
            name: mean("throughput", name)
            for name in ("sessions_per_min", "output_tokens_per_s", "span_s")
        },
        "startup_s": mean("startup_s"),
        "replay_s": mean("replay_s"),
        "engine_load": _mean_load([r.get("engine_load", {}) for r in runs]),
        "runs": list(runs),
    }


def _mean_load(loads: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The runs' engine load figures: means of the means, the largest of the maxima."""
    sampled = [load for load in loads if load.get("samples")]
    if not sampled:
        return {"samples": 0}
    means = ("busy_fraction", "running_mean", "waiting_mean", "kv_usage_mean")
    return {
        "samples": sum(load["samples"] for load in sampled),
        "interval_s": SAMPLE_INTERVAL_S,
        **{name: statistics.fmean(load[name] for load in sampled) for name in means},
        **{name: max(load[name] for load in sampled) for name in ("waiting_max", "kv_usage_max")},
    }


def check_model(model: Path) -> Path:
    """A model directory vLLM can serve the mix's prompts with: a Hugging Face config
    whose vocabulary holds the token ids the prompts are drawn from (the tiny model's)."""
    config_file = model / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as error:
        raise SessionMixError(f"--model {model}: no readable config.json ({error})") from None
    vocab = config.get("vocab_size") if isinstance(config, dict) else None
    if not isinstance(vocab, int) or vocab < TINY_VOCAB:
        raise SessionMixError(
            f"--model {model}: its vocabulary ({vocab}) must hold the prompts' token ids "
            f"(below {TINY_VOCAB})"
        )
    return model


def served_model(vllm_python: Path, model: Path | None) -> Path:
    """The model vLLM serves: ``model`` once checked, else the tiny model (made by the
    vLLM environment's python on first use)."""
    return check_model(model) if model is not None else tiny_model_made_by(vllm_python)


def check_fits(num_blocks: int, max_context: int) -> None:
    """A session's longest context must fit the engine's KV."""
    try:
        check_kv_holds_context(num_blocks, max_context)
    except ValueError as error:
        raise SessionMixError(str(error)) from None


def ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each later policy's figures over the first policy's (of those with figures: a
    policy whose runs all failed has none)."""
    measured = _measured(results)
    if not measured:
        return {}
    base = measured[0]
    return {
        r["policy"]: {name: _ratio(read(r), read(base)) for name, read in FIGURES}
        for r in measured[1:]
    }


def _measured(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The policies with figures (a run of theirs ended)."""
    return [r for r in results if _has_figures(r)]


def _has_figures(result: dict[str, Any]) -> bool:
    """A run that ended, or a policy with one (``status`` ``done``; figures made before
    runs had a status have no ``status``)."""
    return bool(result.get("status", "done") == "done")


def _ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) else math.nan


def _title(figures: dict[str, Any]) -> str:
    mix = figures["mix"]
    title = (
        f"{mix['sessions']} {mix['workload']} sessions ({figures['calls']} calls) at "
        f"{mix['rate']:g}/s, contexts <= {mix['max_context']} tokens, "
        f"{figures['engine']['num_blocks']} KV blocks"
    )
    sandbox = figures.get("sandbox")
    if sandbox is not None:
        slots = sandbox["tool_slots"] or "one per core"
        title += f", tools in the sandbox (slots: {slots})"
    return title


def table(figures: dict[str, Any]) -> Table:
    """Each policy's figures (their means over the runs) and their ratios to the first's;
    a policy whose runs all failed shows ``run failed`` in its column."""
    results = figures["policies"]
    measured = _measured(results)
    runs = figures.get("runs", 1)
    title = _title(figures) + (f"; means over {runs} runs" if runs > 1 else "")
    out = Table(title=title)
    out.add_column("figure")
    for r in results:
        out.add_column(r["policy"], justify="right")
    for r in measured[1:]:
        out.add_column(f"{r['policy']} / {measured[0]['policy']}", justify="right")

    def cells(show: Callable[[dict[str, Any]], str]) -> list[str]:
        """One row's cells: each policy's figure, as ``show`` gives it if it has some."""
        return [show(r) if _has_figures(r) else _no_figures(r) for r in results]

    for name, read in FIGURES:
        row = [f"{read(r):.3f}" if _has_figures(r) else _no_figures(r) for r in results]
        row += [f"{figures['ratio_to_first'][r['policy']][name]:.3f}" for r in measured[1:]]
        out.add_row(name, *row)
    if runs > 1:
        out.add_row(
            "session latency mean, min-max s",
            *cells(
                lambda r: (
                    f"{r['session_latency_mean_spread_s']['min']:.3f}-"
                    f"{r['session_latency_mean_spread_s']['max']:.3f}"
                )
            ),
        )
    out.add_row("preemptions", *cells(lambda r: f"{r['preemptions']:g}"))
    out.add_row(
        "engine busy fraction",
        *cells(lambda r: f"{r['engine_load'].get('busy_fraction', math.nan):.2f}"),
    )
    out.add_row(
        "calls waiting, mean / max",
        *cells(
            lambda r: (
                f"{r['engine_load'].get('waiting_mean', math.nan):.1f} / "
                f"{r['engine_load'].get('waiting_max', math.nan):g}"
            )
        ),
    )
    if figures.get("sandbox") is not None:
        out.add_row(
            "tool wait for a sandbox slot, mean s", *cells(lambda r: f"{_sandbox_wait(r):.3f}")
        )
    out.add_row("failed sessions", *cells(lambda r: str(len(r["failed"]))))
    if any(run.get("status") == "failed" for r in results for run in r["runs"]):
        out.add_row(
            "failed runs",
            *(str(sum(run.get("status") == "failed" for run in r["runs"])) for r in results),
        )
    return out


def _no_figures(result: dict[str, Any]) -> str:
    """A table's cell for a policy without figures: its runs failed (or are to come)."""
    return f"[red]run {result['status']}[/red]"


def _sandbox_wait(result: dict[str, Any]) -> float:
    """A policy's mean wait of a tool for a sandbox slot, over its runs."""
    waits = [
        run["sandbox"]["queue_wait_s"]["mean"]
        for run in result.get("runs", [result])
        if "sandbox" in run
    ]
    return statistics.fmean(waits) if waits else math.nan


RUN_COLUMNS: tuple[tuple[str, Figure], ...] = tuple(
    zip(
        ("latency mean s", "p50 s", "p95 s", "TTFT after tool s", "prefix hit rate",
         "sessions / min", "output tok / s"),
        (read for _, read in FIGURES),
        strict=True,
    )
)  # fmt: skip
"""``FIGURES`` under the per-run table's shorter headings."""


def runs_table(figures: dict[str, Any]) -> Table:
    """Every run's figures, in the order the runs were served (a failed run's row says
    so; why is printed below the tables)."""
    out = Table(title=_title(figures) + ": each run")
    out.add_column("run", justify="right")
    out.add_column("policy")
    for name, _ in RUN_COLUMNS:
        out.add_column(name, justify="right")
    out.add_column("failed", justify="right")
    runs = {(run["run"], r["policy"]): run for r in figures["policies"] for run in r["runs"]}
    for served in figures["order"]:
        run = runs.get((served["run"], served["policy"]))
        if run is None or not _has_figures(run):
            status = "pending" if run is None else run["status"]
            out.add_row(
                str(served["run"]),
                served["policy"],
                *(["-"] * len(RUN_COLUMNS)),
                f"[red]run {status}[/red]",
            )
            continue
        out.add_row(
            str(served["run"]),
            served["policy"],
            *(f"{read(run):.3f}" for _, read in RUN_COLUMNS),
            str(len(run["failed"])),
        )
    return out
