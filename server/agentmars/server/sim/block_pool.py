"""KV blocks of the simulated engine: the mechanism of vLLM V1's ``BlockPool``, no
policy.

A block is free when nothing references it. A free block that holds hashed content
stays in the prefix cache until it is handed out again, and free blocks are handed out
least recently freed first (an LRU free queue), so a freed prefix stays reusable until
its blocks are reallocated; reallocating a block that still holds cached content is an
*eviction*. The optional CPU tier is a second, larger LRU cache of block contents.

Content is named by a block key, ``owner << 32 | index``: the owner is a session (or
a group of sessions sharing a system prompt) and the index the block's position in
the owner's part of the context. A session's context only grows, so (owner, index)
names the same tokens for as long as the session lives — which is what vLLM's chained
block hashes amount to for an append-only context.

Lookups are the simulator's hot path: a call blocked at the head of the queue is looked
up at every step. So the pool keeps, per owner, the length of its cached prefix and how
many of those blocks are free, and answers a lookup in O(1) instead of walking
thousands of blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

INDEX_BITS = 32
INDEX_MASK = (1 << INDEX_BITS) - 1


def block_key(owner: int, index: int) -> int:
    return owner << INDEX_BITS | index


class BlockPool:
    """``num_blocks`` GPU blocks with reference counts, an LRU free queue, a key -> block
    map for prefix caching and a per-owner prefix index."""

    def __init__(self, num_blocks: int, on_evict: Callable[[list[int]], None]) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self._on_evict = on_evict
        self._refs = [0] * num_blocks
        self._key: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._prefix_end: dict[int, int] = {}
        """Owner -> length of its cached prefix (blocks 0.. all cached)."""
        self._prefix_free: dict[int, int] = {}
        """Owner -> how many blocks of that prefix are free."""

    @property
    def num_free(self) -> int:
        return len(self._free)

    def is_free(self, block: int) -> bool:
        return self._refs[block] == 0

    # --- allocation and references -------------------------------------------------------

    def allocate(self, n: int) -> list[int] | None:
        """``n`` blocks from the head of the free queue, referenced once; None (and
        nothing changed) if fewer are free."""
        if n > len(self._free):
            return None
        popitem = self._free.popitem
        blocks = [popitem(last=False)[0] for _ in range(n)]
        keys, refs = self._key, self._refs
        evicted = []
        for block in blocks:
            key = keys[block]
            if key is not None:
                self._uncache(block, key)
                evicted.append(key)
            refs[block] = 1
        if evicted:
            self._on_evict(evicted)
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """Reference ``blocks`` once more (a prefix hit, or a pin)."""
        refs = self._refs
        for block in blocks:
            if refs[block] == 0:
                del self._free[block]
                self._count_free(block, -1)
            refs[block] += 1

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference of each block. Blocks whose last reference goes join the
        free queue's tail in reverse order, so a sequence's tail is reused before its
        head (as vLLM does: the head is the part other calls share)."""
        refs = self._refs
        for block in reversed(blocks):
            refs[block] -= 1
            assert refs[block] >= 0, f"block {block} freed more often than referenced"
            if refs[block] == 0:
                self._free[block] = None
                self._count_free(block, +1)

    # --- prefix cache --------------------------------------------------------------------

    def cache_run(self, blocks: Sequence[int], owner: int, first: int) -> None:
        """Record that ``blocks`` hold the owner's blocks ``first``, ``first + 1``, ...
        (a block already named, or content already cached elsewhere, is left as is)."""
        keys, cached = self._key, self._cached
        base = owner << INDEX_BITS
        for offset, block in enumerate(blocks):
            key = base | (first + offset)
            if keys[block] is None and key not in cached:
                keys[block] = key
                cached[key] = block
        end = self._prefix_end.get(owner, 0)
        if first <= end < first + len(blocks):
            self._extend_prefix(owner, end)

    def prefix(self, owner: int, limit: int) -> tuple[int, int]:
        """(blocks, free blocks among them) of the owner's cached prefix, at most
        ``limit`` blocks long."""
        end = self._prefix_end.get(owner, 0)
        if end <= limit:
            return end, self._prefix_free.get(owner, 0)
        refs, cached = self._refs, self._cached
        free = sum(1 for index in range(limit) if refs[cached[block_key(owner, index)]] == 0)
        return limit, free

    def prefix_blocks(self, owner: int, count: int) -> list[int]:
        """The blocks of the owner's first ``count`` cached blocks."""
        cached = self._cached
        base = owner << INDEX_BITS
        return [cached[base | index] for index in range(count)]

    def drop_cached(self) -> None:
        """Forget every free block's content (vLLM's ``reset_prefix_cache``)."""
        for block in list(self._free):
            key = self._key[block]
            if key is not None:
                self._uncache(block, key)

    def _extend_prefix(self, owner: int, end: int) -> None:
        free = 0
        base = owner << INDEX_BITS
        while (block := self._cached.get(base | end)) is not None:
            free += self._refs[block] == 0
            end += 1
        self._prefix_end[owner] = end
        self._prefix_free[owner] = self._prefix_free.get(owner, 0) + free

    def _uncache(self, block: int, key: int) -> None:
        """Forget a free block's content; the owner's prefix now ends before it."""
        owner, index = key >> INDEX_BITS, key & INDEX_MASK
        end = self._prefix_end.get(owner, 0)
        if index < end:
            base, refs, cached = owner << INDEX_BITS, self._refs, self._cached
            lost = 0
            for i in range(index, end):
                lost += refs[cached[base | i]] == 0
            if index:
                self._prefix_free[owner] -= lost
                self._prefix_end[owner] = index
            else:
                del self._prefix_end[owner], self._prefix_free[owner]
        self._key[block] = None
        del self._cached[key]

    def _count_free(self, block: int, change: int) -> None:
        key = self._key[block]
        if key is not None and key & INDEX_MASK < self._prefix_end.get(key >> INDEX_BITS, 0):
            self._prefix_free[key >> INDEX_BITS] += change


