"""The cost of the plugin's ``schedule()`` against stock vLLM's (issue 5: at most 10%
more), on the same synthetic queue of agent calls. Run it with the vLLM environment's
python::

    python -m agentmars.server.engines.vllm.bench_schedule --json out/bench-plugin.json

vLLM 0.32's own V1 ``Scheduler`` and the plugin's ``AgentmarsScheduler`` are built
directly, as vLLM's own scheduler tests build theirs (a ``VllmConfig`` of the tiny
model, a ``KVCacheConfig`` of one full-attention group), with no model and no worker.
Each is driven the way ``EngineCore`` drives it: ``schedule()``, then
``update_from_output()`` with the step's output. The scheduler, its KV cache manager,
block pool and prefix cache are the real ones; the model's output is what cannot run
here, so the step's output is made up: one sampled token for every request whose
prompt is complete (``synthetic_output``), as a GPU would return it.

The queue: sessions of a few turns whose prompts grow by the previous turn's context
(the prefix a pin keeps), with the session metadata the gateway sends in
``vllm_xargs``. Every session's first call is queued at the start; a session's next
call is queued when its previous call finishes. The KV cache is sized so that not
every session fits, so pins, pressure releases and preemptions all happen.

Only ``schedule()`` is timed for the target (``perf_counter_ns`` around each call);
``update_from_output()`` is timed too and written to the figures, because the plugin's
pinning runs there. The pure parts (the queue) import no vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentmars.sdk.events import SessionEnd

PLUGIN_POLICIES = ("fcfs", "continuum", "mars")
"""The policies the plugin runs in the benchmark by default (stock vLLM is the
baseline; ``--policies`` names others, e.g. MARS's ablations)."""
STOCK = "stock"
MAX_IDLE_S = 30.0
"""Seconds (of the host's clock) of steps that schedule nothing before a run is
declared stuck."""
IDLE_WAIT_S = 0.005
"""How long the driver waits after a step that scheduled nothing, as vLLM's engine loop
waits for work: a pausing policy resumes its sessions from its ``tick``, which the
plugin's ticker runs meanwhile (ThunderAgent's every ``check_interval_s``)."""
VOCAB = 500
"""Token ids are drawn below this (the tiny model's vocabulary has 512)."""


@dataclass(frozen=True)
class QueueShape:
    """The synthetic queue: ``sessions * turns`` calls."""

    sessions: int = 64
    turns: int = 4
    first_prompt: tuple[int, int] = (256, 1024)
    """A session's first prompt, in tokens (uniform in this range)."""
    tool_result: tuple[int, int] = (32, 256)
    """Tokens a tool's result adds to the context before the next turn."""
    output: tuple[int, int] = (8, 48)
    """Tokens each call generates."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1:
            raise ValueError("QueueShape needs at least one session of one turn")
        for name in ("first_prompt", "tool_result", "output"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"QueueShape.{name} must be 1 <= low <= high, not {low, high}")

    @property
    def calls(self) -> int:
        return self.sessions * self.turns

    @property
    def max_context(self) -> int:
        """The longest a session's context can grow, in tokens (its last call's)."""
        return (
            self.first_prompt[1]
            + (self.turns - 1) * self.tool_result[1]
            + self.turns * self.output[1]
        )


@dataclass(frozen=True)
class CallSpec:
    """One call of a session: what its prompt adds to the session's context so far."""

    session_id: str
    turn: int
    new_tokens: tuple[int, ...]
    """Appended after the previous call's prompt and output (the whole prompt on turn 0)."""
    max_tokens: int
    last: bool

    @property
    def request_id(self) -> str:
        return f"{self.session_id}-t{self.turn}"

    def extra_args(self) -> dict[str, Any]:
        """The metadata the gateway forwards in ``vllm_xargs``."""
        return {
            "session_id": self.session_id,
            "turn": self.turn,
            "follows_tool": self.turn > 0,
            "expects_tool": not self.last,
        }


