"""One step of continuous batching, as vLLM V1's ``Scheduler.schedule()`` decides it,
with the policy asked at each decision point.

One loop over a per-step token budget, with no separate prefill and decode phases:
every scheduled call's computed tokens catch up with its tokens, a prompt in chunks
as large as the budget allows. Running calls first, in order; a running call that
cannot get blocks makes room by dropping pins (the policy's order) and then by
preempting running calls (the policy's victim) until it fits or is itself preempted.
Waiting calls are looked at only in a step without preemptions, in the policy's
order, and the first one that does not fit stops the pass (head-of-line blocking, as
in vLLM) — unless the policy is preemptive, when it first displaces the running calls
ranked after it (``EngineHalf.preemptive``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agentmars.server.policies.interface import EngineHalf
from agentmars.server.policies.views import EngineView
from agentmars.server.profiles.cost_model import StepShape, chunk_attention
from agentmars.server.sim.entities import Call, Session
from agentmars.server.sim.kv_cache import KVCache, Loading


@dataclass(slots=True)
class Step:
    """What one step computes."""

    batch: list[tuple[Call, int]] = field(default_factory=list)
    """Scheduled calls and how many tokens of each."""
    preempted: list[Call] = field(default_factory=list)
    admitted: list[Call] = field(default_factory=list)
    """Calls that left the waiting queue in this step (some only start loading)."""
    swapped_out_s: float = 0.0
    """When the KV of the calls this step preempted by swap is in host memory."""

    def shape(self) -> StepShape:
        return batch_shape(self.batch)

    def split(self, first: Callable[[Call], bool]) -> tuple[Step, Step]:
        """Two steps of this one's batch: the calls ``first`` takes, and the rest (the
        preemptions, admissions and swap go with the first)."""
        taken = Step(
            [entry for entry in self.batch if first(entry[0])],
            self.preempted,
            self.admitted,
            self.swapped_out_s,
        )
        rest = Step([entry for entry in self.batch if not first(entry[0])])
        return taken, rest


def batch_shape(batch: list[tuple[Call, int]]) -> StepShape:
    """What a batch of (call, tokens) computes."""
    prefill = attention = seqs = context = 0
    for call, tokens in batch:
        if call.decoding:
            seqs += 1
            context += call.num_tokens
        else:
            prefill += tokens
            attention += chunk_attention(tokens, call.num_computed_tokens)
    return StepShape(prefill, attention, seqs, context)


class Scheduler:
    def __init__(
        self,
        kv: KVCache,
        policy: EngineHalf,
        view: EngineView,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        load_done_at: Callable[[int], float],
        displaced_keep_kv: bool = False,
    ) -> None:
        """``load_done_at(blocks)``: when a load of that many blocks from the CPU tier
        started now would end; ``displaced_keep_kv``: ``SimConfig``'s."""
        self.kv = kv
        self.policy = policy
        self.view = view
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.running: list[Call] = []
        self.waiting: list[Call] = []
        self._load_done_at = load_done_at
        self._displaced_keep_kv = displaced_keep_kv
        self.blocked: Callable[[Call], bool] | None = None
        """Calls not to schedule in this pass (set by an engine whose SM partition
        has a side busy or closed: ``sim.engine``); None: every call may run."""
        self.prefix_queries = 0
        self.prefix_hits = 0

    def schedule(self, now: float) -> Step:
        step = Step()
        budget = self._schedule_running(now, step, self.budget)
        if not step.preempted:
            self._schedule_waiting(now, step, budget)
        return step

    # --- running calls -------------------------------------------------------------------

    def _schedule_running(self, now: float, step: Step, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            call = self.running[index]
            tokens = self._tokens_to_schedule(call, budget, now)
            if tokens == 0:
                index += 1
                continue
            while not self.kv.grow(call, tokens):
                if self._reclaim_pins(self._missing_blocks(call, tokens), call):
                    continue
                victim = self.policy.victim(self.running, self.view)
                assert isinstance(victim, Call) and victim in self.running
                if self.running.index(victim) < index:
                    index -= 1
                budget += self._unschedule(step, victim)
                self.preempt(victim, now, step)
                if victim is call:
                    break
            else:
                step.batch.append((call, tokens))
                budget -= tokens
                index += 1
        return budget

    def _tokens_to_schedule(self, call: Call, budget: int, now: float) -> int:
        if call.ready_s > now or (self.blocked is not None and self.blocked(call)):
            return 0
        tokens = min(call.num_tokens - call.num_computed_tokens, budget)
        if call.in_prefill:
            fit = self._fit_tokens(call)
            tokens = min(tokens, self.policy.chunk(call, tokens, fit, self.view))
        return tokens

    def _missing_blocks(self, call: Call, tokens: int) -> int:
        needed = self.kv.blocks_for(call.num_computed_tokens + tokens) - len(call.blocks)
        return needed - self.kv.pool.num_free

    def _fit_tokens(self, call: Call) -> int:
        """Tokens beyond the call's computed ones its blocks and the free blocks hold."""
        room = len(call.blocks) * self.kv.block_size - call.num_computed_tokens
        return room + self.kv.pool.num_free * self.kv.block_size

    @staticmethod
    def _unschedule(step: Step, victim: Call) -> int:
        for position, (call, tokens) in enumerate(step.batch):
            if call is victim:
                del step.batch[position]
                return tokens
        return 0

    def preempt(self, call: Call, now: float, step: Step | None = None) -> None:
        """Stop a running call and free its KV; its computed tokens are recomputed when
        it runs again, unless the policy swaps them to the CPU tier (``step`` then
        waits for the copy)."""
        self.running.remove(call)
        if self.policy.preempt_by_swap:
            done = self.kv.swap_out(call.session, 0, call.num_hashed_blocks, now)
            if step is not None:
                step.swapped_out_s = max(step.swapped_out_s, done)
        call.recomputing_until = max(call.recomputing_until, call.num_computed_tokens)
        self.kv.free(call)
        call.num_computed_tokens = 0
        call.num_preemptions += 1
        call.record.preemptions += 1
        self.waiting.append(call)
        if step is not None:
            step.preempted.append(call)

    # --- waiting calls -------------------------------------------------------------------

    def _schedule_waiting(self, now: float, step: Step, budget: int) -> None:
        if not self.waiting:
            return
        order = sorted(
            enumerate(self.waiting),
            key=lambda item: (self.policy.priority(item[1], self.view), item[1].arrival_s, item[0]),
        )
        for _, call in order:
            if call.ready_s > now or (self.blocked is not None and self.blocked(call)):
                if self._batch_full(budget):
                    return
                continue
            admitted = self._admit_unless_full(call, now, budget)
            while admitted is None:
                victim = self._displaced_by(call)
                if victim is None:
                    return
                budget += self._unschedule(step, victim)
                if self._displaced_keep_kv:
                    self.kv.unpin(victim.session_id, "replaced")
                    self.kv.pin(victim, now, None)
                self.preempt(victim, now, step)
                admitted = self._admit_unless_full(call, now, budget)
            if admitted:
                step.admitted.append(call)
                if call.ready_s <= now:
                    step.batch.append((call, admitted))
                    budget -= admitted

    def _batch_full(self, budget: int) -> bool:
        return len(self.running) >= self.max_num_seqs or budget <= 0

    def _admit_unless_full(self, call: Call, now: float, budget: int) -> int | None:
        return None if self._batch_full(budget) else self._admit(call, now, budget)

    def _displaced_by(self, call: Call) -> Call | None:
        """The running call a preemptive policy's waiting ``call`` displaces: the
        last-ranked running call, if it ranks after ``call`` (None: none does, or the
        policy is not preemptive)."""
        if not self.policy.preemptive or not self.running:
            return None

        def rank(other: Call) -> tuple[object, float]:
            return (self.policy.priority(other, self.view), other.arrival_s)

        last = max(self.running, key=rank)
        return last if rank(call) < rank(last) else None

    def _admit(self, call: Call, now: float, budget: int) -> int | None:
        """Move ``call`` from waiting to running with its prefix hit and its first chunk.
        Returns the tokens scheduled now (0 if the call only starts loading from the CPU
        tier, or the policy skips it), or None if it does not fit (stop the pass)."""
        prefix = self.kv.lookup(call)
        pinned = self.kv.pinned_blocks
        computed = (prefix.gpu_blocks + prefix.cpu_blocks) * self.kv.block_size
        loading = self.kv.loading(call.session_id)
        loads = prefix.cpu_blocks or (loading is not None and loading.ready_s > now)
        tokens = 0 if loads else min(call.num_tokens - computed, budget)
        if self.policy.reserve_full_prompt:
            whole = self.kv.blocks_to_allocate(prefix, call.num_tokens - computed)
            if not self._room_for(whole, call) and not self.policy.may_start_partial(
                call, self.view
            ):
                return None
        if tokens:
            fit = (self.kv.pool.num_free - prefix.free_gpu_blocks) * self.kv.block_size
            tokens = min(tokens, self.policy.chunk(call, tokens, fit, self.view))
            if tokens == 0:
                return 0
        if not self._room_for(self.kv.blocks_to_allocate(prefix, tokens), call):
            return None
        if self.kv.pinned_blocks != pinned:
            # Dropped pins may have freed blocks of the prefix: look again before taking it.
            prefix = self.kv.lookup(call)
        swapped_out_s = self.kv.swapped_out_s(call.session_id)
        if not self.kv.admit(call, prefix, tokens):
            return None
        self._count_prefix_hit(call, computed)
        self.kv.unpin(call.session_id, "next_call")
        self.kv.release_swapped(call.session_id)
        self.waiting.remove(call)
        self.running.append(call)
        if prefix.cpu_blocks:
            # NOTE: ours — a load of copies still on their way out follows them (the
            # links are pipelined), so the call is ready when both are done.
            call.ready_s = max(self._load_done_at(prefix.cpu_blocks), swapped_out_s)
            call.record.load_s += call.ready_s - now
        if loading is not None and prefix.gpu_blocks:
            self._count_load_ahead(call, loading, now)
        return tokens

    def _count_load_ahead(self, call: Call, loading: Loading, now: float) -> None:
        """A call that takes a pin loaded ahead of it waits for what is left of the
        load; the part done before the call arrived was hidden."""
        call.ready_s = max(call.ready_s, loading.ready_s)
        call.record.load_s += loading.ready_s - loading.start_s
        call.record.load_hidden_s += max(min(loading.ready_s, call.arrival_s) - loading.start_s, 0)

    def load_ahead(self, session: Session, now: float) -> bool:
        """A policy's ``prefetch``: the session's CPU-tier copy back to the GPU, pinned
        (``KVCache.load_ahead``), on the link the calls' loads use."""
        return self.kv.load_ahead(session, now, self._load_done_at)

    def _room_for(self, blocks: int, call: Call) -> bool:
        """Whether ``blocks`` free blocks exist, dropping other sessions' pins if needed."""
        missing = blocks - self.kv.pool.num_free
        return missing <= 0 or self._reclaim_pins(missing, call)

    def _count_prefix_hit(self, call: Call, computed: int) -> None:
        self.prefix_queries += call.num_tokens
        self.prefix_hits += computed
        if not call.looked_up:
            call.looked_up = True
            call.record.cached_tokens = computed
        call.record.recomputed_tokens += max(call.recomputing_until - computed, 0)
        call.recomputing_until = 0

    # --- pins ----------------------------------------------------------------------------

    def _reclaim_pins(self, missing: int, call: Call) -> bool:
        """Drop pins (not ``call``'s own session's) in the policy's order until
        ``missing`` more blocks are free; True if that made enough room."""
        pins = [pin for pin in self.kv.pins.values() if pin.session_id != call.session_id]
        if not pins:
            return False
        target = self.kv.pool.num_free + missing
        for pin in self.policy.reclaim(pins, missing, self.view):
            self.kv.unpin(pin.session_id, "pressure")
            if self.kv.pool.num_free >= target:
                return True
        return self.kv.pool.num_free >= target
