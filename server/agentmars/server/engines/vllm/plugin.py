"""The agentmars scheduler plugin for vLLM 0.32 (and 0.33, verified at the scheduler
level: ``plugin_config.SUPPORTED_VLLM``): the policy interface's decisions made
inside vLLM's V1 scheduler (DESIGN.md "One policy, two engines";
notes/vllm-plugin.md). Load it with::

    --scheduler-cls agentmars.server.engines.vllm.plugin.AgentmarsScheduler       # CPU
    --scheduler-cls agentmars.server.engines.vllm.plugin.AgentmarsAsyncScheduler  # GPU

and choose the policy with ``AGENTMARS_POLICY`` (``plugin_config``); the plugin runs
the policy's engine half (docs/policies.md) and refuses at start a policy whose engine
half needs what the plugin does not provide (``PluginConfig.provides``). What it
changes:

- Waiting order: at the top of every ``schedule()`` the FCFS waiting queue is put in
  the order of the policy's ``priority()`` (ties: arrival, then request id;
  ``waiting_order`` keeps it so), and vLLM's own pass over it takes calls in that
  order. vLLM's ``--scheduling-policy`` must stay ``fcfs``: the plugin is the one that
  orders.
- KV retention (the touch pattern): when a call finishes normally, the policy's
  ``on_call_finished`` may ``Pin`` its hashed blocks for its session; the pin goes when
  the session's next call gets its blocks, when its TTL is up (checked at the top of
  ``schedule()``), under allocation pressure before any preemption (the policy's
  ``reclaim`` order), when the gateway says the session ended, on
  ``reset_prefix_cache()`` and on ``shutdown()``. An aborted or failed call drops its
  session's pin. Each pin and release is published to the gateway (``kv_pin`` /
  ``kv_unpin``, made by the side channel's thread: made in ``schedule()``, a profile of
  bench_schedule's queue put them at a few percent of stock vLLM's step under MARS);
  the engine half reads its engine's pins from the view, not from these.
- Chunk size: ``_reserve_prefill_lookahead`` caps a prompt's chunk by the policy's
  ``chunk``; for a waiting call whose whole prompt does not fit, it also sets vLLM's
  ``scheduler_reserve_full_isl`` (read by the allocation that follows) from the
  policy's ``may_start_partial``, so the call may start on the blocks that fit.
- Preemption victim: the policy's ``victim`` is put where vLLM's FCFS preemption takes
  it (``preemption``).
- Displacement (a ``preemptive`` policy only): after the waiting queue is ordered, while
  the first waiting call vLLM's pass will look at ranks before the last-ranked running
  call and cannot start now (the batch is full, or the blocks it needs to start are
  not free once other sessions' pins are dropped), that running call is preempted as
  vLLM preempts (recomputed), so that vLLM's pass admits the waiting one
  (``displacement``).
- Ticks and pauses: a policy's ``tick`` runs at the top of ``schedule()`` when due,
  and from ``ticker`` while the engine idles (under the scheduler's lock, which
  ``schedule``, ``update_from_output``, ``add_request`` and ``finish_requests`` hold);
  a ``pause`` releases the session's pin, preempts its running calls and holds its
  waiting and arriving ones (``paused``) until ``resume``; the engine publishes
  ``session_pause`` / ``session_resume`` for the gateway's admission half.
- Prefix lookups: where the KV layout makes vLLM's lookup of a waiting call's prefix
  a plain walk of its hash map, the plugin walks it in one loop (``prefix_lookup``):
  the same answer, without five calls a block of the hit.
- The side channel to the gateway: KV figures (a ``kv_stats`` event: free, pinned,
  used, total blocks, pins, releases, steps) published at 10 Hz and the engine half's
  own events as they come (``kv_status``); the stream's events in (``hints``), each
  boundary once (``EventFeed``: calls carry the gateway's call id), handed to the
  half's ``on_event`` and to the view's tool figures at the top of each ``schedule()``.

docs/vllm-plugin.md says what each decision point sees and where it differs from the
simulated engine.

Importing this module imports vLLM's scheduler and nothing heavier; it refuses a vLLM
outside the supported series before touching any of vLLM's internals.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import operator
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import vllm  # type: ignore[import-not-found]

from agentmars.server.engines.vllm.plugin_config import (
    ENGINE_VLLM,
    PluginConfig,
    PluginConfigError,
    check_vllm_version,
    vllm_series,
)

check_vllm_version(vllm.__version__)

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # type: ignore[import-not-found]  # noqa: E402
from vllm.v1.core.sched.interface import PauseState  # type: ignore[import-not-found]  # noqa: E402
from vllm.v1.core.sched.request_queue import SchedulingPolicy  # type: ignore[import-not-found]  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # type: ignore[import-not-found]  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # type: ignore[import-not-found]  # noqa: E402
from vllm.v1.request import RequestStatus  # type: ignore[import-not-found]  # noqa: E402

from agentmars.sdk.events import AnyEvent, KVStats, SessionPause, SessionResume  # noqa: E402
from agentmars.server.engines.vllm.cpu_tier.labels import Label  # noqa: E402
from agentmars.server.engines.vllm.displacement import displace  # noqa: E402
from agentmars.server.engines.vllm.hints import HintInbox  # noqa: E402
from agentmars.server.engines.vllm.kv_status import KVStatusPublisher  # noqa: E402
from agentmars.server.engines.vllm.paused import PausedSessions  # noqa: E402
from agentmars.server.engines.vllm.pins import PinTable  # noqa: E402
from agentmars.server.engines.vllm.preemption import steer_victim  # noqa: E402
from agentmars.server.engines.vllm.prefix_lookup import PrefixLookup  # noqa: E402
from agentmars.server.engines.vllm.ticker import IdleTicker  # noqa: E402
from agentmars.server.engines.vllm.views import (  # noqa: E402
    RequestCall,
    SchedulerView,
    SessionBook,
    session_of,
)
from agentmars.server.engines.vllm.waiting_order import WaitingOrder  # noqa: E402
from agentmars.server.policies.feed import EventFeed  # noqa: E402
from agentmars.server.policies.interface import EngineHalf, Offload, Pin, SessionAction  # noqa: E402
from agentmars.server.policies.views import CallView  # noqa: E402

# A child of vLLM's logger, so the plugin's lines go where vLLM's go.
logger = logging.getLogger("vllm.agentmars.plugin")

NORMAL_ENDS = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED})
"""Finished calls whose session goes on (aborted, ignored or failed calls do not pin)."""

RUNNING = RequestStatus.RUNNING

WAITING_STATES = frozenset({RequestStatus.WAITING, RequestStatus.PREEMPTED})
"""Calls in vLLM's waiting loop (the ones ``scheduler_reserve_full_isl`` applies to)."""