def build_sessions(shape: QueueShape) -> list[list[CallSpec]]:
    """The queue's calls, session by session (deterministic for a seed)."""
    rng = random.Random(shape.seed)
    sessions = []
    for s in range(shape.sessions):
        calls = []
        for turn in range(shape.turns):
            span = shape.first_prompt if turn == 0 else shape.tool_result
            tokens = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randint(*span)))
            calls.append(
                CallSpec(
                    session_id=f"s{s:03d}",
                    turn=turn,
                    new_tokens=tokens,
                    max_tokens=rng.randint(*shape.output),
                    last=turn == shape.turns - 1,
                )
            )
        sessions.append(calls)
    return sessions


def synthetic_token(position: int) -> int:
    """The token "sampled" at a position of a context: the same on every run and for
    every scheduler, so both build the same next prompts."""
    return 1 + (position * 7919) % (VOCAB - 1)


@dataclass(frozen=True)
class SchedulerShape:
    """The engine the schedulers run for."""

    kv_blocks: int = 1024
    """KV blocks of ``block_size`` tokens (vLLM adds its null block)."""
    block_size: int = 16
    """vLLM's GPU default, where the plugin's cost matters (the CPU backend's is 128)."""
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    profile: str | None = None
    """A cost profile for the plugin (``AGENTMARS_PROFILE``), which policies that need
    costs must have; None: none (MARS then runs without its cost estimates)."""
    async_scheduler: bool = False
    """vLLM's ``AsyncScheduler`` (the GPU default) and the plugin's
    ``AgentmarsAsyncScheduler`` instead of the synchronous ones. Driven as the others,
    one step answered before the next is scheduled: no step is in flight meanwhile."""


@dataclass
class RunResult:
    """One scheduler's pass over the whole queue."""

    scheduler: str
    schedule_ns: list[int] = field(default_factory=list)
    update_ns: list[int] = field(default_factory=list)
    output_tokens: dict[str, int] = field(default_factory=dict)
    """Tokens each call generated, by request id."""
    preemptions: int = 0


@dataclass
class PrefixLookups:
    """The prefix-cache lookups over a run (``_get_local_prefix_cache_hit``, made for a
    waiting call each time vLLM's waiting loop reaches it: vLLM's own, or the plugin's
    ``prefix_lookup`` where it walks the hash map itself): a policy that keeps KV makes
    the hits longer, and each lookup walks every block of its hit. Counted in the
    unrecorded warm-up run only, so the timed runs carry no instrument."""

    lookups: int = 0
    hit_tokens: int = 0
    ns: int = 0

    def watch(self, scheduler: Any) -> None:
        """Count the scheduler's lookups from now on."""
        lookup = scheduler._get_local_prefix_cache_hit

        def counted(request: Any, *cap: int | None) -> Any:
            # vLLM 0.33 passes a cap on the hit (``max_cache_hit_length``), 0.32 none.
            started = time.perf_counter_ns()
            found = lookup(request, *cap)
            self.ns += time.perf_counter_ns() - started
            self.lookups += 1
            self.hit_tokens += found[1]
            return found

        scheduler._get_local_prefix_cache_hit = counted

    def figures(self, steps: int) -> dict[str, float]:
        return {
            "per_step": self.lookups / max(steps, 1),
            "hit_tokens_mean": self.hit_tokens / max(self.lookups, 1),
            "us_per_step": self.ns / 1000 / max(steps, 1),
        }


# --- the real vLLM scheduler (imports vLLM) ------------------------------------------


def plugin_environment(
    policy: str, hints_address: str, profile: str | None = None
) -> dict[str, str]:
    """The plugin's environment here: the policy, with the side channel agentmars serve
    gives it (Continuum needs its tool figures; nothing is sent on it), the cost
    profile if one is named (``--profile``: for policies that need costs), and no CPU
    tier."""
    env = {"AGENTMARS_POLICY": policy, "AGENTMARS_HINTS_ADDR": hints_address}
    if profile is not None:
        env["AGENTMARS_PROFILE"] = profile
    return env


