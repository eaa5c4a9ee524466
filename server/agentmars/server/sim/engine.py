"""The simulated engine: a discrete-event model of one vLLM V1 engine serving agent
sessions whose tools run on the host's CPUs, in virtual time.

A heap of events ordered by an explicit key (time, rank, sequence): at one instant,
an engine step ends before anything else is handled, and the next step starts only
after everything else of that instant (so a step sees every arrival of its start
time). Handlers change the entities and push the events that follow.

A session's life: it arrives and waits at the gateway until the policy admits it
(``Policy.admit``); each turn's call joins the engine's waiting queue; the scheduler
(``sim.scheduler``) runs it in steps whose duration the cost model gives; when the
call has produced its tokens, the policy decides what happens to its KV, and the
session runs its tool on the host CPUs (``sim.host_cpu``); when the tool ends, the
next turn's call is sent. The session ends with its last call.

The policy runs in its two halves as on the real stack (docs/policies.md): the
admission half decides at the simulated gateway from what the stream tells it, with
the engine's KV figures sampled every ``kv_stats_interval_s`` (``kv_stats`` events, as
the vLLM plugin publishes them), and the engine half decides inside the engine. Every
boundary is an event of the unified information stream (``agentmars.sdk.events``,
source ``sim``, times in virtual nanoseconds) handed to both halves, the same kinds
the real stack emits (session, LLM and tool boundaries, ``tool_stats``, ``kv_stats``,
``session_pause`` / ``session_resume``), and so are the events either half publishes
(e.g. ``window_update``). They arrive at the instant they are made: the real stack's
few milliseconds of side-channel delay are not modelled, except for the KV figures'
sampling.

Decode-only stretches are simulated in one jump: while no call waits, no prompt is
being computed and no event falls inside, the steps until the first call finishes (or
the next event, or the KV runs short) change nothing but counters, so they are
summed instead of taken one by one. The blocks those steps need are allocated at the
start of the jump (ours: a block is taken up to one jump early; the count is exact).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from agentmars.sdk.events import (
    AnyEvent,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    ToolStats,
)
from agentmars.server.metrics.records import (
    CallRecord,
    KVSample,
    RunRecord,
    SessionRecord,
    ToolRecord,
)
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.capabilities import Capability, PolicyRefused, refuse_unless
from agentmars.server.policies.interface import Policy, SessionAction
from agentmars.server.policies.tool_activity import FollowsTools, ToolActivity
from agentmars.server.profiles.cost_model import CostModel, Profile, StepShape
from agentmars.server.sim.engine_core import KVEngineView, partition_time
from agentmars.server.sim.entities import Call, Session
from agentmars.server.sim.entities import Pin as PinEntity
from agentmars.server.sim.host_cpu import HostCPU
from agentmars.server.sim.kv_cache import KVCache
from agentmars.server.sim.scheduler import Scheduler, Step
from agentmars.server.workloads.model import SessionSpec, Workload

logger = logging.getLogger(__name__)


class SimError(ValueError):
    """The workload or the configuration cannot run on this engine."""


@dataclass(frozen=True)
class SimConfig:
    """The engine and host being simulated; None takes the profile's value."""

    tool_cores: int = 16
    """Host cores for tools (ours: one GPU's share of an 8-GPU server's cores, DGX A100
    128/8 = 16, DGX H100 112/8 = 14; seed 000 does not publish its split of its 2 x
    32-core EPYC 9355). At 16, ILR-1..4 keep 8-17% of them busy at 0.25 sessions/s and
    ``ilr-2-cpu`` about 80% (docs/workloads.md, "CPU pressure")."""
    tool_slots: int | None = None
    """At most this many tools at once, the rest queue (None: no limit)."""
    cpu_tier: bool | None = None
    """Simulate the CPU KV tier (None: when the policy needs it)."""
    num_gpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    decode_jumps: bool = True
    """Take decode-only stretches in one jump (off: step by step). Same results, except
    that a jump's blocks are taken, and evictions dated, at its start."""
    kv_sample_interval_s: float = 1.0
    """How often the run's record samples the KV cache."""
    kv_stats_interval_s: float = 0.1
    """How often the engine's ``kv_stats`` reach the admission half (the vLLM plugin's
    side channel publishes at 10 Hz)."""
    max_virtual_s: float = 30 * 24 * 3600.0
    """Stop with an error past this virtual time (a policy that never finishes)."""


