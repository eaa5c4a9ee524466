"""The simulated engine: a discrete-event model of one vLLM V1 engine serving agent
sessions whose tools run on the host's CPUs, in virtual time.

A heap of events ordered by an explicit key (time, rank, sequence): at one instant,
an engine step ends before anything else is handled, and the next step starts only
after everything else of that instant (so a step sees every arrival of its start
time). Handlers change the entities and push the events that follow.

A session's life: it arrives (at its time, or when the last of the sessions it waits
for ends, ``SessionSpec.after``) and waits at the gateway until the policy admits it
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
from dataclasses import dataclass
from typing import Any

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    SessionMove,
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
from agentmars.server.policies.capabilities import (
    Capability,
    PolicyRefused,
    refuse_unless,
    runs_without,
)
from agentmars.server.policies.interface import EngineHalf, Policy
from agentmars.server.policies.tool_activity import ToolActivity
from agentmars.server.profiles.cost_model import CostModel, Profile
from agentmars.server.sim.clock import Rank, Scheduled
from agentmars.server.sim.entities import Call, Session
from agentmars.server.sim.host_cpu import HostCPU
from agentmars.server.sim.kv_cache import KVCache
from agentmars.server.sim.replica import Replica
from agentmars.server.sim.scheduler import Scheduler
from agentmars.server.workloads.model import SessionSpec, Workload

logger = logging.getLogger(__name__)

AGENT_WORK = "agent"
"""The host key of an agent's work around a call: ``(AGENT_WORK, call id)``
(``SimConfig.agent_cpu_s``)."""


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
    """Simulate the CPU KV tier (None: when the policy needs or uses it)."""
    cpu_tier_ratio: float | None = None
    """The CPU KV tier's blocks as a multiple of the GPU's (None: the profile's
    ``cpu_kv_blocks``); seed 003 runs 1x (tight) and 2x (relaxed)."""
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
    displaced_keep_kv: bool = False
    """A running call that a preemptive policy's waiting call displaces keeps its full
    blocks, pinned, while there is room (a later allocation drops the pin first), as
    seed 001's Algorithm 1 implies; off, it is preempted as vLLM preempts, its KV freed
    and recomputed (docs/results/seed-001.md measures both)."""
    replicas: int = 1
    """Engine replicas behind the gateway, each a whole engine of the profile (seed 003
    §6.2.2's DP=3); the host's tool cores are shared."""
    agent_cpu_s: float = 0.0
    """CPU seconds the agents' own processes spend on the tool cores per LLM call (0:
    the agents run elsewhere). A replay's agents share the tool cores with the tools
    (``bench replay`` measures this on its run): each call's share runs as background
    work on the host from the call's end, beside its tool. NOTE: ours — the agent's
    work around a call (building the request, reading the stream, handling the answer)
    is charged in one piece at its end; it slows the tools it shares the cores with,
    and delays nothing else directly (a replay's agents wait on the LLM and the tools
    in between, in their own threads)."""

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise SimError(f"replicas must be an integer >= 1, got {self.replicas!r}")
        if self.replicas < 1:
            raise SimError(f"replicas must be an integer >= 1, got {self.replicas!r}")
        if not 0 <= self.agent_cpu_s < math.inf:
            raise SimError(f"agent_cpu_s must be a finite number >= 0, got {self.agent_cpu_s!r}")


class SimEngine:
    """Runs one workload under one policy on a node of ``config.replicas`` engines
    (``sim.replica``) behind one gateway."""

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
        halves = [policy.engine() for _ in range(self.config.replicas)]
        engine_half = halves[0]
        cpu_tier = self.config.cpu_tier
        if cpu_tier is None:
            cpu_tier = Capability.CPU_TIER in engine_half.needs | engine_half.uses
        num_blocks = self.config.num_gpu_blocks or profile.num_gpu_blocks
        ratio = self.config.cpu_tier_ratio
        cpu_blocks = profile.cpu_kv_blocks if ratio is None else round(ratio * num_blocks)
        cpu_tier = cpu_tier and cpu_blocks > 0
        provides = set(Capability) - (set() if cpu_tier else {Capability.CPU_TIER})
        if not profile.sm_share_curves:
            provides.discard(Capability.SM_PARTITION)
        try:
            refuse_unless(policy.name, engine_half.needs, provides, "the simulated engine")
            refuse_unless(policy.name, self.admission.needs, provides, "the simulated gateway")
        except PolicyRefused as error:
            raise SimError(str(error)) from None
        self.admission.publish = self.emit
        partitioned = Capability.SM_PARTITION in provides and (
            Capability.SM_PARTITION in engine_half.needs | engine_half.uses
        )
        note = runs_without(policy.name, engine_half.uses, provides, "the simulated engine")
        if note is not None:
            logger.info("%s", note)
        self._check_fits(workload, min(profile.max_model_len, num_blocks * profile.block_size))
        self.host = HostCPU(self.config.tool_cores, self.config.tool_slots)
        self.tools = ToolActivity()
        self.replicas = [
            Replica(
                self,
                index,
                half,
                num_blocks=num_blocks,
                cpu_blocks=cpu_blocks if cpu_tier else 0,
                partitioned=partitioned,
            )
            for index, half in enumerate(halves)
        ]
        for half in halves:
            half.publish = self.emit
        self.admission_view = StreamAdmissionView(
            clock=lambda: self.now,
            block_size=profile.block_size,
            tool_cores=self.config.tool_cores,
            active_sessions=lambda: len(self.sessions),
            replicas=len(self.replicas),
            sessions_on=lambda index: self.replicas[index].sessions,
        )
        self.heap: list[Scheduled] = []
        self._ticks = 0
        """Replicas' ticks in the heap."""
        self._seq = itertools.count()
        self.gateway: list[Session] = []
        self.sessions: dict[str, Session] = {}
        self._placed: dict[str, Replica] = {}
        """Each admitted session's replica, until its ``session_end`` is out."""
        self._pending_specs = list(workload.sessions)
        self._ended: set[str] = set()
        self._deferred: list[SessionSpec] = []
        """Sessions that arrived while some of ``SessionSpec.after`` had not ended (in a
        closed loop, each holds its place in the loop meanwhile)."""
        self._tools: dict[str, tuple[Session, ToolRecord]] = {}
        self._tool_version = 0
        self._pass_pending = False
        self._pinned_since = 0.0
        self._next_sample_s = 0.0
        self.record = RunRecord(
            workload=workload.name,
            policy=policy.name,
            engine=f"sim:{profile.name}"
            + (f" x{len(self.replicas)}" if len(self.replicas) > 1 else ""),
            seed=workload.seed,
            sessions=[],
            duration_s=0.0,
            total_blocks=sum(replica.kv.pool.num_blocks for replica in self.replicas),
            block_size=profile.block_size,
            tool_cores=self.config.tool_cores,
        )

    @property
    def replicas_count(self) -> int:
        return len(self.replicas)

    @property
    def engine_half(self) -> EngineHalf:
        """The first replica's engine half (with one replica, the engine's)."""
        return self.replicas[0].engine_half

    @property
    def kv(self) -> KVCache:
        """The first replica's KV cache (with one replica, the engine's)."""
        return self.replicas[0].kv

    @property
    def scheduler(self) -> Scheduler:
        """The first replica's scheduler (with one replica, the engine's)."""
        return self.replicas[0].scheduler

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

    # --- the event loop ------------------------------------------------------------------

    def run(self) -> RunRecord:
        """Simulate until every session has ended; return what happened."""
        self._schedule_arrivals()
        for replica in self.replicas:
            replica.start()
        while self.heap:
            event = heapq.heappop(self.heap)
            self._ticks -= event.rank is Rank.TICK
            if event.time > self.config.max_virtual_s:
                raise SimError(
                    f"virtual time passed {self.config.max_virtual_s} s: the run does not end"
                )
            self._advance_to(event.time)
            event.handler(event.arg)
            for replica in self.replicas:
                replica.plan_kv_stats()
        self._finish_record()
        return self.record

    def push(
        self, time: float, rank: Rank, handler: Callable[[Any], None], arg: Any = None
    ) -> None:
        """Have ``handler(arg)`` called at ``time`` (``sim.clock``)."""
        heapq.heappush(self.heap, Scheduled(time, rank, next(self._seq), handler, arg))
        self._ticks += rank is Rank.TICK

    def busy(self) -> bool:
        """Sessions are at the gateway or admitted, or something other than the
        replicas' ticks is to come (a tick alone does not keep the run going)."""
        return bool(self.sessions or self.gateway or len(self.heap) > self._ticks)

    def _advance_to(self, time: float) -> None:
        pinned = sum(replica.kv.pinned_blocks for replica in self.replicas)
        self.record.pinned_block_s += pinned * (time - self._pinned_since)
        self._pinned_since = time
        self.now = time

    def emit(self, event: AnyEvent) -> None:
        """Hand an event of the stream to both halves (and to what the views follow):
        to the admission half, and to the engine half of the replica it concerns (a
        session's, or the replica whose KV figures it carries), or of every replica."""
        self.tools.observe(event)
        self.admission_view.observe(event)
        for replica in self._replicas_of(event):
            replica.engine_half.on_event(event)
        self.admission.on_event(event)

    def _replicas_of(self, event: AnyEvent) -> Sequence[Replica]:
        if len(self.replicas) == 1:
            return self.replicas
        session_id = getattr(event, "session_id", None)
        if session_id is not None:
            placed = self._placed.get(session_id)
            return (placed,) if placed is not None else ()
        if isinstance(event, KVStats) and event.replica is not None:
            return (self.replicas[event.replica],)
        return self.replicas

    def stamp(self) -> dict[str, Any]:
        ns = round(self.now * 1e9)
        return {"mono_ns": ns, "wall_ns": ns, "source": "sim"}

    # --- sessions ----------------------------------------------------------------------

    def _schedule_arrivals(self) -> None:
        if self.workload.arrival == "closed":
            assert self.workload.concurrency is not None
            for _ in range(min(self.workload.concurrency, len(self._pending_specs))):
                self.push(
                    0.0, Rank.SESSION_ARRIVAL, self._on_session_arrival, self._pending_specs.pop(0)
                )
        else:
            for spec in self._pending_specs:
                self.push(spec.arrival_s, Rank.SESSION_ARRIVAL, self._on_session_arrival, spec)
            self._pending_specs = []

    def _on_session_arrival(self, spec: SessionSpec) -> None:
        if not self._ended.issuperset(spec.after):
            self._deferred.append(spec)
            return
        record = SessionRecord(
            spec.session_id, spec.agent, self.now, self.now, self.now, task_id=spec.task_id
        )
        session = Session(spec, self.now, record)
        self.gateway.append(session)
        self.admit_sessions()

    def admit_sessions(self) -> None:
        """Let in the sessions the admission half admits now, each placed on a replica."""
        if not self.gateway:
            return
        for session in list(self.admission.admit(self.gateway, self.admission_view)):
            assert isinstance(session, Session)
            self.gateway.remove(session)
            self._place(session)
            self.sessions[session.session_id] = session
            session.record.admitted_s = self.now
            # The agent instance travels as the SDK sends it (VTC's client, seed 004).
            task = session.spec.task_id
            metadata = {"task_id": task} if task else {}
            self.emit(
                SessionStart(
                    session_id=session.session_id,
                    agent=session.agent,
                    metadata=metadata,
                    **self.stamp(),
                )
            )
            self._send_call(session)
        self._plan_admission_pass()

    def _place(self, session: Session) -> None:
        replica = self.replicas[0]
        if len(self.replicas) > 1:
            index = self.admission.place(session, self.admission_view)
            self._check_replica(index, session)
            replica = self.replicas[index]
        replica.kv.register(session)
        replica.sessions += 1
        self._placed[session.session_id] = replica

    def _move_if_asked(self, session: Session) -> None:
        """Ask the admission half whether the session's next call goes to another
        replica (``moves``); if so the replica it leaves forgets it as if it had ended
        there (its engine half hears a ``session_end``, its pin and CPU-tier copies go),
        and the stream gets a ``session_move``."""
        old = self._placed[session.session_id]
        index = self.admission.moves(session, old.index, self.admission_view)
        if index is None or index == old.index:
            return
        self._check_replica(index, session)
        new = self.replicas[index]
        session_id = session.session_id
        left = SessionEnd(
            session_id=session_id, error=f"moved to replica {index}", turns=session.turn,
            **self.stamp(),
        )  # fmt: skip
        old.engine_half.on_event(left)
        old.kv.unpin(session_id, "session_end")
        old.kv.release_swapped(session_id)
        old.sessions -= 1
        new.kv.register(session)
        new.sessions += 1
        self._placed[session_id] = new
        # Its gate was the replica it left (nothing of it is held: one call at a time).
        session.paused = False
        session.record.moves += 1
        move = SessionMove(
            session_id=session_id, from_replica=old.index, to_replica=index, **self.stamp()
        )
        self.emit(move)

    def _check_replica(self, index: int, session: Session) -> None:
        if not 0 <= index < len(self.replicas):
            raise SimError(
                f"policy {self.policy.name!r} placed session {session.session_id!r} on "
                f"replica {index!r}; there are {len(self.replicas)}"
            )

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
        if len(self.replicas) > 1 and session.turn > 0:
            self._move_if_asked(session)
        self._announce(call)
        if session.paused:
            # Held as the real engine holds it: the gateway has seen the call (its
            # ``llm_submit``, and the call's TTFT counts from here), the engine has not.
            session.held.append(call)
            return
        self.submit(call)

    def _announce(self, call: Call) -> None:
        """The call enters the serving path (the gateway's ``llm_submit``)."""
        self.emit(
            LLMSubmit(
                session_id=call.session_id,
                call_id=call.call_id,
                turn=call.turn,
                projected_prompt_tokens=call.prompt_tokens,
                projected_kv_blocks=self.replica_of(call).kv.blocks_for(
                    call.prompt_tokens + call.max_tokens
                ),
                max_tokens=call.max_tokens,
                follows_tool=call.follows_tool,
                expects_tool=call.expects_tool,
                **self.stamp(),
            )
        )

    def replica_of(self, call: Call) -> Replica:
        return self._placed[call.session_id]

    def submit(self, call: Call) -> None:
        """The call goes to its session's engine (after the profile's request overhead)."""
        call.arrival_s = self.now
        overhead = self.profile.request_overhead_s
        if overhead > 0:
            self.push(self.now + overhead, Rank.CALL_SUBMIT, self._enqueue, call)
        else:
            self._enqueue(call)

    def _enqueue(self, call: Call) -> None:
        """The call reaches the scheduler (after the profile's request overhead), unless
        its session was paused meanwhile."""
        if call.session.paused:
            call.session.held.append(call)
            return
        replica = self.replica_of(call)
        replica.scheduler.waiting.append(call)
        replica.wake()

    def _end_session(self, session: Session) -> None:
        del self.sessions[session.session_id]
        replica = self._placed[session.session_id]
        replica.sessions -= 1
        replica.kv.unpin(session.session_id, "session_end")
        replica.kv.release_swapped(session.session_id)
        session.record.end_s = self.now
        self.record.sessions.append(session.record)
        self.emit(
            SessionEnd(
                session_id=session.session_id,
                turns=len(session.spec.turns),
                duration_s=session.record.latency_s,
                **self.stamp(),
            )
        )
        del self._placed[session.session_id]
        self._ended.add(session.session_id)
        self._release_deferred()
        if self._on_progress is not None:
            self._on_progress(len(self.record.sessions))
        if self._pending_specs:
            self.push(
                self.now,
                Rank.SESSION_ARRIVAL,
                self._on_session_arrival,
                self._pending_specs.pop(0),
            )
        self.admit_sessions()

    def _release_deferred(self) -> None:
        """Sessions whose last dependency just ended arrive now."""
        ready = [spec for spec in self._deferred if self._ended.issuperset(spec.after)]
        for spec in ready:
            self._deferred.remove(spec)
            self.push(self.now, Rank.SESSION_ARRIVAL, self._on_session_arrival, spec)

    # --- tokens, finished calls, KV decisions and tools -----------------------------------

    def add_token(self, call: Call, tokens: int) -> None:
        """The call produced ``tokens`` more (its first: its TTFT); finished, it ends."""
        if call.output_tokens == 0:
            call.record.first_token_s = self.now
            self.emit(
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

    def _finish_call(self, call: Call) -> None:
        session = call.session
        replica = self.replica_of(call)
        replica.scheduler.running.remove(call)
        call.record.end_s = self.now
        call.record.output_tokens = call.output_tokens
        session.record.calls.append(call.record)
        last = session.turn == len(session.spec.turns) - 1
        decision = replica.engine_half.on_call_finished(call, replica) if not last else None
        freed = len(call.blocks)
        pin = replica.keep_or_free(call, decision, self.now)
        if pin is not None:
            freed -= pin.blocks
            if pin.expires_s is not None:
                self.push(pin.expires_s, Rank.PIN_EXPIRY, replica.on_pin_expiry, pin)
        self.emit(
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
        if self.config.agent_cpu_s:
            self.host.advance(self.now)
            self.host.run_background((AGENT_WORK, call.call_id), self.config.agent_cpu_s)
            self._plan_tool_finish()
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
        self.emit(
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
        self.emit(
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
        self.emit(
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
            self.push(
                upcoming[0], Rank.TOOL_DONE, self._on_tool_done, (self._tool_version, upcoming[1])
            )

    def _on_tool_done(self, arg: tuple[int, Any]) -> None:
        version, key = arg
        if version != self._tool_version:
            return
        self.host.advance(self.now)
        if self.host.is_background(key):
            self.host.finish(key)
            self._plan_tool_finish()
            return
        for started in self.host.finish(key):
            self._tool_started(str(started))
        session, record = self._tools.pop(key)
        record.end_s = self.now
        duration = record.end_s - record.start_s
        self.emit(
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

    # --- the admission half's periodic pass, the record -----------------------------------

    def _plan_admission_pass(self) -> None:
        """An admission half with a control period is asked again after it, while
        sessions wait (the gateway's periodic pass)."""
        interval = self.admission.control_interval_s
        if interval and self.gateway and not self._pass_pending:
            self._pass_pending = True
            self.push(self.now + interval, Rank.ADMISSION_PASS, self._on_admission_pass)

    def _on_admission_pass(self, _: None) -> None:
        self._pass_pending = False
        self.admit_sessions()

    def sample_kv(self) -> None:
        """The record's KV sample (every replica's, summed), at most every
        ``kv_sample_interval_s``."""
        if self.now < self._next_sample_s:
            return
        self._next_sample_s = self.now + self.config.kv_sample_interval_s
        pools = [replica.kv.pool for replica in self.replicas]
        free = sum(pool.num_free for pool in pools)
        self.record.kv_samples.append(
            KVSample(
                self.now,
                free,
                sum(pool.num_blocks for pool in pools) - free,
                sum(replica.kv.pinned_blocks for replica in self.replicas),
                sum(r.kv.cpu.used if r.kv.cpu is not None else 0 for r in self.replicas),
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
        self.record.prefix_queries = sum(r.scheduler.prefix_queries for r in self.replicas)
        self.record.prefix_hits = sum(r.scheduler.prefix_hits for r in self.replicas)
        self.record.tool_busy_core_s = self.host.busy_core_s
        self.record.decode_steps = sum(replica.decode_steps for replica in self.replicas)
        self.record.decode_time_s = sum(replica.decode_time_s for replica in self.replicas)


def isolated_sessions(
    workload: Workload, profile: Profile, config: SimConfig | None = None
) -> dict[str, SessionRecord]:
    """Each session's record when it runs alone on an empty engine under stock
    scheduling: T_ideal is its latency (seed 000: "maximum concurrency set to one"),
    from when it starts (a session that waits for others is run without them)."""
    from agentmars.server.policies.fcfs import FCFS

    alone = {}
    for spec in workload.sessions:
        single = Workload(
            name=f"{workload.name}:{spec.session_id}",
            sessions=(spec.model_copy(update={"arrival_s": 0.0, "after": ()}),),
        )
        alone[spec.session_id] = SimEngine(single, FCFS(), profile, config).run().sessions[0]
    return alone