@functools.cache
def _sockets() -> tempfile.TemporaryDirectory[str]:
    """A private folder for the plugin's socket, removed when the process exits."""
    return tempfile.TemporaryDirectory(prefix="agentmars-bench-")


def make_scheduler(name: str, model: Path, shape: SchedulerShape) -> Any:
    """Stock vLLM's ``Scheduler`` (``name == STOCK``) or the plugin's with policy
    ``name``, built as vLLM's own scheduler tests build theirs."""
    import torch  # type: ignore[import-not-found]
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # type: ignore[import-not-found]
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # type: ignore[import-not-found]
    from vllm.v1.core.sched.scheduler import Scheduler  # type: ignore[import-not-found]
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # type: ignore[import-not-found]
    from vllm.v1.structured_output import StructuredOutputManager  # type: ignore[import-not-found]

    model_config = ModelConfig(model=str(model), max_model_len=shape.max_model_len, seed=0)
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=shape.block_size, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=shape.max_num_seqs,
            max_num_batched_tokens=shape.max_num_batched_tokens,
            max_model_len=shape.max_model_len,
            is_encoder_decoder=False,
        ),
    )
    vllm_config.cache_config.num_gpu_blocks = shape.kv_blocks + 1  # + vLLM's null block
    spec = FullAttentionSpec(
        block_size=shape.block_size, num_kv_heads=1, head_size=64, dtype=torch.float32
    )
    kv_config = KVCacheConfig(
        num_blocks=shape.kv_blocks + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    if name == STOCK:
        cls: Any = AsyncScheduler if shape.async_scheduler else Scheduler
    else:
        # The plugin reads its policy from the engine's environment (plugin_config).
        os.environ.pop("AGENTMARS_PROFILE", None)
        os.environ.update(plugin_environment(name, f"ipc://{_sockets().name}/hints", shape.profile))
        from agentmars.server.engines.vllm import plugin

        cls = plugin.AgentmarsAsyncScheduler if shape.async_scheduler else plugin.AgentmarsScheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=shape.block_size,
        log_stats=False,
    )


class RequestFactory:
    """vLLM ``Request`` objects for the queue's calls, with the engine's block hasher
    (prefix caching needs each request's block hashes)."""

    def __init__(self, block_size: int) -> None:
        from vllm.utils.hashing import sha256  # type: ignore[import-not-found]
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # type: ignore[import-not-found]

        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(block_size, sha256)

    def make(self, call: CallSpec, context: Sequence[int]) -> Any:
        from vllm import SamplingParams  # type: ignore[import-not-found]
        from vllm.v1.request import Request  # type: ignore[import-not-found]

        params = SamplingParams(
            max_tokens=call.max_tokens, ignore_eos=True, extra_args=call.extra_args()
        )
        return Request(
            request_id=call.request_id,
            prompt_token_ids=[*context, *call.new_tokens],
            sampling_params=params,
            pooling_params=None,
            block_hasher=self._hasher,
        )


def synthetic_output(scheduler_output: Any, requests: dict[str, Any]) -> Any:
    """What the model runner would return for the step: one sampled token for each
    scheduled request whose prompt is now complete, none for a partial prefill."""
    from vllm.v1.outputs import ModelRunnerOutput  # type: ignore[import-not-found]

    ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = requests[request_id]
        done = request.num_computed_tokens >= request.num_tokens
        sampled.append([synthetic_token(request.num_tokens)] if done else [])
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={request_id: i for i, request_id in enumerate(ids)},
        sampled_token_ids=sampled,
    )


