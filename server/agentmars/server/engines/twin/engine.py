"""The wall-clock twin: the simulator's engine paced to the wall clock, real requests
on a modelled GPU (the third engine of docs/policies.md).

``SimEngine`` runs a workload in virtual time; ``LiveEngine`` serves calls as they come
(``engines.twin.app`` puts an OpenAI-compatible API on it) with the same mechanism: the
simulator's ``Scheduler`` makes every decision with the policy's engine half (waiting
order, chunk, victim, pin reclaim), its ``KVCache`` holds the blocks, prefix cache and
pins, and the profile's cost model says how long each step takes. One step loop (an
asyncio task) schedules a step, sleeps out its modelled time — sleeping *is* the
modelled work here — then settles it with ``SimEngine``'s code (``sim.engine_core``):
computed tokens catch up, full blocks are named for the prefix cache, and every call
whose tokens are all computed gets one more token.
A finished call's KV goes where the policy's ``on_call_finished`` says (release, pin
with an optional TTL, offload to the CPU tier), as in ``SimEngine`` and the vLLM plugin.

Sessions. A call names its session (``CallRequest.session_id``, from ``vllm_xargs`` or
the body, as the gateway forwards it); a call that names none is a session of its own
and is never pinned (as in the vLLM plugin). A session's context is taken to be
append-only, as an agent loop's is: its blocks are named (session, block index), which
is what vLLM's chained block hashes amount to then. NOTE: ours — when a call's prompt
does not start with its session's previous prompt, the session's context starts over
(a fresh block owner): none of the old blocks hit, although vLLM would still hit the
common prefix's full blocks. Output tokens are counted into the cached context as if
the client sent them back verbatim.

Not modelled: cross-session prefix sharing (identical system prompts of different
sessions do not share blocks), an end-of-sequence token (every call generates its
``max_tokens``, unless the API says a stop string ends it sooner: ``ends_after``),
speculative decoding, sampling. Session admission is the gateway's: this engine serves
every call it gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
)
from agentmars.server.metrics.records import CallRecord, SessionRecord
from agentmars.server.policies.capabilities import (
    Capability,
    PolicyRefused,
    refuse_unless,
    runs_without,
)
from agentmars.server.policies.feed import EventFeed
from agentmars.server.policies.interface import Pin, Policy, Publish, Release, SessionAction
from agentmars.server.policies.tool_activity import FollowsTools, ToolActivity
from agentmars.server.profiles.cost_model import CostModel, Profile
from agentmars.server.sim.engine_core import KVEngineView
from agentmars.server.sim.entities import Call, Session
from agentmars.server.sim.entities import Pin as PinEntity
from agentmars.server.sim.kv_cache import KVCache
from agentmars.server.sim.scheduler import Scheduler, Step
from agentmars.server.workloads.model import SessionSpec, TurnSpec

SESSION_MEMORY = 65_536
"""Idle sessions remembered (ours: the engine never hears most sessions end; past this
many the least recently used idle ones are forgotten, and come back as new)."""
CATCH_UP_S = 0.005
"""A step that starts this late after the previous one's modelled end is taken as
back to back (ours: a few timer slips; longer is a pause in the work)."""
IDLE_WAKE_S = 1.0
"""Longest sleep of an idle step loop (ours: a safety net; work wakes it at once)."""

logger = logging.getLogger(__name__)


class LiveError(ValueError):
    """A call this engine cannot serve; the message says why (an HTTP 400), ``param``
    names the request field at fault (vLLM's ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def output_limit_error(max_tokens: int, limit: int, param: str = "max_tokens") -> LiveError:
    """vLLM 0.32's answer to ``max_tokens`` (or ``max_completion_tokens``, ``param``)
    above the whole context (``TokenizeParams``), before the prompt is looked at."""
    return LiveError(
        f"{param}={max_tokens} cannot be greater than max_model_len={limit}. Please request "
        f"fewer output tokens. (parameter={param}, value={max_tokens})",
        param,
    )


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One LLM call as the API hands it to the engine."""

    prompt: str
    """The prompt's content as a string (tokens are synthetic: only its prefix
    relation to the session's previous prompt matters)."""
    prompt_tokens: int
    max_tokens: int
    session_id: str | None = None
    """None: the call is a session of its own (never pinned)."""
    turn: int | None = None
    """None: the session's calls so far."""
    follows_tool: bool = False
    expects_tool: bool = False
    next_tool: str | None = None
    expected_tool_s: float | None = None
    agent: str = ""
    task_id: str | None = None
    """The agent instance the session is a branch of (seed 004; None: the session)."""
    call_id: str | None = None
    """The id the SDK and the gateway gave the call (None: the engine makes one)."""
    ends_after: int | None = None
    """The answer ends on this token, before ``max_tokens`` (a stop string in its text);
    None: it runs to ``max_tokens``."""
    finish_reason: str = "length"
    """What ``LLMEnd.finish_reason`` says when the answer is over (the API knows:
    "length", "stop" or "tool_calls")."""


class CallStream:
    """A submitted call as its client reads it: one item per generated token."""

    def __init__(self, call: Call, request: CallRequest) -> None:
        self.call = call
        self.status = "running"
        """Then "finished" (all its tokens generated) or "aborted"."""
        self.ends_after = request.ends_after
        self.finish_reason = request.finish_reason
        self.last_token_s = 0.0
        """When its latest token came (the engine's clock)."""
        self.scheduled_s: float | None = None
        """When its first step started (the engine's clock)."""
        self._queue: asyncio.Queue[bool] = asyncio.Queue()

    async def tokens(self) -> AsyncIterator[int]:
        """The index of each new token as the engine produces it, until the call ends."""
        index = 0
        while await self._queue.get():
            yield index
            index += 1

    def _push(self) -> None:
        self._queue.put_nowait(True)

    def _close(self, status: str) -> None:
        self.status = status
        self._queue.put_nowait(False)


@dataclass(eq=False, slots=True)
class _LiveSession:
    """What the engine keeps of a session between its calls."""

    session: Session
    """The current context's entity (a new one when the context starts over)."""
    context_chars: int = 0
    context_digest: bytes = b""
    """Length and digest of the previous prompt, for the append-only check."""
    calls: int = 0
    in_flight: int = 0


@dataclass(slots=True)
class LiveCounters:
    """Running totals since the engine started (``/metrics``)."""

    steps: int = 0
    prompt_tokens: int = 0
    """Tokens computed in prefill (recomputation included)."""
    generation_tokens: int = 0
    preemptions: int = 0
    evicted_blocks: int = 0
    finished: int = 0
    aborted: int = 0


@dataclass(frozen=True, slots=True)
class CallTimes:
    """A finished call's latency and its phases, as vLLM's request metrics split them."""

    e2e_s: float
    """From its arrival to its last token."""
    queue_s: float
    """From its arrival to its first step (waiting)."""
    prefill_s: float
    """From its first step to its first token."""
    decode_s: float
    """From its first token to its last."""

    @property
    def inference_s(self) -> float:
        """From its first step to its last token (running)."""
        return self.prefill_s + self.decode_s


class CallObserver:
    """Told of each step's tokens, of each call's tokens as the engine produces them
    and of its end, with vLLM's definitions of the latencies (``engines.twin.metrics``
    turns them into vLLM's histograms); this one ignores them."""

    def stepped(self, tokens: int) -> None:
        """A step computed ``tokens`` tokens (prompt and output, of every call in it)."""

    def first_token(self, call: Call, ttft_s: float) -> None:
        """The call's prefill is done: its first token came ``ttft_s`` after it did."""

    def next_token(self, call: Call, itl_s: float) -> None:
        """Another token came, ``itl_s`` after the call's previous one."""

    def finished(self, call: Call, finish_reason: str, times: CallTimes) -> None:
        """The call generated its last token (not told of a call aborted, as vLLM
        counts none)."""


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class LiveEngine(KVEngineView, FollowsTools):
    """Serves calls under one policy's engine half on one profile; it is also the
    half's ``EngineView``. All methods run on the event loop of ``run()``, except
    ``kv_stats`` (any thread). ``publish`` takes the events the engine adds to the
    stream (the half's own, and ``session_pause`` / ``session_resume``): the gateway's
    hub, for its admission half."""

    def __init__(self, profile: Profile, policy: Policy, *, publish: Publish | None = None) -> None:
        self.half = half = policy.engine()
        # NOTE: the twin runs one shared step: no SM partition (a half that only uses
        # one runs without it).
        provides = set(Capability) - {Capability.KV_FIGURES, Capability.SM_PARTITION}
        if not profile.cpu_kv_blocks:
            provides.discard(Capability.CPU_TIER)
        try:
            refuse_unless(policy.name, half.needs, provides, "the wall-clock twin")
        except PolicyRefused as error:
            raise LiveError(str(error)) from None
        note = runs_without(policy.name, half.uses, provides, "the wall-clock twin")
        if note is not None:
            logger.info("%s", note)
        self.profile = profile
        self.policy = policy
        self.cost = CostModel(profile)
        self.tools = ToolActivity()
        self._publish_out = publish or (lambda event: None)
        self.feed = EventFeed(self._deliver)
        half.publish = self._publish
        self.kv = KVCache(
            profile.num_gpu_blocks,
            profile.block_size,
            profile.cpu_kv_blocks if Capability.CPU_TIER in half.needs | half.uses else 0,
            self._count_eviction,
            offload_evicted=half.offload_evicted,
            transfer_time=self.cost.transfer_time,
            watch=self,
        )
        self.scheduler = Scheduler(
            self.kv,
            half,
            self,
            max_num_seqs=profile.max_num_seqs,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            load_done_at=self._load_done_at,
        )
        self.counters = LiveCounters()
        self.observer = CallObserver()
        """Set by whoever records the calls' latencies (``create_live_app``)."""
        self._t0 = time.monotonic()
        self._sessions: OrderedDict[str, _LiveSession] = OrderedDict()
        self._streams: dict[Call, CallStream] = {}
        self._expiries: list[tuple[float, int, PinEntity]] = []
        """The pins with a TTL, soonest first (a heap; a pin released since stays in it
        until its time comes or ``pin_taken`` compacts it): a step looks at the pins that
        are due, not at all of them (issue 38)."""
        self._pin_order = itertools.count()
        self._owners = itertools.count(1)
        self._call_ids = itertools.count()
        self._work = asyncio.Event()
        self._next_tick_s = half.tick_interval_s or 0.0
        self._channel_free_s = 0.0
        self._step_end_s = -CATCH_UP_S
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- EngineView ------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """Seconds since the engine started (monotonic)."""
        return time.monotonic() - self._t0

    @property
    def active_sessions(self) -> int:
        """Sessions with a call here or a pin."""
        return sum(
            1 for sid, live in self._sessions.items() if live.in_flight or sid in self.kv.pins
        )

    @property
    def tool_cores(self) -> int:
        return os.cpu_count() or 1

    def kv_stats(self) -> KVStats:
        """The block pool now; safe to read from another thread (a snapshot may
        straddle a step)."""
        return self.pool_stats(self.counters.steps, source="engine")

    # --- calls in ----------------------------------------------------------------------

    def check(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The call's ``max_tokens``: the client's, capped by what the context leaves
        (as vLLM 0.32 does: a prompt plus ``max_tokens`` above the context is served,
        shortened); ``LiveError`` with vLLM 0.32's message and parameter when
        ``max_tokens`` alone is above the context, the prompt is, or the prompt leaves
        no room for one token."""
        limit = self.profile.max_model_len
        if max_tokens is not None and max_tokens > limit:
            raise output_limit_error(max_tokens, limit)
        if prompt_tokens > limit:
            # vLLM's tokenizer stops one token past the limit, hence its "at least".
            least = "at least " if prompt_tokens == limit + 1 else ""
            raise LiveError(
                f"This model's maximum context length is {limit} tokens. However, your "
                f"prompt contains {least}{prompt_tokens} input tokens, which exceeds this "
                f"limit even without any output tokens. Please reduce the length of the "
                f"input prompt. (parameter=input_tokens, value={prompt_tokens})",
                "input_tokens",
            )
        room = limit - prompt_tokens
        if room == 0:  # vLLM caps max_tokens at the room left, then refuses 0
            raise LiveError(
                "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
                "max_tokens",
            )
        return room if max_tokens is None else min(max_tokens, room)

    def submit(self, request: CallRequest) -> CallStream:
        """Queue a call; read its tokens from the returned stream."""
        max_tokens = self.check(request.prompt_tokens, request.max_tokens)
        call_id = request.call_id or f"live-{next(self._call_ids)}"
        try:
            live, call = self._new_call(request, call_id, max_tokens)
            self._emit_submit(call)
        except ValidationError as error:
            # An id, name or turn the events cannot carry (the API checks them first):
            # refused before the engine holds anything of the call.
            problem = error.errors()[0]
            where = ".".join(str(part) for part in problem["loc"])
            raise LiveError(f"the call cannot be served: {where}: {problem['msg']}") from None
        live.calls += 1
        live.in_flight += 1
        stream = self._streams[call] = CallStream(call, request)
        if live.session.paused:
            live.session.held.append(call)
        else:
            self.scheduler.waiting.append(call)
            self._work.set()
        return stream

    def next_turn(self, request: CallRequest) -> int:
        """The turn ``request`` is in its session: the client's, else the session's
        calls so far."""
        if request.turn is not None:
            return request.turn
        live = self._sessions.get(request.session_id) if request.session_id else None
        return live.calls if live is not None else 0

    def _new_call(
        self, request: CallRequest, call_id: str, max_tokens: int
    ) -> tuple[_LiveSession, Call]:
        live = self._live_session(request, call_id)
        now = self.now
        turn = self.next_turn(request)
        call = Call(
            call_id=call_id,
            session=live.session,
            turn=turn,
            arrival_s=now,
            prompt_tokens=request.prompt_tokens,
            max_tokens=max_tokens,
            follows_tool=request.follows_tool,
            expects_tool=request.expects_tool,
            next_tool=request.next_tool,
            expected_tool_s=request.expected_tool_s,
            record=CallRecord(turn, now, now, now, request.prompt_tokens, 0),
        )
        return live, call

    def _live_session(self, request: CallRequest, call_id: str) -> _LiveSession:
        session_id = request.session_id or call_id
        live = self._sessions.get(session_id)
        if live is None:
            live = self._sessions[session_id] = _LiveSession(
                self._new_session(session_id, request.agent, request.task_id, self.now)
            )
            self._forget_idle_sessions()
        else:
            self._sessions.move_to_end(session_id)
            head = request.prompt[: live.context_chars]
            if len(head) < live.context_chars or _digest(head) != live.context_digest:
                # The context did not grow from the previous prompt: start it over. The
                # old context's pin can never hit again, and the scheduler never drops
                # a call's own session's pin to make room for it: drop it now.
                self.kv.unpin(session_id, "ended")
                old = live.session
                old_task = old.spec.task_id
                live.session = self._new_session(session_id, old.agent, old_task, old.arrival_s)
                live.session.paused, live.session.held = old.paused, old.held
        live.context_chars, live.context_digest = len(request.prompt), _digest(request.prompt)
        return live

    def _new_session(
        self, session_id: str, agent: str, task_id: str | None, arrival_s: float
    ) -> Session:
        # Session wants a workload spec; only its id and agent are read here (one
        # placeholder turn: the live session's turns are not known in advance).
        spec = SessionSpec(
            session_id=session_id,
            agent=agent or "agent",
            task_id=task_id,
            turns=(TurnSpec(append_tokens=1, output_tokens=1),),
        )
        record = SessionRecord(
            session_id, spec.agent, arrival_s, arrival_s, arrival_s, task_id=task_id
        )
        session = Session(spec, arrival_s, record)
        session.kv_owner = next(self._owners)
        return session

    def _forget_idle_sessions(self) -> None:
        """Past ``SESSION_MEMORY``, forget the least recently used idle sessions. Runs on
        every new session: it looks at no more sessions than it forgets plus the busy
        ones (a call in flight or a pin: as many as the engine holds) before them, never
        at all of them (issue 38: copying the keys made a new session's first call
        O(sessions))."""
        excess = len(self._sessions) - SESSION_MEMORY
        if excess <= 0:
            return
        idle = []
        for session_id, live in self._sessions.items():
            if not live.in_flight and session_id not in self.kv.pins:
                idle.append(session_id)
                if len(idle) == excess:
                    break
        for session_id in idle:
            del self._sessions[session_id]
            self.kv.release_swapped(session_id)

    def abort(self, stream: CallStream) -> None:
        """Stop a call its client gave up on: its blocks are freed, its session's pin
        dropped (as the vLLM plugin does for an aborted call), nothing is pinned."""
        call = stream.call
        if self._streams.pop(call, None) is None:
            return
        if call in self.scheduler.running:
            self.scheduler.running.remove(call)
        elif call in self.scheduler.waiting:
            self.scheduler.waiting.remove(call)
        live = self._sessions.get(call.session_id)
        if live is not None and call in live.session.held:
            live.session.held.remove(call)
        freed = len(call.blocks)
        self.kv.free(call)
        self.kv.unpin(call.session_id, "ended")
        self.kv.release_swapped(call.session_id)
        self.counters.aborted += 1
        self._call_over(call, stream, "aborted", freed)
        self._work.set()

    def observe(self, events: Sequence[AnyEvent]) -> None:
        """Events of the information stream from elsewhere (the SDK, the sandbox, the
        admission half, via the gateway): each boundary once to the engine half, with
        the engine's own reports of its calls (``EventFeed``)."""
        for event in events:
            self.feed(event)
        self._work.set()

    def _deliver(self, event: AnyEvent) -> None:
        self.tools.observe(event)
        self.half.on_event(event)
        if event.kind == "session_end":
            self.kv.unpin(event.session_id, "session_end")
            self.kv.release_swapped(event.session_id)

    def _publish(self, event: AnyEvent) -> None:
        """An event the engine adds to the stream: to its own half and out."""
        self.feed(event)
        self._publish_out(event)

    def observe_threadsafe(self, events: Sequence[AnyEvent]) -> None:
        """``observe`` from any thread (e.g. a hub subscriber); dropped before ``run``."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the engine is gone
                self._loop.call_soon_threadsafe(self.observe, events)

    # --- the step loop -----------------------------------------------------------------

    async def run(self) -> None:
        """Step until cancelled."""
        self._loop = asyncio.get_running_loop()
        while True:
            self._work.clear()
            self._housekeeping()
            now = self.now
            # NOTE: ours — back to back, a step starts where the previous one was due to
            # end, so the timer's lateness (about a millisecond a sleep) does not add up
            # over a stream of steps; after a pause the clock starts from now.
            started = self._step_end_s if now - self._step_end_s < CATCH_UP_S else now
            step = self.scheduler.schedule(now)
            self.counters.preemptions += len(step.preempted)
            if not step.batch:
                self._step_end_s = -CATCH_UP_S  # a pause: the next step starts afresh
                await self._idle()
                continue
            duration = self.step_duration(step, started)
            self._step_started(step, started)
            self._step_end_s = started + duration
            await asyncio.sleep(max(0.0, self._step_end_s - self.now))
            self._end_step(step, duration)

    async def _idle(self) -> None:
        """Nothing can run: wait for work, a pin to expire, a tick or a CPU-tier load."""
        now = self.now
        deadlines = [call.ready_s for call in self.scheduler.running if call.ready_s > now]
        expiry = self._next_expiry()
        if expiry is not None:
            deadlines.append(expiry)
        if self.half.tick_interval_s:
            deadlines.append(self._next_tick_s)
        timeout = min([IDLE_WAKE_S, *(deadline - now for deadline in deadlines)])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._work.wait(), max(timeout, 0.0))

    def _housekeeping(self) -> None:
        now = self.now
        interval = self.half.tick_interval_s
        if interval == 0 or (interval and now >= self._next_tick_s):
            self._next_tick_s = now + (interval or 0.0)
            self._apply(self.half.tick(self))
        waiting: set[str] | None = None
        kept = []
        while (expiry := self._next_expiry()) is not None and expiry <= now:
            due = heapq.heappop(self._expiries)
            if waiting is None:
                waiting = {call.session_id for call in self.scheduler.waiting}
            # As SimEngine: a pin whose session's next call already waits stays until
            # that call is admitted.
            if due[2].session_id in waiting:
                kept.append(due)
            else:
                self.kv.unpin(due[2].session_id, "expired")
        for due in kept:
            heapq.heappush(self._expiries, due)

    def _next_expiry(self) -> float | None:
        """When the soonest pin held expires (None: no pin has a TTL)."""
        expiries = self._expiries
        while expiries and self.kv.pins.get(expiries[0][2].session_id) is not expiries[0][2]:
            heapq.heappop(expiries)  # released before its time
        return expiries[0][0] if expiries else None

    def pin_taken(self, pin: PinEntity) -> None:
        """``PinWatch``: announced, and its expiry kept in order."""
        super().pin_taken(pin)
        if pin.expires_s is None:
            return
        expiries = self._expiries
        heapq.heappush(expiries, (pin.expires_s, next(self._pin_order), pin))
        if len(expiries) > 2 * len(self.kv.pins) + 64:  # mostly pins released: compact
            pins = self.kv.pins
            expiries[:] = [due for due in expiries if pins.get(due[2].session_id) is due[2]]
            heapq.heapify(expiries)

    def _step_started(self, step: Step, started: float) -> None:
        """Its calls' first step (for their queue time), and its tokens."""
        for call, _ in step.batch:
            stream = self._streams.get(call)
            if stream is not None and stream.scheduled_s is None:
                stream.scheduled_s = started
        self.observer.stepped(sum(tokens for _, tokens in step.batch))

    def _end_step(self, step: Step, duration: float) -> None:
        self.counters.steps += 1
        settled = self.settle(step, duration)
        self.counters.prompt_tokens += settled.prefill_tokens
        # The tokens' times are the step's modelled end, not the timer's wake-up: a
        # late step's lateness is made up by the next (``run``), so stamping it would
        # shorten the next token's latency below its step's modelled duration.
        for call in settled.produced:
            self._add_token(call, self._step_end_s)

    def _add_token(self, call: Call, now: float) -> None:
        stream = self._streams[call]
        if call.output_tokens == 0:
            call.record.first_token_s = now
            ttft = max(now - call.arrival_s, 0.0)
            self._emit(LLMFirstToken, call, ttft_s=ttft)
            self.observer.first_token(call, ttft)
        else:
            self.observer.next_token(call, now - stream.last_token_s)
        stream.last_token_s = now
        call.output_tokens += 1
        self.counters.generation_tokens += 1
        stream._push()
        if call.output_tokens == stream.ends_after:
            # A stop string ends the call here, as in vLLM: the policy saw the client's
            # max_tokens until now, and ``finished`` holds from here for everyone.
            call.max_tokens = call.output_tokens
        if call.finished:
            self._finish_call(call, stream, now)

    # --- finished calls ----------------------------------------------------------------

    def _finish_call(self, call: Call, stream: CallStream, last_token_s: float) -> None:
        self.scheduler.running.remove(call)
        del self._streams[call]
        # A call that named no session is a session of its own: nothing to keep for it.
        named = call.call_id != call.session_id
        decision = self.half.on_call_finished(call, self) if named else Release()
        if isinstance(decision, Pin):
            # NOTE: ours — a session's calls may overlap here (never in the simulator):
            # its latest pin replaces an earlier one, whose blocks would else stay held.
            self.kv.unpin(call.session_id, "replaced")
        freed = len(call.blocks)
        pin = self.keep_or_free(call, decision, self.now)
        freed -= pin.blocks if pin is not None else 0
        self.counters.finished += 1
        times = self._times(call, stream, last_token_s)
        self.observer.finished(call, stream.finish_reason, times)
        self._call_over(call, stream, "finished", freed)

    def _times(self, call: Call, stream: CallStream, last_token_s: float) -> CallTimes:
        # A step may start before a call that joins it arrived (back to back, a step
        # starts where the previous one was due to end): then it waited for nothing.
        first_step = max(stream.scheduled_s or call.arrival_s, call.arrival_s)
        first_token = max(call.record.first_token_s, first_step)
        end = max(last_token_s, first_token)
        return CallTimes(
            e2e_s=end - call.arrival_s,
            queue_s=first_step - call.arrival_s,
            prefill_s=first_token - first_step,
            decode_s=end - first_token,
        )

    def _call_over(self, call: Call, stream: CallStream, status: str, freed: int) -> None:
        call.record.end_s = self.now
        live = self._sessions.get(call.session_id)
        if live is not None:
            live.in_flight -= 1
            if call.call_id == call.session_id and not live.in_flight:
                del self._sessions[call.session_id]  # a one-call session is over
        self._emit(
            LLMEnd,
            call,
            status="ok" if status == "finished" else "cancelled",
            prompt_tokens=call.prompt_tokens,
            cached_tokens=call.record.cached_tokens,
            output_tokens=call.output_tokens,
            freed_blocks=freed,
            finish_reason=stream.finish_reason if status == "finished" else None,
            ended_in_tool_call=status == "finished" and stream.finish_reason == "tool_calls",
            duration_s=max(self.now - call.arrival_s, 0.0),
        )
        stream._close(status)

    # --- policy actions ----------------------------------------------------------------

    def _apply(self, actions: Sequence[SessionAction]) -> None:
        self.apply(actions, self._session_entity)

    def _session_entity(self, session_id: str) -> Session | None:
        live = self._sessions.get(session_id)
        return live.session if live is not None else None

    def announce(self, event: AnyEvent) -> None:
        self._publish(event)

    def stamp(self) -> dict[str, Any]:
        return {"source": "engine"}

    def resubmit(self, calls: list[Call]) -> None:
        self.scheduler.waiting.extend(calls)
        self._work.set()

    # --- events and KV bookkeeping -------------------------------------------------------

    def _emit_submit(self, call: Call) -> None:
        self._emit(
            LLMSubmit,
            call,
            projected_prompt_tokens=call.prompt_tokens,
            projected_kv_blocks=self.kv.blocks_for(call.prompt_tokens + call.max_tokens),
            max_tokens=call.max_tokens,
            follows_tool=call.follows_tool,
            expects_tool=call.expects_tool,
        )

    def _emit(
        self, kind: type[LLMSubmit | LLMFirstToken | LLMEnd], call: Call, **fields: Any
    ) -> None:
        event = kind(
            session_id=call.session_id,
            call_id=call.call_id,
            turn=call.turn,
            source="engine",
            **fields,
        )
        self.feed(event)

    def _count_eviction(self, blocks: int) -> None:
        self.counters.evicted_blocks += blocks

    def _load_done_at(self, blocks: int) -> float:
        """Loads from the CPU tier share one transfer channel, one after another."""
        self._channel_free_s = max(self._channel_free_s, self.now) + self.cost.transfer_time(blocks)
        return self._channel_free_s

    def shutdown(self) -> None:
        """End every open call (its client sees the stream end) and drop every pin."""
        for stream in list(self._streams.values()):
            self.abort(stream)
        for session_id in list(self.kv.pins):
            self.kv.unpin(session_id, "shutdown")
