"""A waiting call's prefix-cache hit, found in one pass over vLLM's hash map where the
KV layout makes vLLM's lookup that pass.

vLLM looks a waiting call's prefix up each time its waiting loop reaches the call
(``Scheduler._get_local_prefix_cache_hit``): through the KV manager, its coordinator,
the single-type manager and the block pool, five Python calls a block. A policy that
keeps sessions' KV warm makes the hits long: on bench_schedule's queue MARS's lookups
hit 315 tokens on average against stock vLLM's 12, and they cost it about 20 µs a
step more than stock's (docs/results/mars.md "Costs of running MARS"). With one
full-attention KV group whose block size is the hash's, no EAGLE drafter, no context
parallelism and no KV-cache events, that lookup is exactly the longest run of the
call's block hashes (for all but its last token) found in the pool's map, each taken
as the map's first block for it: that run is walked here in one loop. For any other
layout ``PrefixLookup.of`` gives None and the plugin keeps vLLM's lookup.

NOTE: ours — it reads vLLM's map (``BlockHashToBlockMap._cache``) and key
(``make_block_hash_with_group_id``) directly, the same in 0.32 and 0.33;
tests/server/engines/vllm/test_prefix_lookup.py checks every lookup of bench_schedule's
queue against vLLM's own.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator  # type: ignore[import-not-found]
from vllm.v1.core.kv_cache_utils import KVCacheBlock, make_block_hash_with_group_id  # type: ignore[import-not-found]
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager  # type: ignore[import-not-found]
from vllm.v1.kv_cache_interface import FullAttentionSpec  # type: ignore[import-not-found]

GROUP = 0
"""The one KV cache group's id, the suffix of every key in the map."""


class PrefixLookup:
    """The prefix hit of a waiting call (``_get_local_prefix_cache_hit``'s answer)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self._pool = manager.block_pool
        self._block_size: int = manager.coordinator.block_size
        self._suffix = make_block_hash_with_group_id(b"", GROUP)

    @classmethod
    def of(cls, scheduler: Any) -> PrefixLookup | None:
        """The lookup for ``scheduler``'s KV layout, or None where vLLM's lookup is more
        than the walk (see the module docstring)."""
        manager = scheduler.kv_cache_manager
        coordinator = manager.coordinator
        if not (manager.enable_caching and scheduler.connector is None):
            return None
        if type(coordinator) is not UnitaryKVCacheCoordinator:
            return None
        (single,) = coordinator.single_type_managers
        plain = (
            type(single) is FullAttentionManager
            and type(coordinator.kv_cache_spec) is FullAttentionSpec
            and coordinator.block_size == manager.block_pool.hash_block_size
            and not coordinator.eagle_group_ids
            and coordinator.dcp_world_size == coordinator.pcp_world_size == 1
            and not manager.enable_kv_cache_events
        )
        return cls(manager) if plain else None

    def hit(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int, bool]:
        """The cached blocks of ``request``'s prefix and their tokens, with vLLM's
        shared-prefix boundary and divergence flag (0 and False with one group); at most
        ``max_cache_hit_length`` tokens (vLLM 0.33 passes it: an aux-output connector's
        cap; 0.32 never does)."""
        manager = self._manager
        if not manager.prefix_cache_lookup_enabled(request):
            return manager.empty_kv_cache_blocks, 0, 0, False
        # The pool's map is read at each lookup: a prefix-cache reset replaces it.
        find, suffix = self._pool.cached_block_hash_to_block._cache.get, self._suffix
        # By default all hashed blocks but the one holding the last token, whose logits
        # vLLM needs.
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        limit = max_cache_hit_length // self._block_size
        blocks = []
        for block_hash in islice(request.block_hashes, limit):
            found = find(block_hash + suffix)
            if found is None:
                break
            if type(found) is not KVCacheBlock:
                # Several blocks of the same hash: vLLM takes the map's first.
                found = next(iter(found.values()))
            blocks.append(found)
        computed = manager.create_kv_cache_blocks((blocks,))
        return computed, len(blocks) * self._block_size, 0, False