def drive(scheduler: Any, name: str, sessions: list[list[CallSpec]], block_size: int) -> RunResult:
    """Run the queue through the scheduler until every call has finished."""
    factory = RequestFactory(block_size)
    result = RunResult(scheduler=name)
    live: dict[str, Any] = {}
    next_turn = dict.fromkeys(range(len(sessions)), 0)
    contexts: dict[int, list[int]] = {s: [] for s in range(len(sessions))}
    session_of_request: dict[str, int] = {}

    def submit(s: int) -> None:
        call = sessions[s][next_turn[s]]
        request = factory.make(call, contexts[s])
        live[request.request_id] = request
        session_of_request[request.request_id] = s
        scheduler.add_request(request)

    for s in next_turn:
        submit(s)
    idle_since: float | None = None
    while live:
        started = time.perf_counter_ns()
        output = scheduler.schedule()
        result.schedule_ns.append(time.perf_counter_ns() - started)
        if output.total_num_scheduled_tokens:
            idle_since = None
        else:
            idle_since = idle_since or time.perf_counter()
            if time.perf_counter() - idle_since > MAX_IDLE_S:
                raise RuntimeError(f"{name}: {len(live)} calls left and none is scheduled")
            time.sleep(IDLE_WAIT_S)
        runner_output = synthetic_output(output, live)
        started = time.perf_counter_ns()
        scheduler.update_from_output(output, runner_output)
        result.update_ns.append(time.perf_counter_ns() - started)
        for request_id in [r for r, request in live.items() if request.is_finished()]:
            request = live.pop(request_id)
            result.output_tokens[request_id] = request.num_output_tokens
            result.preemptions += request.num_preemptions
            s = session_of_request.pop(request_id)
            contexts[s] = list(request.all_token_ids)
            next_turn[s] += 1
            if next_turn[s] < len(sessions[s]):
                submit(s)
            elif name != STOCK:
                # As the gateway says when an agent is done: the plugin drops the
                # session's pin (a policy that pins every session until it ends, as
                # ThunderAgent does, would otherwise hold the KV of ended ones).
                scheduler.take_event(SessionEnd(session_id=sessions[s][0].session_id))
    scheduler.shutdown()
    return result


# --- the comparison -----------------------------------------------------------------


def drive_without_gc(
    scheduler: Any, name: str, sessions: list[list[CallSpec]], engine: SchedulerShape
) -> RunResult:
    """``drive`` with garbage collection off: a collection in the middle of one run
    would land on one scheduler only."""
    gc.collect()
    gc.disable()
    try:
        return drive(scheduler, name, sessions, engine.block_size)
    finally:
        gc.enable()


def _summary(samples_ns: list[int]) -> dict[str, float]:
    return {
        "p50_us": statistics.median(samples_ns) / 1000,
        "mean_us": statistics.fmean(samples_ns) / 1000,
        "calls": len(samples_ns),
    }


def _rounds(names: Sequence[str], reps: int) -> Iterator[str]:
    """Alternate the schedulers, rotating the order each repetition, so drift of the
    machine falls on all of them alike."""
    for rep in range(reps):
        shift = rep % len(names)
        yield from [*names[shift:], *names[:shift]]


def check_fits(queue: QueueShape, engine: SchedulerShape) -> None:
    """A session's longest context must fit the KV blocks, or its last call never runs."""
    if queue.max_context > engine.kv_blocks * engine.block_size:
        raise ValueError(
            f"a session's context can reach {queue.max_context} tokens, more than "
            f"{engine.kv_blocks} KV blocks hold: give more blocks or fewer turns"
        )


def compare(
    model: Path,
    queue: QueueShape,
    engine: SchedulerShape,
    reps: int,
    progress: Callable[[str], None] = lambda line: None,
    policies: Sequence[str] = PLUGIN_POLICIES,
) -> dict[str, Any]:
    """Run stock vLLM and the plugin (each policy) over the same queue ``reps`` times
    each, alternating, on one core (``one_core``); per scheduler the pooled per-call
    figures and the ratios."""
    check_fits(queue, engine)
    with one_core():
        return _compare(model, queue, engine, reps, progress, policies)


