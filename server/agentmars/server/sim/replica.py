"""One engine replica of the simulated node: its KV cache, scheduler and engine half,
its steps (whole, in an SM partition, or decode-only stretches taken in one jump),
its ticks and its KV figures. The node (``sim.engine.SimEngine``) holds what the
replicas share: the clock and its events, the gateway and the admission half, the
sessions, the host's CPUs and their tools. Several replicas are seed 003's data
parallelism (DP=3 in §6.2.2): each a whole engine with its own GPU, behind one gateway
that places each session on one of them for its life (``AdmissionHalf.place``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentmars.sdk.events import AnyEvent, KVStats
from agentmars.server.policies.interface import EngineHalf, SessionAction
from agentmars.server.policies.tool_activity import FollowsTools
from agentmars.server.profiles.cost_model import StepShape
from agentmars.server.sim.clock import Rank
from agentmars.server.sim.engine_core import KVEngineView, partition_time
from agentmars.server.sim.entities import Call
from agentmars.server.sim.entities import Pin as PinEntity
from agentmars.server.sim.kv_cache import KVCache
from agentmars.server.sim.scheduler import Scheduler, Step

if TYPE_CHECKING:
    from agentmars.server.sim.engine import SimEngine


class Replica(KVEngineView, FollowsTools):
    """One engine of the node; it is also its engine half's ``EngineView``."""

    def __init__(
        self,
        node: SimEngine,
        index: int,
        engine_half: EngineHalf,
        *,
        num_blocks: int,
        cpu_blocks: int,
        partitioned: bool,
    ) -> None:
        self.node = node
        self.index = index
        self.engine_half = engine_half
        self.profile = node.profile
        self.config = node.config
        self.cost = node.cost
        self.tools = node.tools
        self.partitioned = partitioned
        """Steps run in the half's SM partition (``decode_sm_share``), prefills and
        decodes at the same time (docs/simulator.md "The SM partition")."""
        self._prefill_busy = False
        """The prefill partition computes a chunk (until its ``_on_prefill_end``)."""
        self.kv = KVCache(
            num_blocks,
            self.profile.block_size,
            cpu_blocks,
            self._count_eviction,
            offload_evicted=engine_half.offload_evicted,
            transfer_time=self.cost.transfer_time,
            watch=self,
        )
        self.scheduler = Scheduler(
            self.kv,
            engine_half,
            self,
            max_num_seqs=self.config.max_num_seqs or self.profile.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens
            or self.profile.max_num_batched_tokens,
            load_done_at=self._load_done_at,
            displaced_keep_kv=self.config.displaced_keep_kv,
        )
        self.sessions = 0
        """Sessions placed here that have not ended."""
        self.steps = 0
        self._stepping = False
        self._start_pending = False
        self._kv_published: tuple[int, int, int] | None = None
        self._kv_stats_pending = False
        self._channel_free_s = 0.0

    # --- EngineView (the rest is KVEngineView's) ------------------------------------------

    @property
    def now(self) -> float:
        return self.node.now

    @property
    def active_sessions(self) -> int:
        return self.sessions

    @property
    def tool_cores(self) -> int:
        return self.node.host.cores

    def stamp(self) -> dict[str, Any]:
        return self.node.stamp()

    def start(self) -> None:
        """The replica's first KV figures, and its ticks."""
        self._publish_kv_stats(None)
        if self.engine_half.tick_interval_s:
            self.node.push(self.engine_half.tick_interval_s, Rank.TICK, self._on_tick)

    def pool_stats(self, steps: int, **stamp: Any) -> KVStats:
        replica = self.index if self.node.replicas_count > 1 else None
        return super().pool_stats(steps, replica=replica, **stamp)

    def _count_step(self, step: Step) -> None:
        self.steps += 1
        record = self.node.record
        record.steps += 1
        record.computed_tokens += sum(tokens for call, tokens in step.batch if call.blocks)

    # --- engine steps ------------------------------------------------------------------

    def wake(self) -> None:
        """Start a step at this instant (after its other events) if the engine idles."""
        if not self._stepping and not self._start_pending:
            self._start_pending = True
            self.node.push(self.now, Rank.STEP_START, self._on_step_start)

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
            self.node.push(jump[1], Rank.STEP_END, self._on_jump_end, (jump[0], jump[1] - self.now))
            return
        step = self.scheduler.schedule(self.now)
        if not step.batch:
            self._wait_for_loads()
            return
        self._stepping = True
        duration = self.step_duration(step, self.now)
        self.node.push(self.now + duration, Rank.STEP_END, self._on_step_end, (step, duration))

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
            self.node.push(jump[1], Rank.STEP_END, self._on_jump_end, (jump[0], jump[1] - self.now))
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
            self.node.push(self.now + duration, Rank.PREFILL_END, self._on_prefill_end, end)
        if decode_step.batch:
            duration = partition_time(self.cost, self.profile, decode_step.batch, share)
            duration += swap_wait
            self._stepping = True
            end = (decode_step, duration)
            self.node.push(self.now + duration, Rank.STEP_END, self._on_step_end, end)
        elif not prefill_step.batch:
            self._wait_for_loads()

    def _on_prefill_end(self, arg: tuple[Step, float]) -> None:
        step, duration = arg
        self._prefill_busy = False
        self._count_step(step)
        # A call preempted meanwhile lost its blocks (``settle`` skips it).
        for call in self.settle(step, duration).produced:
            self.node.add_token(call, 1)
        self._after_step()

    def _wait_for_loads(self) -> None:
        """Nothing could run: wake up when the first CPU-tier load is done."""
        loading = [call.ready_s for call in self.scheduler.running if call.ready_s > self.now]
        if loading:
            self.node.push(min(loading), Rank.STEP_START, self._on_step_start)
            self._start_pending = True

    def _on_step_end(self, arg: tuple[Step, float]) -> None:
        step, duration = arg
        self._stepping = False
        self._count_step(step)
        for call in self.settle(step, duration).produced:
            self.node.add_token(call, 1)
        self._after_step()

    def _after_step(self) -> None:
        self.node.sample_kv()
        if self.scheduler.running or self.scheduler.waiting:
            self.wake()

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
        next_event = self.node.heap[0].time if self.node.heap else float("inf")
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
        self.steps += steps
        self.node.record.steps += steps
        self.decode_steps += steps
        self.decode_time_s += duration
        for call in list(self.scheduler.running):
            call.num_computed_tokens += steps
            call.service_s += duration
            self.node.record.computed_tokens += steps
            self.kv.cache_full_blocks(call)
            self.node.add_token(call, steps)
        self._after_step()

    def on_pin_expiry(self, pin: PinEntity) -> None:
        if self.kv.pins.get(pin.session_id) is not pin:
            return
        if any(call.session_id == pin.session_id for call in self.scheduler.waiting):
            return  # its next call is here: the pin goes when that call is admitted
        self.kv.unpin(pin.session_id, "expired")

    def _on_tick(self, _: None) -> None:
        self._apply(self.engine_half.tick(self))
        if self.partitioned and (self.scheduler.running or self.scheduler.waiting):
            # The partition may have changed: a side that had no SMs may run now.
            self.wake()
        interval = self.engine_half.tick_interval_s
        if interval and self.node.busy():
            self.node.push(self.now + interval, Rank.TICK, self._on_tick)

    def _apply(self, actions: Sequence[SessionAction]) -> None:
        self.apply(actions, self.node.sessions.get)
        self.node.admit_sessions()

    def announce(self, event: AnyEvent) -> None:
        self.node.emit(event)

    def resubmit(self, calls: list[Call]) -> None:
        for call in calls:
            self.node.submit(call)

    def _count_eviction(self, blocks: int) -> None:
        evictions = self.node.record.evictions
        assert evictions is not None  # the simulator's record times every eviction
        if evictions and evictions[-1][0] == self.now:
            evictions[-1] = (self.now, evictions[-1][1] + blocks)
        else:
            evictions.append((self.now, blocks))

    def _load_done_at(self, blocks: int) -> float:
        """Loads from the CPU tier share one transfer channel, one after another."""
        self._channel_free_s = max(self._channel_free_s, self.now) + self.cost.transfer_time(blocks)
        return self._channel_free_s

    def _kv_figures(self) -> tuple[int, int, int]:
        return self.kv.pool.num_free, self.kv.pinned_blocks, self.cpu_free_blocks

    def plan_kv_stats(self) -> None:
        """After a change of the KV figures, publish them at the next sampling instant
        (a multiple of ``kv_stats_interval_s``, as a sampler at that rate would)."""
        if self._kv_stats_pending or self._kv_figures() == self._kv_published:
            return
        interval = self.config.kv_stats_interval_s
        # The next sampling instant strictly after now (a count of samples, with a
        # tolerance, so that exact multiples of the interval are not rounded away).
        due = (math.floor(self.now / interval + 1e-9) + 1) * interval
        self._kv_stats_pending = True
        self.node.push(due, Rank.KV_STATS, self._publish_kv_stats)

    def _publish_kv_stats(self, _: None) -> None:
        self._kv_stats_pending = False
        self._kv_published = self._kv_figures()
        self.node.emit(self.pool_stats(self.steps, **self.stamp()))
        self.node.admit_sessions()