class CPUTier:
    """Block contents kept in host memory, of two kinds.

    - *Swapped* copies belong to a session: the blocks of its preempted call or of its
      pin, swapped out so that its next call loads them back. They stay until that
      call is admitted (then they are freed, as vLLM frees the CPU blocks of a
      sequence it swaps back in) or the session ends, and nothing evicts them.
    - *Cached* copies are what prefix-cache offloading keeps (vLLM's native offloading
      connector, ``offload_evicted``): an LRU that gives way to any new copy.

    So the room a policy can use is the capacity minus the swapped copies (``free``):
    cached ones are reclaimed on demand. A key can be swapped by several sessions (a
    shared system prompt); it is held until the last of them lets go.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._swapped: dict[int, int] = {}
        """Key -> how many sessions hold it."""
        self._holders: dict[str, list[int]] = {}

    @property
    def used(self) -> int:
        return len(self._cached) + len(self._swapped)

    @property
    def free(self) -> int:
        """Blocks a swap-out can take now (free, or cached and reclaimable)."""
        return self.capacity - len(self._swapped)

    def cache(self, keys: Iterable[int]) -> None:
        """Keep copies of ``keys`` in the LRU, the most recent last."""
        for key in keys:
            if key not in self._swapped:
                self._cached[key] = None
                self._cached.move_to_end(key)
        while self.used > self.capacity and self._cached:
            self._cached.popitem(last=False)

    def hold(self, holder: str, keys: Sequence[int]) -> int:
        """Swap ``keys`` out for ``holder``, from the first, as many as there is room for
        (evicting cached copies); returns how many are held."""
        held = self._holders.setdefault(holder, [])
        for count, key in enumerate(keys):
            if key in self._cached:
                del self._cached[key]  # the copy changes kind: no new room needed
            elif key not in self._swapped and not self._room_for_one():
                return count
            self._swapped[key] = self._swapped.get(key, 0) + 1
            held.append(key)
        return len(keys)

    def held(self, holder: str) -> int:
        """How many copies ``holder`` swapped out."""
        return len(self._holders.get(holder, ()))

    def release(self, holder: str) -> None:
        """Free what ``holder`` swapped out (loaded back, or no longer wanted)."""
        for key in self._holders.pop(holder, ()):
            left = self._swapped[key] - 1
            if left:
                self._swapped[key] = left
            else:
                del self._swapped[key]

    def _room_for_one(self) -> bool:
        """Room for one more copy, evicting the least recent cached one if need be."""
        if self.used < self.capacity:
            return True
        if not self._cached:
            return False
        self._cached.popitem(last=False)
        return True

    def prefix(self, keys: Iterable[int]) -> int:
        """How many of ``keys``, from the first, are held (cached ones refreshed)."""
        found = 0
        for key in keys:
            if key in self._cached:
                self._cached.move_to_end(key)
            elif key not in self._swapped:
                break
            found += 1
        return found
