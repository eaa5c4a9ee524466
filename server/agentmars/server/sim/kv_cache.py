"""Calls' block tables over the block pool, pins, and the CPU tier: the mechanism of
vLLM V1's ``KVCacheManager`` plus the touch pattern that keeps a finished call's blocks
for its session (notes/vllm-plugin.md "KV cache internals"). Whether to pin, whom to
preempt and which pin to drop are the policy's; this module only does it, and tells its
``PinWatch`` of each pin taken and released (the engines announce them on the stream).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from agentmars.sdk.events import ReleaseReason
from agentmars.server.sim.block_pool import BlockPool, CPUTier
from agentmars.server.sim.entities import Call, Pin, Session


@dataclass(frozen=True, slots=True)
class Prefix:
    """What the caches hold of a call's context, from its start."""

    gpu_blocks: int
    free_gpu_blocks: int
    """Of those, blocks nothing references now (taking them uses up free blocks)."""
    cpu_blocks: int
    """Blocks after the GPU part found in the CPU tier."""


@dataclass(frozen=True, slots=True)
class Loading:
    """A load of a session's swapped copy back to the GPU, ahead of its next call."""

    start_s: float
    ready_s: float


class PinWatch(Protocol):
    """Who hears of the pins a ``KVCache`` takes and releases."""

    def pin_taken(self, pin: Pin) -> None: ...
    def pin_released(self, pin: Pin, reason: ReleaseReason) -> None: ...


class KVCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        cpu_blocks: int,
        on_evict: Callable[[int], None],
        *,
        offload_evicted: bool = False,
        transfer_time: Callable[[int], float] | None = None,
        watch: PinWatch | None = None,
    ) -> None:
        """``transfer_time(blocks)``: how long a swap-out of that many blocks takes on
        the GPU -> host link (None: swap-outs take no time)."""
        self.block_size = block_size
        self._watch = watch
        self.cpu = CPUTier(cpu_blocks) if cpu_blocks else None
        self.pool = BlockPool(num_blocks, self._evicted)
        self.pins: dict[str, Pin] = {}
        self.pinned_blocks = 0
        self.released: Counter[ReleaseReason] = Counter()
        """Pins released so far, by reason (``kv_stats``' ``released``)."""
        self._on_evict = on_evict
        self._offload_evicted = offload_evicted and self.cpu is not None
        self._owners: dict[str, int] = {}
        self._transfer_time = transfer_time
        self._out_link_free_s = 0.0
        self._swapped_out_s: dict[str, float] = {}
        """Session -> when the last copy it swapped out is in host memory."""
        self._loading: dict[str, Loading] = {}
        """Session -> the load ahead of its pin (``load_ahead``)."""

    def register(self, session: Session) -> None:
        """Give a session its block keys' owners."""
        session.kv_owner = self._owner(f"session:{session.session_id}")
        group = session.spec.prefix_group
        if group is not None:
            session.kv_group = self._owner(f"group:{group}")
            session.shared_blocks = session.spec.shared_prefix_tokens // self.block_size

    def _owner(self, name: str) -> int:
        return self._owners.setdefault(name, len(self._owners) + 1)

    def _evicted(self, keys: list[int]) -> None:
        if self._offload_evicted:
            # NOTE: ours — blocks leave for host memory when the GPU drops them; the copy
            # is not charged (vLLM's offloading connector copies blocks out as they fill,
            # beside the steps, so an eviction waits for nothing; loads back are charged).
            assert self.cpu is not None
            self.cpu.cache(keys)
        self._on_evict(len(keys))

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # --- lookups and allocation -------------------------------------------------------

    def lookup(self, call: Call) -> Prefix:
        """The longest cached prefix of the call's context. At most ``num_tokens - 1``
        tokens can hit: the last one must be computed to produce a token (as in vLLM)."""
        return self._prefix(call.session, (call.num_tokens - 1) // self.block_size)

    def _prefix(self, session: Session, limit: int) -> Prefix:
        """The longest cached prefix of the session's context, at most ``limit`` blocks."""
        shared = min(session.shared_blocks, limit)
        hit, free = self.pool.prefix(session.kv_group, shared) if shared else (0, 0)
        if hit == shared:
            own, own_free = self.pool.prefix(session.kv_owner, limit - shared)
            hit, free = hit + own, free + own_free
        cpu = self.cpu.prefix(self._keys(session, hit, limit)) if self.cpu is not None else 0
        return Prefix(hit, free, cpu)

    @staticmethod
    def _keys(session: Session, start: int, stop: int) -> Iterator[int]:
        return (session.key(index) for index in range(start, stop))

    def blocks_to_allocate(self, prefix: Prefix, new_tokens: int) -> int:
        """Free blocks that admitting a call with ``prefix`` and ``new_tokens`` more uses
        up: its new blocks (CPU-tier ones included), plus the GPU hit blocks that are
        free now (touching them takes them off the free queue)."""
        computed = (prefix.gpu_blocks + prefix.cpu_blocks) * self.block_size
        fresh = max(self.blocks_for(computed + new_tokens) - prefix.gpu_blocks, 0)
        return fresh + prefix.free_gpu_blocks

    def admit(self, call: Call, prefix: Prefix, new_tokens: int) -> bool:
        """Give a waiting call its prefix (the GPU hit, plus new blocks for what loads
        from the CPU tier) and blocks for ``new_tokens`` more."""
        if self.blocks_to_allocate(prefix, new_tokens) > self.pool.num_free:
            return False
        hit = self._hit_blocks(call.session, prefix.gpu_blocks)
        computed = (prefix.gpu_blocks + prefix.cpu_blocks) * self.block_size
        fresh = self.pool.allocate(max(self.blocks_for(computed + new_tokens) - len(hit), 0))
        assert fresh is not None
        call.blocks = hit + fresh
        call.num_computed_tokens = computed
        call.num_hashed_blocks = len(hit)
        self.cache_full_blocks(call)
        return True

    def _hit_blocks(self, session: Session, count: int) -> list[int]:
        """The GPU blocks of the session's first ``count`` cached blocks, referenced."""
        shared = min(session.shared_blocks, count)
        hit = self.pool.prefix_blocks(session.kv_group, shared) if shared else []
        hit += self.pool.prefix_blocks(session.kv_owner, count - shared)
        self.pool.touch(hit)
        return hit

    def grow(self, call: Call, new_tokens: int) -> bool:
        """Blocks for ``new_tokens`` more tokens of a running call."""
        needed = self.blocks_for(call.num_computed_tokens + new_tokens) - len(call.blocks)
        if needed <= 0:
            return True
        fresh = self.pool.allocate(needed)
        if fresh is None:
            return False
        call.blocks.extend(fresh)
        return True

    def cache_full_blocks(self, call: Call) -> None:
        """Name the call's blocks that are now full of computed tokens."""
        full = call.num_computed_tokens // self.block_size
        start = call.num_hashed_blocks
        if full <= start:
            return
        self._name_blocks(call.session, call.blocks, start, full)
        call.num_hashed_blocks = full

    def _name_blocks(self, session: Session, blocks: list[int], start: int, full: int) -> None:
        """Name ``blocks[start:full]`` as the session's context blocks at those places."""
        shared = session.shared_blocks
        if start < shared:
            stop = min(full, shared)
            self.pool.cache_run(blocks[start:stop], session.kv_group, start)
            start = stop
        if start < full:
            self.pool.cache_run(blocks[start:full], session.kv_owner, start - shared)

    def free(self, call: Call) -> None:
        self.pool.free(call.blocks)
        call.blocks = []
        call.num_hashed_blocks = 0

    # --- swapping to the CPU tier ---------------------------------------------------------

    def swap_out(self, session: Session, start: int, stop: int, now: float) -> float:
        """Swap the session's blocks ``start`` to ``stop`` out to the CPU tier, as many
        from ``start`` as there is room for; returns when the copy is done.

        NOTE: ours — swap-outs go one after another over the GPU -> host link (the other
        direction from loads, which have their own link: PCIe is full duplex). Whether
        a step waits for the copy is the caller's: a preemption's does, a pin's does not
        (``Step.swapped_out_s``)."""
        if self.cpu is None or stop <= start:
            return now
        held = self.cpu.hold(session.session_id, list(self._keys(session, start, stop)))
        if self._transfer_time is not None and held:
            self._out_link_free_s = max(self._out_link_free_s, now) + self._transfer_time(held)
        done = max(self._out_link_free_s, now)
        self._swapped_out_s[session.session_id] = done
        return done

    def swap_out_pin(self, session: Session, blocks: int | None, now: float) -> None:
        """Swap out the pin's last ``blocks`` blocks (None: all), no more than the CPU
        tier has room for, and drop them from the pin; a pin left empty goes.

        From the back, as InferCept's released code swaps (``swap_out_from_back``): the
        pin stays a prefix of the context, and the next call finds it on the GPU and
        the rest in the CPU tier."""
        pin = self.pins.get(session.session_id)
        if pin is None or self.cpu is None:
            return
        keep = pin.blocks - min(pin.blocks if blocks is None else blocks, self.cpu.free)
        self.swap_out(session, keep, pin.blocks, now)
        if keep == 0:
            self.unpin(session.session_id, "policy")
            return
        tail = pin.block_ids[keep:]
        pin.block_ids = pin.block_ids[:keep]
        pin.tokens = keep * self.block_size
        self.pinned_blocks -= len(tail)
        self.pool.free(tail)

    def load_ahead(
        self, session: Session, now: float, load_done_at: Callable[[int], float]
    ) -> bool:
        """Load what the session swapped out back into free GPU blocks, ahead of its
        next call, and pin its context there (``prefetch``); False (and nothing
        changed) when it has no pin-free copy to load or the free blocks cannot hold
        it. The pin is usable when the load is done (``loading``): the copy follows
        the swap-out still on its way and the loads before it on the host -> GPU link
        (``load_done_at``, the scheduler's). The CPU copy stays until the next call
        takes the pin (as a load for the call frees it then): should pressure drop
        the pin first, the call loads the copy again instead of recomputing.

        Only on free blocks: a prefetch reclaims no pin and preempts nothing (it may
        evict free cached blocks, as any allocation does)."""
        session_id = session.session_id
        if self.cpu is None or session_id in self.pins:
            return False
        prefix = self._prefix(session, self.cpu.held(session_id) + self.pool.num_blocks)
        if not prefix.cpu_blocks:
            return False
        if prefix.cpu_blocks + prefix.free_gpu_blocks > self.pool.num_free:
            return False
        hit = self._hit_blocks(session, prefix.gpu_blocks)
        fresh = self.pool.allocate(prefix.cpu_blocks)
        assert fresh is not None
        blocks = hit + fresh
        self._name_blocks(session, blocks, len(hit), len(blocks))
        ready = max(load_done_at(prefix.cpu_blocks), self.swapped_out_s(session_id))
        self._loading[session_id] = Loading(now, ready)
        self._take_pin(
            Pin(
                session_id=session_id,
                block_ids=blocks,
                tokens=len(blocks) * self.block_size,
                pinned_s=now,
                expires_s=None,
                session_arrival_s=session.arrival_s,
            )
        )
        return True

    def loading(self, session_id: str) -> Loading | None:
        """The load ahead of the session's pin, until its next call takes the pin."""
        return self._loading.get(session_id)

    def swapped_out_s(self, session_id: str) -> float:
        """When the copies the session swapped out are all in host memory (0: none)."""
        return self._swapped_out_s.get(session_id, 0.0)

    def release_swapped(self, session_id: str) -> None:
        """Free the session's swapped copies (loaded back, or no longer wanted)."""
        self._swapped_out_s.pop(session_id, None)
        if self.cpu is not None:
            self.cpu.release(session_id)

    # --- pins --------------------------------------------------------------------------

    def pin(self, call: Call, now: float, ttl_s: float | None) -> Pin:
        """Hold the finished call's full blocks for its session."""
        blocks = call.blocks[: call.num_hashed_blocks]
        self.pool.touch(blocks)
        return self._take_pin(
            Pin(
                session_id=call.session_id,
                block_ids=blocks,
                tokens=len(blocks) * self.block_size,
                pinned_s=now,
                expires_s=None if ttl_s is None else now + ttl_s,
                session_arrival_s=call.session_arrival_s,
            )
        )

    def _take_pin(self, pin: Pin) -> Pin:
        self.pins[pin.session_id] = pin
        self.pinned_blocks += pin.blocks
        if self._watch is not None:
            self._watch.pin_taken(pin)
        return pin

    def unpin(self, session_id: str, reason: ReleaseReason) -> Pin | None:
        """Give the session's pinned blocks back to the pool (None: it had no pin)."""
        pin = self.pins.pop(session_id, None)
        self._loading.pop(session_id, None)
        if pin is not None:
            self.pool.free(pin.block_ids)
            self.pinned_blocks -= pin.blocks
            self.released[reason] += 1
            if self._watch is not None:
                self._watch.pin_released(pin, reason)
        return pin