@contextlib.contextmanager
def one_core() -> Iterator[int]:
    """This process on one of the cores it may use (the last), for the duration: a
    step the kernel moves to another core starts with its caches cold (ours: on the
    2-core host of 2026-12-01, MARS's ratio over runs of 20 spread 1.100-1.140 in five
    unpinned, 1.094-1.115 in four pinned; FCFS's 1.034-1.060 and 1.028-1.038)."""
    allowed = os.sched_getaffinity(0)
    core = max(allowed)
    os.sched_setaffinity(0, {core})
    try:
        yield core
    finally:
        os.sched_setaffinity(0, allowed)


def _compare(
    model: Path,
    queue: QueueShape,
    engine: SchedulerShape,
    reps: int,
    progress: Callable[[str], None],
    policies: Sequence[str],
) -> dict[str, Any]:
    sessions = build_sessions(queue)
    names = [STOCK, *policies]
    pooled: dict[str, dict[str, list[int]]] = {n: {"schedule": [], "update": []} for n in names}
    run_means: dict[str, list[float]] = {n: [] for n in names}
    tokens: dict[str, dict[str, int]] = {}
    preemptions: dict[str, int] = {}
    lookups: dict[str, dict[str, float]] = {}
    for name in names:
        # Unrecorded: the first run of each warms its code paths and the allocator,
        # and counts vLLM's prefix lookups (the runs are deterministic: the timed ones
        # make the same).
        scheduler, counter = make_scheduler(name, model, engine), PrefixLookups()
        counter.watch(scheduler)
        warm = drive(scheduler, name, sessions, engine.block_size)
        lookups[name] = counter.figures(len(warm.schedule_ns))
    for name in _rounds(names, reps):
        result = drive_without_gc(make_scheduler(name, model, engine), name, sessions, engine)
        pooled[name]["schedule"] += result.schedule_ns
        run_means[name].append(statistics.fmean(result.schedule_ns))
        pooled[name]["update"] += result.update_ns
        tokens[name] = result.output_tokens
        preemptions[name] = result.preemptions
        progress(f"{name}: {len(result.schedule_ns)} steps")
    return _report(queue, engine, reps, pooled, run_means, tokens, preemptions, lookups)


def _report(
    queue: QueueShape,
    engine: SchedulerShape,
    reps: int,
    pooled: dict[str, dict[str, list[int]]],
    run_means: dict[str, list[float]],
    tokens: dict[str, dict[str, int]],
    preemptions: dict[str, int],
    lookups: dict[str, dict[str, float]],
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        name: {
            "schedule": _summary(samples["schedule"]),
            "update_from_output": _summary(samples["update"]),
            "steps_per_run": len(samples["schedule"]) // reps,
            "schedule_ms_per_run": sum(samples["schedule"]) / reps / 1e6,
            "preemptions_per_run": preemptions[name],
            "calls_finished": len(tokens[name]),
            "output_tokens": sum(tokens[name].values()),
            "prefix_lookups": lookups[name],
        }
        for name, samples in pooled.items()
    }
    stock = figures[STOCK]["schedule"]
    ratios = {
        policy: {
            "p50": figures[policy]["schedule"]["p50_us"] / stock["p50_us"],
            "mean": figures[policy]["schedule"]["mean_us"] / stock["mean_us"],
            # A policy changes the steps too (continuum's pins hold KV): the whole
            # run's schedule() time, beside the per-call cost.
            "per_run": figures[policy]["schedule_ms_per_run"]
            / figures[STOCK]["schedule_ms_per_run"],
            # Each repetition runs every scheduler back to back: the median of the
            # repetitions' ratios of the mean is what a burst of other load on the
            # machine moves least (pooled means of the same code moved by +-10%
            # between runs on a shared 2-core machine).
            "paired": statistics.median(
                mean / stock_mean
                for mean, stock_mean in zip(run_means[policy], run_means[STOCK], strict=True)
            ),
        }
        for policy in pooled
        if policy != STOCK
    }
    return {
        "queue": asdict(queue),
        "engine": asdict(engine),
        "reps": reps,
        "schedulers": figures,
        "schedule_ratio_to_stock": ratios,
        "same_tokens": all(tokens[name] == tokens[STOCK] for name in tokens),
        "python": sys.version.split()[0],
    }