_ARRIVAL = operator.attrgetter("arrival_time", "request_id")


def _arrival_key(request: Any) -> tuple[str, Any]:
    """The waiting order under the default ``Policy.priority`` (no session needed:
    pins do not change it)."""
    return "", _ARRIVAL(request)


HELD_POLL_S = 0.01
"""How long an engine whose only requests are held for paused sessions waits between
its (empty) steps (ours: vLLM keeps stepping while it has requests, and the held ones
count, so that a resume is taken up; this keeps that from spinning a core)."""

MAX_STEPS_IN_FLIGHT = 8
"""Steps scheduled and not yet answered, at most (1 synchronous, 2 asynchronous, more
with pipeline parallelism): a bound on the plugin's record of them."""

# The mixin goes before vLLM's scheduler class in the bases; mypy sees vLLM as Any.
_MixinBase: Any = object


class AgentmarsSchedulerMixin(_MixinBase):  # type: ignore[misc]
    """The plugin's behaviour over any V1 ``Scheduler`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.policy != SchedulingPolicy.FCFS:
            raise PluginConfigError(
                "the agentmars plugin orders the waiting queue itself: start vLLM with "
                f"--scheduling-policy fcfs (the default), not {self.policy.value}"
            )
        config = PluginConfig.from_env(os.environ)
        self.cpu_tier = self._find_cpu_tier()
        if self.cpu_tier is not None:
            config = dataclasses.replace(config, cpu_tier=True)
        self.agentmars_policy_name, self.agentmars_policy = config.make_engine_half()
        self.pin_table = PinTable(
            self.kv_cache_manager.block_pool, self.block_size, announce=self._announce_pin
        )
        self.session_book = SessionBook()
        self.engine_view = SchedulerView(
            self, self.pin_table, self.session_book, costs=config.costs(), cpu_tier=self.cpu_tier
        )
        self._cpu_free_blocks = self.engine_view.cpu_free_blocks
        """The CPU tier's free blocks as of the last step (the status thread reads this,
        not the tier, which the scheduler's thread changes)."""
        self.feed = EventFeed(self._deliver)
        self._stock_allocate_slots = self.kv_cache_manager.allocate_slots
        self._install_hooks()
        self._step_started: dict[int, float] = {}
        self.steps = 0
        """Steps that scheduled any token."""
        self._status = self._start_status(config)
        self._hints = HintInbox(config.hints_address) if config.hints_address else None
        self.agentmars_policy.publish = self._publish
        self._lock = threading.RLock()
        self._paused = PausedSessions()
        interval = self.agentmars_policy.tick_interval_s
        self._next_tick_s = 0.0 if interval is not None else math.inf
        self._ticker = IdleTicker(interval, self._tick_if_idle) if interval else None
        logger.info("agentmars policy %s %s", self.agentmars_policy_name, dict(config.settings))
        if vllm_series(vllm.__version__) != ENGINE_VLLM:
            logger.warning(
                "agentmars: the plugin is verified on vLLM %s at the scheduler level only, "
                "not on the full engine (verified: vLLM %s.x; docs/vllm-plugin.md "
                '"Compatibility")',
                vllm.__version__,
                ENGINE_VLLM,
            )

    def _install_hooks(self) -> None:
        """Hook vLLM where the policy decides. Where it keeps the default decision,
        which is vLLM's own, vLLM's method runs unhooked: hooks vLLM calls for every
        scheduled call add up to a tenth of ``schedule()`` (bench_schedule)."""
        policy = type(self.agentmars_policy)
        # The default priority is the arrival (then, as for every policy, the request
        # id): the same order, read from the requests without building their views.
        arrival_order = policy.priority is EngineHalf.priority
        # A priority that reads only the call and the pins is kept per waiting call
        # (with its session) until that session's pin changes, or its refresh.
        self._pins_change_keys = not arrival_order and (
            policy.priority_reads_pins_only or bool(policy.priority_refresh_s)
        )
        self._sort_key = _arrival_key if arrival_order else self._priority_key
        self._waiting_order = WaitingOrder(
            self._sort_key,
            kept=arrival_order or self._pins_change_keys,
            is_waiting=lambda request: request.status in WAITING_STATES,
        )
        # A preemptive policy's waiting calls may displace running ones (schedule()).
        self._preemptive = bool(policy.preemptive)
        self._chunks = policy.chunk is not EngineHalf.chunk
        refresh = self.agentmars_policy.priority_refresh_s
        self._next_refresh_s = time.monotonic() + refresh if refresh else math.inf
        # A policy that lets a waiting call start on less than its whole prompt says
        # so per call, where vLLM is about to allocate with scheduler_reserve_full_isl.
        self._partial_starts = policy.may_start_partial is not EngineHalf.may_start_partial
        if not self.agentmars_policy.reserve_full_prompt:
            self.scheduler_reserve_full_isl = False
        # The default victim is the last running call, the one vLLM takes anyway.
        self._steers_victims = policy.victim is not EngineHalf.victim
        # The default on_call_finished never pins.
        pins = policy.on_call_finished is not EngineHalf.on_call_finished
        self._allocate_with_pins: Callable[..., Any] | None = None
        if pins or self._steers_victims:
            # allocate_slots is where both of schedule()'s loops learn that KV is short,
            # right before they preempt: wrapping it lets pins go first.
            self._allocate_with_pins = self._hooked_allocate_slots()
            self.kv_cache_manager.allocate_slots = self._allocate_with_pins
        self._routes_allocations = self._allocate_with_pins is not None and (
            self._allocations_bounded()
        )
        if self._chunks or self._partial_starts or self._routes_allocations:
            self._reserve_prefill_lookahead = self._hooked_reserve_prefill_lookahead()
        # A policy that keeps KV makes vLLM's lookups walk long hits (prefix_lookup).
        lookup = PrefixLookup.of(self)
        if lookup is not None:
            self._get_local_prefix_cache_hit = lookup.hit
        logger.info("agentmars: prefix lookups by %s", "vLLM" if lookup is None else "the plugin")

    def _allocations_bounded(self) -> bool:
        """Whether the wrapper's work on an allocation is known before it (what
        ``_hooked_reserve_prefill_lookahead`` routes by): with one full-attention KV
        group a running call holds the blocks of its computed tokens, so ``n`` more
        tokens and vLLM's lookahead need at most ``cdiv(n + lookahead, block_size)``
        new blocks; and with no KV connector each of vLLM's allocations follows its
        ``_reserve_prefill_lookahead`` (an asynchronous KV load skips it)."""
        groups = self.kv_cache_config.kv_cache_groups
        return (
            self.connector is None
            and len(groups) == 1
            and type(groups[0].kv_cache_spec) is FullAttentionSpec
            and groups[0].kv_cache_spec.block_size == self.block_size
        )

    def _find_cpu_tier(self) -> Any:
        """The agentmars CPU tier, if vLLM runs the ``OffloadingConnector`` with our
        manager (``cpu_tier``; docs/vllm-plugin.md "The CPU KV tier"); else None, and
        the policy gets no ``cpu-tier``."""
        connector = self.get_kv_connector()
        if connector is None:
            return None
        # Imported only here: it loads vLLM's offloading modules.
        from agentmars.server.engines.vllm.cpu_tier.offload import CpuTier

        tier = CpuTier.of(self)
        if tier is None:
            logger.info(
                "agentmars: KV connector %s is not the agentmars CPU tier: no cpu-tier",
                type(connector).__name__,
            )
        else:
            logger.info("agentmars: CPU KV tier of %d blocks", tier.total_blocks)
        return tier

    def _start_status(self, config: PluginConfig) -> KVStatusPublisher | None:
        if config.status_file is None and config.status_address is None:
            return None
        return KVStatusPublisher(
            self.kv_stats,
            path=config.status_file,
            address=config.status_address,
            hz=config.status_hz,
        )

    def kv_stats(self) -> KVStats:
        """The block pool now, the pins and their releases by reason
        (``events.ReleaseReason``), and the steps so far."""
        pins = self.pin_table
        return KVStats.of_pool(
            total=self.engine_view.total_blocks,
            free=self.engine_view.free_blocks,
            pinned=pins.pinned_blocks,
            source="engine",
            pins=len(pins),
            released=dict(pins.released),
            cpu_total_blocks=self.engine_view.cpu_total_blocks,
            cpu_free_blocks=self._cpu_free_blocks,
            steps=self.steps,
        )

    def _publish(self, event: AnyEvent) -> None:
        """An event the engine half adds to the stream: to the half itself, and out to
        the gateway (its admission half) on the side channel."""
        if event.source != "engine":
            event = event.model_copy(update={"source": "engine"})
        self.feed(event)
        if self._status is not None:
            self._status.send_event(event)

    def _announce_pin(self, make: Callable[[], AnyEvent]) -> None:
        """A pin taken or released: to the gateway, the event made off this thread."""
        if self._status is not None:
            self._status.send_made(make)

    # --- scheduling --------------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            # Each part is looked at before it is called: cold after vLLM's own work,
            # the calls cost more than the nothing most of them do at most steps.
            if self._hints is not None and not self._hints.empty():
                self._take_hints()
            if self.pin_table.expiries:
                self.pin_table.release_expired(self.engine_view.now)
            now = time.monotonic()
            if now >= self._next_tick_s:
                self._tick(now)
            if self.pin_table.changed or now >= self._next_refresh_s:
                self._forget_changed_keys(now)
            if not self._waiting_order.settled:
                self._waiting_order.order(self.waiting)
            if self._preemptive:
                self._displace_for_waiting()
            output = super().schedule(*args, **kwargs)
            if self.cpu_tier is not None:
                # The connector prepared this step's stores (build_connector_meta).
                self._cpu_free_blocks = self.engine_view.cpu_free_blocks
            self.steps += output.total_num_scheduled_tokens > 0
            self._step_started[id(output)] = time.monotonic()
            if len(self._step_started) > MAX_STEPS_IN_FLIGHT:
                # A step whose output never came back (the engine dropped it): forgotten.
                del self._step_started[next(iter(self._step_started))]
            only_held = self._paused.requests and not (self.running or self.waiting)
        if only_held:
            time.sleep(HELD_POLL_S)
        return output

    def add_request(self, request: Any) -> None:
        with self._lock:
            session_id = session_of(request)
            if self.cpu_tier is not None and session_id is not None:
                # Before vLLM's connector sees it: the chunks it stores and reuses are
                # the session's. A call in the engine makes its session busy, unless
                # it is held (an offloaded session stays idle until resumed).
                self.cpu_tier.request(request.request_id, session_id)
                if session_id not in self._paused:
                    self.cpu_tier.label(session_id, Label.BUSY)
            super().add_request(request)
            if session_id is not None and session_id in self._paused and request in self.waiting:
                self.waiting.remove_request(request)
                self._paused.hold(session_id, [request])

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        with self._lock:
            finished = super().finish_requests(request_ids, finished_status)
            if self._paused:
                self._paused.forget({request.request_id for request in finished})
            return finished

    def get_num_unfinished_requests(self) -> int:
        # Held requests count: vLLM keeps stepping, so a resume is taken up at once.
        return int(super().get_num_unfinished_requests()) + self._paused.requests

    # --- displacement (EngineHalf.preemptive) -------------------------------------------

    def _displace_for_waiting(self) -> None:
        """Preempt the running calls ranked after the first waiting call vLLM's pass
        will look at, the last-ranked first, while that call cannot start (a full
        batch, or too few free blocks once other sessions' pins are dropped), so that
        the pass admits it (docs/vllm-plugin.md "Displacement")."""
        if not (self.running and self.waiting):
            return
        if self.kv_holding_waiting or self._pause_state != PauseState.UNPAUSED:
            # vLLM's pass takes the calls that hold blocks first, or admits none.
            return
        head = next((r for r in self.waiting if self._looked_at_first(r)), None)
        if head is None:
            return
        now = time.monotonic()
        displaced = displace(
            self._sort_key(head)[1],
            self.running,
            rank=lambda request: self._sort_key(request)[1],
            blocked=lambda: self._cannot_start(head),
            preempt=lambda request: self._displace(request, now),
        )
        if displaced:
            # vLLM put them at the queue's head: back to their places, after the call.
            self._waiting_order.order(self.waiting)
            logger.debug(
                "agentmars: %s displaced %s",
                head.request_id,
                [request.request_id for request in displaced],
            )

    @staticmethod
    def _looked_at_first(request: Any) -> bool:
        """Whether vLLM's pass would try to admit this waiting call rather than skip it
        (a call blocked on a grammar or a transfer, or one whose stale output is still
        on its way, is skipped)."""
        if request.status not in WAITING_STATES:
            return False
        return not (request.num_stale_output_tokens and not request.drop_stale_output)

    def _cannot_start(self, request: Any) -> bool:
        """vLLM's pass would not admit this waiting call now: the batch is full (vLLM's
        ``max_num_active_reqs``, which is ``--max-num-seqs`` unless set apart), or the
        blocks it needs to start are not free, even once other sessions' pins are
        dropped in the policy's ``reclaim`` order (as the pass would drop them)."""
        seats = len(self.running) + self.num_waiting_for_streaming_input
        if seats >= self.max_num_active_reqs:
            return True
        view = self.engine_view
        missing = self._blocks_to_start(request) - view.free_blocks
        if missing <= 0:
            return False
        pins = self._others_pins(request)
        if not pins:
            return True
        for pin in self.agentmars_policy.reclaim(pins, missing, view):
            self.pin_table.release(pin.session_id, "pressure")
            if self._blocks_to_start(request) <= view.free_blocks:
                return False
        return True

    def _blocks_to_start(self, request: Any) -> int:
        """The free blocks vLLM's allocation would want for this waiting call to start:
        its whole prompt (as ``scheduler_reserve_full_isl`` checks) or, when the policy
        lets it start on less (``_reserve_full``), its first chunk (the whole token
        budget, capped by the policy's ``chunk``); less the cached blocks of its prefix
        hit that others hold (a pin among them), plus vLLM's watermark. NOTE: ours —
        vLLM's count is the same for a model with one full-attention KV group; a chunk
        here ignores what the running calls take of the token budget first."""
        view, policy = self.engine_view, self.agentmars_policy
        groups, hit_tokens, _, _ = self._get_local_prefix_cache_hit(request)
        hit = groups.blocks[0] if groups.blocks else ()
        # A cached block no one holds is in the free queue: taking it uses a free block.
        held = sum(1 for block in hit if block.ref_cnt > 0)
        tokens = min(request.num_tokens, self.max_model_len)
        needed = view.blocks_for(tokens) - held
        whole = policy.reserve_full_prompt and not (
            self._partial_starts
            and needed > view.free_blocks
            and policy.may_start_partial(view.call(request), view)
        )
        if not whole:
            chunk = min(tokens - hit_tokens, self.max_num_scheduled_tokens)
            if self._chunks:
                fit = view.free_blocks * view.block_size
                chunk = min(chunk, policy.chunk(view.call(request), chunk, fit, view))
            if chunk <= 0:
                return 0  # the policy skips it in this step: nothing to make room for
            needed = view.blocks_for(hit_tokens + chunk) - held
        return needed + (self.kv_cache_manager.watermark_blocks if self.running else 0)

    def _displace(self, request: Any, now: float) -> bool:
        """Preempt a running call as vLLM's own preemption does (its KV is freed and
        recomputed); False if its blocks cannot be freed now (a connector's deferred
        free)."""
        if not self._request_blocks_can_be_freed(request):
            return False
        self.running.remove(request)
        self._preempt_request(request, now, drop_stale_output=self.requires_kv_delivery)
        return True

    # --- ticks and pauses ---------------------------------------------------------------

    def _tick_if_due(self) -> None:
        now = time.monotonic()
        if now >= self._next_tick_s:
            self._tick(now)

    def _tick(self, now: float) -> None:
        """The policy's tick (due at ``_next_tick_s``: never for a policy without one)."""
        self._next_tick_s = now + (self.agentmars_policy.tick_interval_s or 0.0)
        self._apply(self.agentmars_policy.tick(self.engine_view))

    def _tick_if_idle(self) -> None:
        """The idle ticker's call (its own thread): events, expiries and a due tick,
        when vLLM has nothing running or waiting (else ``schedule()`` does it)."""
        if self.running or self.waiting:
            # Busy: schedule() ticks. Looked at without the lock (a stale answer only
            # delays the tick to the next wake-up), so that a busy engine's steps
            # never wait for this thread: one wait for the lock, and the GIL handed
            # back and forth, cost a step milliseconds (bench_schedule).
            return
        with self._lock:
            if not (self.running or self.waiting):
                self._take_hints()
                self.pin_table.release_expired(self.engine_view.now)
                self._tick_if_due()

    def _apply(self, actions: Sequence[SessionAction]) -> None:
        for action in actions:
            session_id = action.session_id
            if action.kind == "offload" and self.cpu_tier is not None:
                self._offload_pin(session_id, action.blocks)
            elif action.kind in ("unpin", "offload"):
                # Without a CPU tier (cpu_free_blocks is 0) a policy that uses one
                # offloads nothing; should it ask, the pin is released.
                self.pin_table.release(session_id, "policy")
                self._label(session_id, Label.INACTIVE)
            elif action.kind == "pause" and session_id not in self._paused:
                self._pause(session_id, action.reason)
            elif action.kind == "resume" and session_id in self._paused:
                self._resume(session_id)
            # A ``prefetch`` does nothing here (no Capability.PREFETCH): vLLM's
            # offloading connector loads a CPU-tier copy only for the request that
            # asks for it, so the session's next call loads its copy as it comes.

    def _label(self, session_id: str, label: Label) -> None:
        if self.cpu_tier is not None:
            self.cpu_tier.label(session_id, label)

    def _offload_pin(self, session_id: str, blocks: int | None) -> None:
        """A tick's ``offload``: the pin's blocks are in the CPU tier already (vLLM
        stores write-through), so the pin goes on the GPU (reason ``policy``) and the
        session is labelled idle there, or inactive if the tier has none of it (then
        this is a release). ``blocks``: only the pin's last ``blocks`` blocks go, the
        rest stays pinned (InferCept's swap budget)."""
        tier = self.cpu_tier
        pin = self.pin_table.get(session_id)
        if pin is None:
            tier.offload_known(session_id)
            return
        hashes = [block.block_hash for block in pin.held]
        tier.offload(session_id, hashes, finished=False)
        if blocks is not None and blocks < pin.blocks:
            self.pin_table.release_tail(session_id, blocks)
        else:
            self.pin_table.release(session_id, "policy")

    def _pause(self, session_id: str, reason: str) -> None:
        self.pin_table.release(session_id, "paused")
        if self.cpu_tier is not None and self.cpu_tier.label_of(session_id) is not Label.IDLE:
            # An offloaded session paused (MORI's gate) keeps its copy: still idle.
            self.cpu_tier.label(session_id, Label.INACTIVE)
        self._paused.pause(session_id)
        now = time.monotonic()
        for request in [r for r in self.running if session_of(r) == session_id]:
            self.running.remove(request)
            self._preempt_request(request, now)
        # vLLM's preemption put the running calls back at the head of the waiting
        # queue: this one list holds each call once (holding them twice made a resume
        # queue one call twice, and vLLM's loop met it running: "Invalid request
        # status: RUNNING").
        waiting = [r for r in self.waiting if session_of(r) == session_id]
        if waiting:
            self.waiting.remove_requests(waiting)
        self._paused.hold(session_id, waiting)
        self._publish(SessionPause(session_id=session_id, source="engine", reason=reason))

    def _resume(self, session_id: str) -> None:
        self._label(session_id, Label.BUSY)
        for request in self._paused.resume(session_id):
            self.waiting.add_request(request)
            self._waiting_order.joined(request)
        self._publish(SessionResume(session_id=session_id, source="engine"))

    def take_event(self, event: AnyEvent) -> None:
        """An event of the stream handed in directly, as the side channel brings one
        (the schedule bench's driver ends its sessions so, in step with its steps)."""
        with self._lock:
            self.feed(event)

    def _take_hints(self) -> None:
        """The gateway's events since the last step, each boundary once."""
        if self._hints is None:
            return
        for event in self._hints.drain():
            self.feed(event)

    def _deliver(self, event: AnyEvent) -> None:
        """To the half, to the view's tool figures; a session's end releases its pin."""
        self.agentmars_policy.on_event(event)
        self.engine_view.tools.observe(event)
        if event.kind == "session_end":
            self.pin_table.release(event.session_id, "session_end")
            self.session_book.forget_session(event.session_id)
            if self.cpu_tier is not None:
                dropped = self.cpu_tier.end(event.session_id)
                logger.info(
                    "agentmars: session %s ended: %d CPU-tier blocks discarded",
                    event.session_id,
                    dropped,
                )

    def _enqueue_waiting_request(self, request: Any) -> None:
        super()._enqueue_waiting_request(request)
        self._waiting_order.joined(request)

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super()._preempt_request(request, *args, **kwargs)
        self._waiting_order.joined(request)

    def _priority_key(self, request: Any) -> tuple[str, Any]:
        """A waiting call's session and sort key: the policy's priority, then arrival
        and id."""
        view = self.engine_view
        call = view.call(request)
        priority = self.agentmars_policy.priority(call, view)
        return call.session_id, (priority, request.arrival_time, request.request_id)

    def _forget_changed_keys(self, now: float) -> None:
        """Forget the kept keys of the sessions whose pin changed since the last step,
        and all of them every ``priority_refresh_s`` (due at ``_next_refresh_s``)."""
        if now >= self._next_refresh_s:
            self._waiting_order.forget_all()
            self._next_refresh_s = now + (self.agentmars_policy.priority_refresh_s or math.inf)
        changed = self.pin_table.changed
        if changed:
            if self._pins_change_keys:
                self._waiting_order.forget_sessions(changed, self.requests)
            changed.clear()

    def _hooked_reserve_prefill_lookahead(self) -> Callable[[Any, int, int], int]:
        """vLLM's last word on a chunk's size before it allocates, in both of
        ``schedule()``'s loops: the policy's ``chunk`` caps a prompt's chunk here, a
        waiting call's ``scheduler_reserve_full_isl`` is set from the policy, and the
        allocation that follows is routed past the pins' wrapper (``allocate_slots``)
        where the wrapper would do nothing (``_allocations_bounded``):

        - a running call's that cannot fail, its tokens and the lookahead fitting the
          free blocks: the wrapper acts for a running call only on a failure;
        - a waiting call's while no pin is held: there is nothing to reclaim or hand
          over, and a waiting call's failure steers no victim.

        vLLM asks for every running call at every step, most of them decodes: without
        a multi-token drafter its own rule keeps a decode's count, so the closure
        answers those at once, reading nothing off ``self``. (Through the wrapper,
        every decode's allocation was a quarter of what the plugin added to MARS's
        step: py-spy on bench_schedule's queue.)"""
        stock = super()._reserve_prefill_lookahead
        no_drafter = self.num_prefill_lookahead <= 1
        decide = self._chunk_and_start if self._chunks or self._partial_starts else None
        routes = self._routes_allocations
        manager = self.kv_cache_manager
        wrapped, direct = self._allocate_with_pins, self._stock_allocate_slots
        free_queue = manager.block_pool.free_block_queue
        pins = self.pin_table.pins
        block_size, lookahead = self.block_size, self.num_lookahead_tokens

        def reserve_prefill_lookahead(
            request: Any, num_computed_tokens: int, num_new_tokens: int
        ) -> int:
            if no_drafter and num_computed_tokens >= request.num_prompt_tokens:
                tokens = num_new_tokens
            else:
                tokens = stock(request, num_computed_tokens, num_new_tokens)
                if decide is not None:
                    tokens = decide(request, num_computed_tokens, tokens)
            if routes:
                if request.status is RUNNING:
                    bare = tokens + lookahead <= free_queue.num_free_blocks * block_size
                else:
                    bare = not pins
                manager.allocate_slots = direct if bare else wrapped
            return tokens

        return reserve_prefill_lookahead

    def _chunk_and_start(self, request: Any, num_computed_tokens: int, tokens: int) -> int:
        """A prompt's chunk as the policy caps it (``tokens``: vLLM's); for a waiting
        call, whether it must find blocks for its whole prompt first."""
        view = self.engine_view
        free = view.free_blocks
        call = view.call(request)
        if self._partial_starts and request.status in WAITING_STATES:
            # Set for every waiting call, so none inherits the previous one's answer.
            self.scheduler_reserve_full_isl = self._reserve_full(call, tokens, free)
        if tokens == 0 or num_computed_tokens >= request.num_prompt_tokens:
            return tokens
        # A running call still has room in its last block: it holds the blocks of its
        # computed tokens (allocated with the steps that computed them; NOTE: a
        # drafter's lookahead slots are not counted, which only shrinks the room). A
        # waiting call holds no blocks yet (its prefix hit is cached blocks, which
        # need no free ones).
        block_size = self.block_size
        room = -num_computed_tokens % block_size if request.status is RUNNING else 0
        chunk = self.agentmars_policy.chunk(call, tokens, room + free * block_size, view)
        return max(0, min(tokens, chunk))

    def _reserve_full(self, call: RequestCall, tokens: int, free: int) -> bool:
        """Whether vLLM must find blocks for the whole prompt before the call starts:
        not if the policy never asks for it; yes when they are free (vLLM's own check
        then passes); else unless the policy lets this call start on what fits.
        NOTE: the count takes every block of the prompt but its session's pinned ones
        (referenced, so they take no free block), where vLLM's own count also leaves
        out other referenced cached blocks: it may ask the policy about a call vLLM
        would have let in whole, never the other way round."""
        policy, view = self.agentmars_policy, self.engine_view
        if not policy.reserve_full_prompt:
            return False
        if tokens == 0:
            return True
        pin = view.pin_of(call.session_id)
        needed = view.blocks_for(call.num_tokens) - (pin.blocks if pin is not None else 0)
        if needed <= free:
            return True
        return not policy.may_start_partial(call, view)

    def update_from_output(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._update_from_output(scheduler_output, *args, **kwargs)

    def _update_from_output(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        started = self._step_started.pop(id(scheduler_output), None)
        if started is not None:
            # NOTE: a call's service time is the wall time of the steps it was part of
            # (schedule to output), as the simulator counts it.
            elapsed = time.monotonic() - started
            service = self.session_book.service_s
            decoded = False
            for request_id, tokens in scheduler_output.num_scheduled_tokens.items():
                service[request_id] = service.get(request_id, 0.0) + elapsed
                if tokens == 1 and not decoded:
                    request = self.requests.get(request_id)
                    decoded = request is not None and request.num_output_tokens > 0
            if decoded:
                # Seed 002's step-level TPOT is read from these (EngineView).
                self.engine_view.decode_steps += 1
                self.engine_view.decode_time_s += elapsed
        outputs = super().update_from_output(scheduler_output, *args, **kwargs)
        if self.cpu_tier is not None:
            # The connector completed this step's stores and loads.
            self._cpu_free_blocks = self.engine_view.cpu_free_blocks
        return outputs

    # --- KV retention -------------------------------------------------------------------

    def _hooked_allocate_slots(self) -> Callable[..., Any]:
        """``allocate_slots`` with the pins' part: on a failure, other sessions' pins go
        first (``_after_failed_allocation``); on a success of a waiting call, its
        session's pin is handed over to it.

        vLLM calls this for every scheduled call at every step, most of them running
        calls' decodes (``num_lookahead_tokens`` their only keyword): the closure
        passes those on without packing the keywords and reads nothing off ``self``
        (in a microbenchmark of the two shapes, 0.14 against 0.54 us over vLLM's own
        call; bench_schedule's MARS steps make ~17 such calls each)."""
        stock = self._stock_allocate_slots
        pins = self.pin_table.pins
        release = self.pin_table.release
        after_failure = self._after_failed_allocation

        def allocate_slots(
            request: Any, num_new_tokens: int, num_lookahead_tokens: int = 0, **kwargs: Any
        ) -> Any:
            if kwargs:
                blocks = stock(
                    request, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens, **kwargs
                )
            else:
                blocks = stock(request, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens)
            if blocks is None:
                kwargs["num_lookahead_tokens"] = num_lookahead_tokens
                blocks = after_failure(request, num_new_tokens, kwargs)
                if blocks is None:
                    return None
            # A session's next call takes over its pin when it leaves the waiting
            # queue; the other allocations (most: running calls' decodes) are told
            # apart cheaply first.
            if pins and request.status is not RUNNING:
                session_id = session_of(request)
                if session_id in pins:
                    # The call holds its own references to the shared blocks now.
                    release(session_id, "next_call")
            return blocks

        return allocate_slots

    def _after_failed_allocation(
        self, request: Any, num_new_tokens: int, kwargs: dict[str, Any]
    ) -> Any:
        """Drop other sessions' pins and retry; if that fails too, steer vLLM's next
        victim. The blocks, or None."""
        blocks = self._reclaim_and_retry(request, num_new_tokens, **kwargs)
        if blocks is None and self._steers_victims and request.status is RUNNING:
            # vLLM preempts the last running call next: make it the policy's victim (a
            # waiting call's failure preempts nothing).
            steer_victim(self.running, request, self._choose_victim)
        return blocks

    def _reclaim_and_retry(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        """Drop other sessions' pins in the policy's order until the allocation fits."""
        pins = self._others_pins(request)
        if not pins:
            return None
        needed = self.engine_view.blocks_for(request.num_tokens) - self.engine_view.free_blocks
        for pin in self.agentmars_policy.reclaim(pins, max(needed, 1), self.engine_view):
            self.pin_table.release(pin.session_id, "pressure")
            blocks = self._stock_allocate_slots(request, *args, **kwargs)
            if blocks is not None:
                return blocks
        return None

    def _others_pins(self, request: Any) -> list[Any]:
        """The pins of the sessions other than the request's, the ones pressure may
        drop for it (with no pin held, its session is not looked up)."""
        held = self.pin_table.pins
        if not held:
            return []
        own = session_of(request)
        return [pin for pin in held.values() if pin.session_id != own]

    def _choose_victim(self, candidates: Sequence[Any]) -> Any:
        view = self.engine_view
        calls: list[CallView] = [view.call(request) for request in candidates]
        chosen = self.agentmars_policy.victim(calls, view)
        return candidates[calls.index(chosen)]

    def _free_blocks(self, request: Any) -> None:
        self._settle_finished(request)
        super()._free_blocks(request)

    def _settle_finished(self, request: Any) -> None:
        """Pin the finished call's hashed blocks if the policy says so; this runs before
        vLLM drops the call's own references, so the blocks never reach the free queue."""
        self._pin_if_asked(request)
        # Only now: the policy has seen the call, its service time included.
        self.session_book.forget_request(request.request_id)
        self._waiting_order.left(request.request_id)

    def _pin_if_asked(self, request: Any) -> None:
        session_id = session_of(request)
        if session_id is None:
            return
        if request.status not in NORMAL_ENDS:
            self.pin_table.release(session_id, "ended")
            self._label(session_id, Label.INACTIVE)
            return
        call = self.engine_view.call(request)
        decision = self.agentmars_policy.on_call_finished(call, self.engine_view)
        if not isinstance(decision, Pin):
            if isinstance(decision, Offload) and self.cpu_tier is not None:
                # Its blocks are in the CPU tier (write-through): nothing is pinned.
                hashes = [block.block_hash for block in self._hashed_blocks(request)]
                self.cpu_tier.offload(session_id, hashes, finished=True)
            else:
                self._label(session_id, Label.INACTIVE)
            return
        self._label(session_id, Label.BUSY)
        blocks = self._hashed_blocks(request)
        if blocks:
            self.pin_table.pin(
                session_id,
                blocks,
                now=self.engine_view.now,
                ttl_s=decision.ttl_s,
                session_arrival_s=call.session_arrival_s,
            )

    def _hashed_blocks(self, request: Any) -> list[Any]:
        groups = self.kv_cache_manager.get_blocks(request.request_id).blocks
        return [
            block
            for group in groups
            for block in group
            if block.block_hash is not None and not block.is_null
        ]

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        released = self.pin_table.release_all("reset")
        logger.info("agentmars: released %d pins for a prefix-cache reset", released)
        return bool(super().reset_prefix_cache(*args, **kwargs))

    def shutdown(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        released = self.pin_table.release_all("shutdown")
        logger.info("agentmars: released %d pins at shutdown", released)
        if self._status is not None:
            self._status.stop()
        if self._hints is not None:
            self._hints.stop()
        super().shutdown()


class AgentmarsScheduler(AgentmarsSchedulerMixin, Scheduler):  # type: ignore[misc]
    """vLLM's synchronous scheduler with the agentmars policy (the CPU backend's)."""


class AgentmarsAsyncScheduler(AgentmarsSchedulerMixin, AsyncScheduler):  # type: ignore[misc]
    """vLLM's asynchronous scheduler with the agentmars policy (the GPU default)."""