class _Rank(IntEnum):
    STEP_END = 0
    PREFILL_END = 0
    TOOL_DONE = 1
    CALL_SUBMIT = 2
    SESSION_ARRIVAL = 3
    PIN_EXPIRY = 4
    TICK = 5
    KV_STATS = 6
    ADMISSION_PASS = 7
    STEP_START = 9


@dataclass(order=True)
class _Event:
    time: float
    rank: int
    seq: int
    handler: Callable[[Any], None] = field(compare=False)
    arg: Any = field(compare=False, default=None)


class SimEngine(KVEngineView, FollowsTools):
    """Runs one workload under one policy; it is also the engine half's ``EngineView``."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        profile: Profile,
        config: SimConfig | None = None,
        *,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.workload = workload
        self.policy = policy
        self.profile = profile
        self.config = config or SimConfig()
        self.cost = CostModel(profile)
        self._on_progress = on_progress
        self.now = 0.0
        self.admission = policy.admission()
        self.engine_half = engine_half = policy.engine()
        cpu_tier = self.config.cpu_tier
        if cpu_tier is None:
            cpu_tier = Capability.CPU_TIER in engine_half.needs | engine_half.uses
        cpu_tier = cpu_tier and profile.cpu_kv_blocks > 0
        provides = set(Capability) - (set() if cpu_tier else {Capability.CPU_TIER})
        if not profile.sm_share_curves:
            provides.discard(Capability.SM_PARTITION)
        try:
            refuse_unless(policy.name, engine_half.needs, provides, "the simulated engine")
            refuse_unless(policy.name, self.admission.needs, provides, "the simulated gateway")
        except PolicyRefused as error:
            raise SimError(str(error)) from None
        self.admission.publish = engine_half.publish = self._emit
        self.partitioned = Capability.SM_PARTITION in provides and (
            Capability.SM_PARTITION in engine_half.needs | engine_half.uses
        )
        """Steps run in the half's SM partition (``decode_sm_share``), prefills and
        decodes at the same time (docs/simulator.md "The SM partition")."""
        if Capability.SM_PARTITION in engine_half.uses and not self.partitioned:
            logger.info(
                "policy %s: profile %s has no SM-share curves; its decode SM share is "
                "ignored (one shared step, no partition)",
                policy.name,
                profile.name,
            )
        self._prefill_busy = False
        """The prefill partition computes a chunk (until its ``_on_prefill_end``)."""
        num_blocks = self.config.num_gpu_blocks or profile.num_gpu_blocks
        self._check_fits(workload, min(profile.max_model_len, num_blocks * profile.block_size))
        self.kv = KVCache(
            num_blocks,
            profile.block_size,
            profile.cpu_kv_blocks if cpu_tier else 0,
            self._count_eviction,
            offload_evicted=engine_half.offload_evicted,
            transfer_time=self.cost.transfer_time,
            watch=self,
        )
        self.host = HostCPU(self.config.tool_cores, self.config.tool_slots)
        self.tools = ToolActivity()
        self.admission_view = StreamAdmissionView(
            clock=lambda: self.now,
            block_size=profile.block_size,
            tool_cores=self.config.tool_cores,
            active_sessions=lambda: len(self._sessions),
        )
        self.scheduler = Scheduler(
            self.kv,
            engine_half,
            self,
            max_num_seqs=self.config.max_num_seqs or profile.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens
            or profile.max_num_batched_tokens,
            load_done_at=self._load_done_at,
        )
        self._heap: list[_Event] = []
        self._seq = itertools.count()
        self._call_ids = itertools.count()
        self._stepping = False
        self._start_pending = False
        self._gateway: list[Session] = []
        self._sessions: dict[str, Session] = {}
        self._pending_specs = list(workload.sessions)
        self._tools: dict[str, tuple[Session, ToolRecord]] = {}
        self._tool_version = 0
        self._kv_published: tuple[int, int, int] | None = None
        self._kv_stats_pending = False
        self._pass_pending = False
        self._channel_free_s = 0.0
        self._pinned_since = 0.0
        self._next_sample_s = 0.0
        self.record = RunRecord(
            workload=workload.name,
            policy=policy.name,
            engine=f"sim:{profile.name}",
            seed=workload.seed,
            sessions=[],
            duration_s=0.0,
            total_blocks=self.kv.pool.num_blocks,
            block_size=profile.block_size,
            tool_cores=self.config.tool_cores,
        )

    @staticmethod
    def _check_fits(workload: Workload, limit: int) -> None:
        """Every call must fit the context limit and the whole KV cache (vLLM refuses
        to start with a context limit the cache cannot hold)."""
        too_long = [s.session_id for s in workload.sessions if s.final_context > limit]
        if too_long:
            raise SimError(
                f"{len(too_long)} sessions exceed the engine's context limit ({limit} tokens: "
                f"the profile's max_model_len or the KV cache, whichever is smaller), "
                f"e.g. {too_long[0]!r}; build the workload with max_context set to it"
            )

    # --- EngineView (the rest is KVEngineView's) ------------------------------------------

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    @property
    def tool_cores(self) -> int:
        return self.host.cores

    # --- the event loop ------------------------------------------------------------------

    def run(self) -> RunRecord:
        """Simulate until every session has ended; return what happened."""
        self._schedule_arrivals()
        self._publish_kv_stats(None)
        if self.engine_half.tick_interval_s:
            self._push(self.engine_half.tick_interval_s, _Rank.TICK, self._on_tick)
        while self._heap:
            event = heapq.heappop(self._heap)
            if event.time > self.config.max_virtual_s:
                raise SimError(
                    f"virtual time passed {self.config.max_virtual_s} s: the run does not end"
                )
            self._advance_to(event.time)
            event.handler(event.arg)
            self._plan_kv_stats()
        self._finish_record()
        return self.record

    def _push(
        self, time: float, rank: _Rank, handler: Callable[[Any], None], arg: Any = None
    ) -> None:
        heapq.heappush(self._heap, _Event(time, rank, next(self._seq), handler, arg))

    def _advance_to(self, time: float) -> None:
        self.record.pinned_block_s += self.kv.pinned_blocks * (time - self._pinned_since)
        self._pinned_since = time
        self.now = time

    def _emit(self, event: AnyEvent) -> None:
        """Hand an event of the stream to both halves (and to what the views follow)."""
        self.tools.observe(event)
        self.admission_view.observe(event)
        self.engine_half.on_event(event)
        self.admission.on_event(event)

    def stamp(self) -> dict[str, Any]:
        ns = round(self.now * 1e9)
        return {"mono_ns": ns, "wall_ns": ns, "source": "sim"}

    # --- sessions ----------------------------------------------------------------------

    def _schedule_arrivals(self) -> None:
        if self.workload.arrival == "closed":
            assert self.workload.concurrency is not None
            for _ in range(min(self.workload.concurrency, len(self._pending_specs))):
                self._push(
                    0.0, _Rank.SESSION_ARRIVAL, self._on_session_arrival, self._pending_specs.pop(0)
                )
        else:
            for spec in self._pending_specs:
                self._push(spec.arrival_s, _Rank.SESSION_ARRIVAL, self._on_session_arrival, spec)
            self._pending_specs = []

    def _on_session_arrival(self, spec: SessionSpec) -> None:
        record = SessionRecord(
            spec.session_id, spec.agent, self.now, self.now, self.now, task_id=spec.task_id
        )
        session = Session(spec, self.now, record)
        self.kv.register(session)
        self._gateway.append(session)
        self._admit_sessions()

    def _admit_sessions(self) -> None:
        if not self._gateway:
            return
        for session in list(self.admission.admit(self._gateway, self.admission_view)):
            assert isinstance(session, Session)
            self._gateway.remove(session)
            self._sessions[session.session_id] = session
            session.record.admitted_s = self.now
            # The agent instance travels as the SDK sends it (VTC's client, seed 004).
            task = session.spec.task_id
            metadata = {"task_id": task} if task else {}
            self._emit(
                SessionStart(
                    session_id=session.session_id,
                    agent=session.agent,
                    metadata=metadata,
                    **self.stamp(),
                )
            )
            self._send_call(session)
        self._plan_admission_pass()

    def _send_call(self, session: Session) -> None:
        spec = session.spec
        turn = spec.turns[session.turn]
        call = Call(
            call_id=f"{session.session_id}/{session.turn}",
            session=session,
            turn=session.turn,
            arrival_s=self.now,
            prompt_tokens=spec.prompt_tokens(session.turn),
            max_tokens=turn.output_tokens,
            follows_tool=session.turn > 0,
            expects_tool=turn.tool is not None,
            next_tool=turn.tool.kind if turn.tool is not None else None,
            expected_tool_s=turn.tool.wall_s if turn.tool is not None else None,
            record=CallRecord(
                session.turn, self.now, self.now, self.now, spec.prompt_tokens(session.turn), 0
            ),
        )
        if session.paused:
            session.held.append(call)
            return
        self._submit(call)

    def _submit(self, call: Call) -> None:
        call.arrival_s = call.record.submit_s = self.now
        self._emit(
            LLMSubmit(
                session_id=call.session_id,
                call_id=call.call_id,
                turn=call.turn,
                projected_prompt_tokens=call.prompt_tokens,
                projected_kv_blocks=self.kv.blocks_for(call.prompt_tokens + call.max_tokens),
                max_tokens=call.max_tokens,
                follows_tool=call.follows_tool,
                expects_tool=call.expects_tool,
                **self.stamp(),
            )
        )
        overhead = self.profile.request_overhead_s
        if overhead > 0:
            self._push(self.now + overhead, _Rank.CALL_SUBMIT, self._enqueue, call)
        else:
            self._enqueue(call)

    def _enqueue(self, call: Call) -> None:
        """The call reaches the scheduler (after the profile's request overhead)."""
        self.scheduler.waiting.append(call)
        self._wake()

    def _end_session(self, session: Session) -> None:
        del self._sessions[session.session_id]
        self.kv.unpin(session.session_id, "session_end")
        self.kv.release_swapped(session.session_id)
        session.record.end_s = self.now
        self.record.sessions.append(session.record)
        self._emit(
            SessionEnd(
                session_id=session.session_id,
                turns=len(session.spec.turns),
                duration_s=session.record.latency_s,
                **self.stamp(),
            )
        )
        if self._on_progress is not None:
            self._on_progress(len(self.record.sessions))
        if self._pending_specs:
            self._push(
                self.now,
                _Rank.SESSION_ARRIVAL,
                self._on_session_arrival,
                self._pending_specs.pop(0),
            )
        self._admit_sessions()

    # --- engine steps ------------------------------------------------------------------

    def _wake(self) -> None:
        """Start a step at this instant (after its other events) if the engine idles."""
        if not self._stepping and not self._start_pending:
            self._start_pending = True
            self._push(self.now, _Rank.STEP_START, self._on_step_start)

    def _on_step_start(self, _: None) -> None:
        self._start_pending = False
        if self.engine_half.tick_interval_s == 0:
            self._apply(self.engine_half.tick(self))
        share = self._decode_share()
        if share is not None:
            self._start_partitioned(share)
            return
        jump = self._decode_jump()
        if jump is not None:
            self._stepping = True
            self._push(jump[1], _Rank.STEP_END, self._on_jump_end, (jump[0], jump[1] - self.now))
            return
        step = self.scheduler.schedule(self.now)
        if not step.batch:
            self._wait_for_loads()
            return
        self._stepping = True
        duration = self.step_duration(step, self.now)
        self._push(self.now + duration, _Rank.STEP_END, self._on_step_end, (step, duration))

    # --- the SM partition ---------------------------------------------------------------

    def _decode_share(self) -> float | None:
        """The half's decode SM share for this step, in [0, 1] (None: no partition)."""
        if not self.partitioned:
            return None
        share = self.engine_half.decode_sm_share(self)
        return None if share is None else min(max(float(share), 0.0), 1.0)

    def _start_partitioned(self, share: float) -> None:
        """A step in an SM partition: the decodes (and the prefills the half runs with
        them) on ``share`` of the SMs, the other prefills on the rest, each side at its
        own pace. The decode side steps as the engine does; the prefill side computes
        one chunk at a time, and its calls sit out the decode side's steps until it is
        done. A side with no SMs runs nothing."""
        half = self.engine_half
        lanes: dict[Call, bool] = {}

        def with_decodes(call: Call) -> bool:
            # Decided once per call and step, before its admission (what the half
            # predicts of a waiting call), so that the call runs where it was let in.
            if call not in lanes:
                lanes[call] = call.decoding or half.runs_with_decodes(call, self)
            return lanes[call]

        prefill_open = share < 1.0 and not self._prefill_busy
        decode_open = share > 0.0
        if not (prefill_open and decode_open):
            self.scheduler.blocked = lambda call: (
                not (decode_open if with_decodes(call) else prefill_open)
            )
        jump = self._decode_jump(share) if decode_open else None
        if jump is not None:
            self.scheduler.blocked = None
            self._stepping = True
            self._push(jump[1], _Rank.STEP_END, self._on_jump_end, (jump[0], jump[1] - self.now))
            return
        try:
            step = self.scheduler.schedule(self.now)
        finally:
            self.scheduler.blocked = None
        decode_step, prefill_step = step.split(with_decodes)
        swap_wait = max(step.swapped_out_s - self.now, 0.0)
        if prefill_step.batch:
            duration = partition_time(self.cost, self.profile, prefill_step.batch, 1.0 - share)
            duration += swap_wait
            for call, _ in prefill_step.batch:
                call.ready_s = self.now + duration
            self._prefill_busy = True
            end = (prefill_step, duration)
            self._push(self.now + duration, _Rank.PREFILL_END, self._on_prefill_end, end)
        if decode_step.batch:
            duration = partition_time(self.cost, self.profile, decode_step.batch, share)
            duration += swap_wait
            self._stepping = True
            end = (decode_step, duration)
            self._push(self.now + duration, _Rank.STEP_END, self._on_step_end, end)
        elif not prefill_step.batch:
            self._wait_for_loads()

    def _on_prefill_end(self, arg: tuple[Step, float]) -> None:
        step, duration = arg
        self._prefill_busy = False
        self.record.steps += 1
        self.record.computed_tokens += sum(tokens for call, tokens in step.batch if call.blocks)
        # A call preempted meanwhile lost its blocks (``settle`` skips it).
        for call in self.settle(step, duration).produced:
            self._add_token(call, 1)
        self._after_step()

    def _wait_for_loads(self) -> None:
        """Nothing could run: wake up when the first CPU-tier load is done."""
        loading = [call.ready_s for call in self.scheduler.running if call.ready_s > self.now]
        if loading:
            self._push(min(loading), _Rank.STEP_START, self._on_step_start)
            self._start_pending = True

    def _on_step_end(self, arg: tuple[Step, float]) -> None:
        step, duration = arg
        self._stepping = False
        self.record.steps += 1
        self.record.computed_tokens += sum(tokens for call, tokens in step.batch if call.blocks)
        for call in self.settle(step, duration).produced:
            self._add_token(call, 1)
        self._after_step()

    def _after_step(self) -> None:
        self._sample_kv()
        if self.scheduler.running or self.scheduler.waiting:
            self._wake()

    def _add_token(self, call: Call, tokens: int) -> None:
        if call.output_tokens == 0:
            call.record.first_token_s = self.now
            self._emit(
                LLMFirstToken(
                    session_id=call.session_id,
                    call_id=call.call_id,
                    turn=call.turn,
                    ttft_s=self.now - call.arrival_s,
                    **self.stamp(),
                )
            )
        call.output_tokens += tokens
        if call.finished:
            self._finish_call(call)

    # --- decode jumps ------------------------------------------------------------------

    def _decode_jump(self, share: float | None = None) -> tuple[int, float] | None:
        """(steps, end time) of a stretch of at least two decode-only steps that can be
        taken at once, or None; with ``share``, on that share of the SMs."""
        running = self.scheduler.running
        if (
            not self.config.decode_jumps
            # A half that ticks at every step may act at any of them (InferCept swaps a
            # budget per step): its steps are taken one by one.
            or self.engine_half.tick_interval_s == 0
            or self.scheduler.waiting
            or not running
            or len(running) > self.scheduler.budget
            or any(
                c.ready_s > self.now
                or c.output_tokens == 0
                or c.num_computed_tokens != c.num_tokens - 1
                for c in running
            )
        ):
            return None
        steps = min(c.max_tokens - c.output_tokens for c in running)
        steps = min(steps, self._steps_that_fit(running, steps))
        next_event = self._heap[0].time if self._heap else float("inf")
        seqs = len(running)
        context = sum(c.num_tokens for c in running)
        # NOTE: the end time is summed step by step from the very shape stepping would
        # build (``Step.shape``: the batch's summed context grows by ``seqs`` a step), so
        # that both order the same events the same way to the last bit.
        end = self.now
        taken = 0
        while taken < steps and end < next_event:
            shape = StepShape(decode_seqs=seqs, decode_context=context + taken * seqs)
            if share is None:
                end += self.cost.step_time(shape)
            else:
                end += self.cost.step_time(shape) / self.profile.sm_throughput("decode", share)
            taken += 1
        if taken < 2:
            return None
        for call in running:
            grown = self.kv.grow(call, taken)
            assert grown
        return taken, end

    def _steps_that_fit(self, running: Sequence[Call], limit: int) -> int:
        """The most decode steps (up to ``limit``) whose new blocks are free now."""
        free = self.kv.pool.num_free
        low, high = 0, limit
        while low < high:
            mid = (low + high + 1) // 2
            needed = sum(
                max(self.kv.blocks_for(c.num_computed_tokens + mid) - len(c.blocks), 0)
                for c in running
            )
            if needed <= free:
                low = mid
            else:
                high = mid - 1
        return low

    def _on_jump_end(self, jump: tuple[int, float]) -> None:
        steps, duration = jump
        self._stepping = False
        self.record.steps += steps
        self.decode_steps += steps
        self.decode_time_s += duration
        for call in list(self.scheduler.running):
            call.num_computed_tokens += steps
            call.service_s += duration
            self.record.computed_tokens += steps
            self.kv.cache_full_blocks(call)
            self._add_token(call, steps)
        self._after_step()

    # --- finished calls, KV decisions and tools -----------------------------------------

    def _finish_call(self, call: Call) -> None:
        session = call.session
        self.scheduler.running.remove(call)
        call.record.end_s = self.now
        call.record.output_tokens = call.output_tokens
        session.record.calls.append(call.record)
        last = session.turn == len(session.spec.turns) - 1
        decision = self.engine_half.on_call_finished(call, self) if not last else None
        freed = len(call.blocks)
        pin = self.keep_or_free(call, decision, self.now)
        if pin is not None:
            freed -= pin.blocks
            if pin.expires_s is not None:
                self._push(pin.expires_s, _Rank.PIN_EXPIRY, self._on_pin_expiry, pin)
        self._emit(
            LLMEnd(
                session_id=call.session_id,
                call_id=call.call_id,
                turn=call.turn,
                prompt_tokens=call.prompt_tokens,
                cached_tokens=call.record.cached_tokens,
                output_tokens=call.output_tokens,
                freed_blocks=freed,
                ended_in_tool_call=not last,
                duration_s=self.now - call.arrival_s,
                **self.stamp(),
            )
        )
        if last:
            self._end_session(session)
        else:
            self._start_tool(session)

    def _start_tool(self, session: Session) -> None:
        tool = session.spec.turns[session.turn].tool
        assert tool is not None
        record = ToolRecord(session.turn, tool.kind, self.now, self.now, self.now)
        session.record.tools.append(record)
        self._tools[session.session_id] = (session, record)
        # The CPU side of co-scheduling: the client passes the gateway's priority on to
        # the sandbox pool (docs/gateway.md), here the host asks the half directly.
        priority = self.admission.tool_priority(session.session_id)
        self._emit(
            ToolEnqueue(
                session_id=session.session_id,
                call_id=self._tool_call_id(session),
                turn=session.turn,
                tool=tool.kind,
                priority=priority,
                **self.stamp(),
            )
        )
        self.host.advance(self.now)
        if self.host.submit(session.session_id, tool, priority):
            self._tool_started(session.session_id)
        self._emit_tool_stats()
        self._plan_tool_finish()

    @staticmethod
    def _tool_call_id(session: Session) -> str:
        return f"{session.session_id}/{session.turn}/tool"

    def _emit_tool_stats(self) -> None:
        """The host's tool pressure, as the sandbox pool reports it after each change."""
        self._emit(
            ToolStats(
                active=self.host.active,
                queued=self.host.queued,
                exec_ema_s=dict(self.tools.tool_ema_s),
                cores=self.config.tool_cores,
                **self.stamp(),
            )
        )

    def _tool_started(self, key: str) -> None:
        session, record = self._tools[key]
        record.start_s = self.now
        self._emit(
            ToolStart(
                session_id=key,
                call_id=self._tool_call_id(session),
                turn=session.turn,
                tool=record.kind,
                queue_wait_s=record.queue_s,
                **self.stamp(),
            )
        )

    def _plan_tool_finish(self) -> None:
        self._tool_version += 1
        upcoming = self.host.next_finish()
        if upcoming is not None:
            self._push(
                upcoming[0], _Rank.TOOL_DONE, self._on_tool_done, (self._tool_version, upcoming[1])
            )

    def _on_tool_done(self, arg: tuple[int, str]) -> None:
        version, key = arg
        if version != self._tool_version:
            return
        self.host.advance(self.now)
        for started in self.host.finish(key):
            self._tool_started(str(started))
        session, record = self._tools.pop(key)
        record.end_s = self.now
        duration = record.end_s - record.start_s
        self._emit(
            ToolEnd(
                session_id=key,
                call_id=self._tool_call_id(session),
                turn=session.turn,
                tool=record.kind,
                duration_s=duration,
                cpu_time_s=session.spec.turns[session.turn].tool.cpu_s,  # type: ignore[union-attr]
                **self.stamp(),
            )
        )
        self._emit_tool_stats()
        self._plan_tool_finish()
        session.turn += 1
        self._send_call(session)

    def _on_pin_expiry(self, pin: PinEntity) -> None:
        if self.kv.pins.get(pin.session_id) is not pin:
            return
        if any(call.session_id == pin.session_id for call in self.scheduler.waiting):
            return  # its next call is here: the pin goes when that call is admitted
        self.kv.unpin(pin.session_id, "expired")

    def _on_tick(self, _: None) -> None:
        self._apply(self.engine_half.tick(self))
        if self.partitioned and (self.scheduler.running or self.scheduler.waiting):
            # The partition may have changed: a side that had no SMs may run now.
            self._wake()
        interval = self.engine_half.tick_interval_s
        if interval and (self._sessions or self._gateway or self._heap):
            self._push(self.now + interval, _Rank.TICK, self._on_tick)

    def _apply(self, actions: Sequence[SessionAction]) -> None:
        self.apply(actions, self._sessions.get)
        self._admit_sessions()

    def announce(self, event: AnyEvent) -> None:
        self._emit(event)

    def resubmit(self, calls: list[Call]) -> None:
        for call in calls:
            self._submit(call)

    # --- KV bookkeeping ----------------------------------------------------------------

    def _count_eviction(self, blocks: int) -> None:
        evictions = self.record.evictions
        assert evictions is not None  # the simulator's record times every eviction
        if evictions and evictions[-1][0] == self.now:
            evictions[-1] = (self.now, evictions[-1][1] + blocks)
        else:
            evictions.append((self.now, blocks))

    def _load_done_at(self, blocks: int) -> float:
        """Loads from the CPU tier share one transfer channel, one after another."""
        self._channel_free_s = max(self._channel_free_s, self.now) + self.cost.transfer_time(blocks)
        return self._channel_free_s

    # --- what the admission half hears of the engine --------------------------------------

    def _kv_figures(self) -> tuple[int, int, int]:
        return self.kv.pool.num_free, self.kv.pinned_blocks, self.cpu_free_blocks

    def _plan_kv_stats(self) -> None:
        """After a change of the KV figures, publish them at the next sampling instant
        (a multiple of ``kv_stats_interval_s``, as a sampler at that rate would)."""
        if self._kv_stats_pending or self._kv_figures() == self._kv_published:
            return
        interval = self.config.kv_stats_interval_s
        # The next sampling instant strictly after now (a count of samples, with a
        # tolerance, so that exact multiples of the interval are not rounded away).
        due = (math.floor(self.now / interval + 1e-9) + 1) * interval
        self._kv_stats_pending = True
        self._push(due, _Rank.KV_STATS, self._publish_kv_stats)

    def _publish_kv_stats(self, _: None) -> None:
        self._kv_stats_pending = False
        self._kv_published = self._kv_figures()
        self._emit(self.pool_stats(self.record.steps, **self.stamp()))
        self._admit_sessions()

    def _plan_admission_pass(self) -> None:
        """An admission half with a control period is asked again after it, while
        sessions wait (the gateway's periodic pass)."""
        interval = self.admission.control_interval_s
        if interval and self._gateway and not self._pass_pending:
            self._pass_pending = True
            self._push(self.now + interval, _Rank.ADMISSION_PASS, self._on_admission_pass)

    def _on_admission_pass(self, _: None) -> None:
        self._pass_pending = False
        self._admit_sessions()

    def _sample_kv(self) -> None:
        if self.now < self._next_sample_s:
            return
        self._next_sample_s = self.now + self.config.kv_sample_interval_s
        pool = self.kv.pool
        self.record.kv_samples.append(
            KVSample(
                self.now,
                pool.num_free,
                pool.num_blocks - pool.num_free,
                self.kv.pinned_blocks,
                self.kv.cpu.used if self.kv.cpu is not None else 0,
            )
        )

    def _finish_record(self) -> None:
        unfinished = len(self.workload.sessions) - len(self.record.sessions)
        if unfinished:
            raise SimError(
                f"{unfinished} sessions never finished (policy {self.policy.name!r} stalls them)"
            )
        self.record.duration_s = max(session.end_s for session in self.record.sessions)
        self.record.preemptions = sum(c.preemptions for s in self.record.sessions for c in s.calls)
        self.record.prefix_queries = self.scheduler.prefix_queries
        self.record.prefix_hits = self.scheduler.prefix_hits
        self.record.tool_busy_core_s = self.host.busy_core_s
        self.record.decode_steps = self.decode_steps
        self.record.decode_time_s = self.decode_time_s


def isolated_sessions(
    workload: Workload, profile: Profile, config: SimConfig | None = None
) -> dict[str, SessionRecord]:
    """Each session's record when it runs alone on an empty engine under stock
    scheduling: T_ideal is its latency (seed 000: "maximum concurrency set to one")."""
    from agentmars.server.policies.fcfs import FCFS

    alone = {}
    for spec in workload.sessions:
        single = Workload(
            name=f"{workload.name}:{spec.session_id}",
            sessions=(spec.model_copy(update={"arrival_s": 0.0}),),
        )
        alone[spec.session_id] = SimEngine(single, FCFS(), profile, config).run().sessions[0]
    return alone