# --- instruction counts (run under callgrind) -----------------------------------------

NATIVE_STEP_S = 0.0008
"""What the virtual clock advances at each ``schedule()`` when instructions are
counted: about a native step of this queue. Under callgrind a step takes fifty times
as long, and decisions that read the clock (MARS's promotion by waiting time, the
pins' review) would differ from a native run's and from one scheduler to another."""


class VirtualClock:
    """``time.time`` and ``time.monotonic`` made to move only when ``advance`` is
    called: the runs whose instructions are counted are then the same, step for step,
    whatever the machine's load or valgrind's slowdown."""

    def __init__(self, start_s: float = 1_000_000.0) -> None:
        self.now_s = start_s
        time.time = self.read
        time.monotonic = self.read

    def read(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def count(
    model: Path,
    queue: QueueShape,
    engine: SchedulerShape,
    toggle_lib: Path,
    policies: Sequence[str] = PLUGIN_POLICIES,
) -> dict[str, Any]:
    """Stock vLLM and the plugin with each policy, one after the other in this process,
    with callgrind collecting inside their ``schedule()`` calls only: ``toggle_lib``'s
    ``agentmars_toggle_collect`` (a callgrind client request, nothing outside valgrind)
    turns collection on as a call starts and off as it returns, and
    ``agentmars_dump_stats`` writes what each scheduler's pass collected to a dump named
    after it. Before its counted pass each scheduler runs the queue once uncollected,
    to warm its code paths as the timed comparison does. Instrumentation starts with
    the first counted pass (``agentmars_start_instrumentation``; valgrind starts with
    ``--instr-atstart=no``): vLLM's import, instrumented, took minutes. Per scheduler
    its steps, preemptions and the tokens each call generated."""
    import ctypes

    check_fits(queue, engine)
    library = ctypes.CDLL(str(toggle_lib))
    start_instrumentation = library.agentmars_start_instrumentation
    toggle, dump = library.agentmars_toggle_collect, library.agentmars_dump_stats
    clock = VirtualClock()
    sessions = build_sessions(queue)
    runs = {}
    for name in (STOCK, *policies):
        drive(make_scheduler(name, model, engine), name, sessions, engine.block_size)
        scheduler = make_scheduler(name, model, engine)
        schedule = scheduler.schedule

        def collected(schedule: Callable[[], Any] = schedule) -> Any:
            clock.advance(NATIVE_STEP_S)
            toggle()
            try:
                return schedule()
            finally:
                toggle()

        scheduler.schedule = collected
        start_instrumentation()  # once: a stop and a start lose what the next dump counts
        result = drive_without_gc(scheduler, name, sessions, engine)
        dump(name.encode())
        runs[name] = {
            "steps": len(result.schedule_ns),
            "preemptions": result.preemptions,
            "output_tokens": result.output_tokens,
        }
    return runs


def decisions(
    model: Path,
    queue: QueueShape,
    engine: SchedulerShape,
    policies: Sequence[str] = PLUGIN_POLICIES,
) -> dict[str, list[list[Any]]]:
    """Stock vLLM's and the plugin's decisions with each policy, step by step, over the
    queue: at each ``schedule()`` the calls scheduled with their tokens, and the calls
    preempted. Each scheduler runs on a virtual clock of its own that advances
    ``NATIVE_STEP_S`` a step, so its decisions depend on the queue and the code only,
    not on the machine: two vLLM versions that decide alike give equal records
    (``tests/server/engines/vllm/test_vllm033.py`` compares 0.32's with 0.33's). The
    clock replaces ``time.time`` and ``time.monotonic`` for good, as in ``count``: run
    it in a process of its own."""
    check_fits(queue, engine)
    sessions = build_sessions(queue)
    runs: dict[str, list[list[Any]]] = {}
    for name in (STOCK, *policies):
        clock = VirtualClock()  # before the scheduler, which reads the clock as it starts
        scheduler = make_scheduler(name, model, engine)
        steps: list[list[Any]] = []

        def recorded(
            schedule: Callable[[], Any] = scheduler.schedule,
            clock: VirtualClock = clock,
            steps: list[list[Any]] = steps,
        ) -> Any:
            clock.advance(NATIVE_STEP_S)
            output = schedule()
            scheduled = sorted(output.num_scheduled_tokens.items())
            steps.append([scheduled, sorted(output.preempted_req_ids or ())])
            return output

        scheduler.schedule = recorded
        drive(scheduler, name, sessions, engine.block_size)
        runs[name] = steps
    return runs


def policy_list(text: str, profile: str | None = None) -> tuple[str, ...]:
    """``--policies``: registered names, each once, that the plugin runs as
    ``make_scheduler`` configures it, with cost ``profile`` (ValueError: which is not,
    and why)."""
    from agentmars.server.engines.vllm.plugin_config import PluginConfig
    from agentmars.server.policies.registry import policy_class

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ValueError("--policies names no policy")
    if len(set(names)) < len(names):
        raise ValueError(f"--policies names a policy twice: {text}")
    for name in names:
        if name == STOCK:
            raise ValueError(f"--policies: {STOCK!r} is stock vLLM, which always runs")
        policy_class(name)  # UnknownPolicy is a ValueError
        # Refused: PluginConfigError, a ValueError. The address is only named, not bound.
        config = PluginConfig.from_env(plugin_environment(name, "ipc://bench-schedule", profile))
        config.make_engine_half()
        config.costs()  # a profile that does not load
    return names


def main(argv: list[str] | None = None) -> int:
    """CLI: run the comparison and write its figures as JSON."""
    from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

    parser = argparse.ArgumentParser(
        prog="python -m agentmars.server.engines.vllm.bench_schedule",
        description="schedule() cost of the agentmars plugin against stock vLLM.",
    )
    parser.add_argument("--json", type=Path, help="write the figures here (default: stdout)")
    parser.add_argument("--sessions", type=int, default=QueueShape.sessions)
    parser.add_argument("--turns", type=int, default=QueueShape.turns)
    parser.add_argument("--reps", type=int, default=10, help="runs of each scheduler")
    parser.add_argument("--kv-blocks", type=int, default=SchedulerShape.kv_blocks)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--policies",
        default=",".join(PLUGIN_POLICIES),
        help="the plugin's policies, comma-separated (stock vLLM always runs)",
    )
    parser.add_argument(
        "--profile",
        help="a cost profile for the plugin (a registered name or a JSON file), which "
        "policies that need costs must have",
    )
    parser.add_argument(
        "--count-with",
        type=Path,
        metavar="TOGGLE_LIB",
        help="run each scheduler once for callgrind, with this library's client requests "
        "(count; agentmars bench plugin --instructions runs it under valgrind)",
    )
    args = parser.parse_args(argv)
    if args.count_with is not None and not args.count_with.is_file():
        parser.error(f"--count-with: no library at {args.count_with}")
    try:
        queue = QueueShape(sessions=args.sessions, turns=args.turns, seed=args.seed)
        engine = SchedulerShape(kv_blocks=args.kv_blocks, profile=args.profile)
        if args.reps < 1:
            raise ValueError("--reps must be at least 1")
        policies = policy_list(args.policies, args.profile)
    except ValueError as error:
        parser.error(str(error))
    try:
        if args.count_with is not None:
            figures = count(ensure_tiny_model(), queue, engine, args.count_with, policies)
        else:
            figures = compare(
                ensure_tiny_model(),
                queue,
                engine,
                args.reps,
                lambda line: print(line, file=sys.stderr),
                policies,
            )
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    text = json.dumps(figures, indent=2) + "\n"
    if args.json is None:
        sys.stdout.write(text)
    else:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
