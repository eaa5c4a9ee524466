"""The vLLM 0.32 classes of the CPU tier, loaded by vLLM's ``OffloadingConnector`` by
module path (``kv_transfer_config``), and the scheduler plugin's handle on them
(``CpuTier``). Every vLLM API used here is private or experimental; each is cited by
file:line of vLLM 0.32.0 (``site-packages/vllm/``), the series the tier is verified on
with the engine (``plugin_config.ENGINE_VLLM``). vLLM 0.33 changed these modules
(``base.py``, ``cpu/manager.py``, ``cpu/spec.py``, ``cpu/policies``: ``insert`` takes the
storing request's context, a new ``on_request_access`` hook, the spec's ``cpu_info``);
the classes here work on both at the unit level (``test_cpu_tier_order.py``), and
are not verified on a 0.33 engine.

- ``AgentmarsOffloadingSpec``: vLLM's ``CPUOffloadingSpec`` (``v1/kv_offload/cpu/spec.py:43``)
  whose worker copies host to host, since the stock one refuses a non-CUDA, non-XPU
  platform (``cpu/spec.py:196-203``); loaded by ``spec_name`` + ``spec_module_path``
  (``v1/kv_offload/factory.py:30-51``, "experimental"). It also takes the tier's size in
  blocks (``agentmars_cpu_blocks``, ours) and converts it to vLLM's
  ``cpu_bytes_to_use`` as vLLM sizes the tier (``cpu/spec.py:96-126``).
- ``HostCopyWorker``: an ``OffloadingWorker`` (``v1/kv_offload/base.py:568-592``) that
  copies synchronously between vLLM's KV tensors (``CanonicalKVCaches``,
  ``base.py:530-547``: one ``(num_blocks, page bytes)`` int8 view each) and a host
  buffer of the same pages. On the CPU platform "GPU" and "CPU" tiers are both host
  memory: a reload is a memcpy, not a PCIe transfer.
- ``AgentmarsCPUManager``: vLLM's ``CPUOffloadingManager`` (``cpu/manager.py:47``) plus
  ``discard`` (drop chunks now; vLLM only has ``reset_cache``, ``manager.py:428-441``),
  the figures, and a prefix check of what is stored.
- ``AgentmarsCachePolicy``: vLLM's ``LRUCachePolicy`` (``cpu/policies/lru.py:16``),
  loaded by ``eviction_policy`` + ``cache_policy_module_path``
  (``cpu/policies/factory.py:39-82``, "experimental"), which learns which session owns
  which chunk from the requests that touch them (``ReqContext.req_id``,
  ``base.py:90-117``) and, once typed, evicts in ``labels.CpuTierBook``'s order.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import torch  # type: ignore[import-not-found]
from vllm.utils.math_utils import round_up  # type: ignore[import-not-found]
from vllm.v1.kv_offload.base import (  # type: ignore[import-not-found]
    LookupResult,
    OffloadingEvent,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # type: ignore[import-not-found]
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # type: ignore[import-not-found]
from vllm.v1.kv_offload.cpu.policies.base import order_request_keys  # type: ignore[import-not-found]
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy  # type: ignore[import-not-found]
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec  # type: ignore[import-not-found]

from agentmars.server.engines.vllm.cpu_tier import CPU_BLOCKS_KEY
from agentmars.server.engines.vllm.cpu_tier.labels import EVICTION_RANK, CpuTierBook, Label

logger = logging.getLogger("vllm.agentmars.cpu_tier")


# --- the eviction policy ------------------------------------------------------------------


class AgentmarsCachePolicy(LRUCachePolicy):  # type: ignore[misc]
    """vLLM's LRU with the sessions' labels first (``labels``). The hooks are
    ``CachePolicy``'s (``cpu/policies/base.py:48-142``): ``touch`` and ``on_store_miss``
    (a request stores or reuses chunks), ``on_request_finished`` (its keys head to
    tail), ``remove``, ``evict``, ``clear``."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.book: CpuTierBook[bytes] = CpuTierBook()

    def touch(self, keys: Iterable[bytes], req_context: Any) -> None:
        keys = list(keys)
        self.book.note(req_context.req_id, keys, req_context.get_offload_key_position)
        super().touch(keys, req_context)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[bytes]],
        insertion_only_keys: set[bytes],
        reused_keys: set[bytes],
        req_context: Any,
    ) -> None:
        keys = order_request_keys(key_groups, req_context)
        self.book.note(
            req_context.req_id, keys, req_context.get_offload_key_position, finished=True
        )
        super().on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)

    def remove(self, key: bytes) -> None:
        super().remove(key)
        self.book.forget_key(key)

    def clear(self) -> None:
        super().clear()
        self.book.forget_all_keys()

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Any]] | None:
        evicted: list[tuple[bytes, Any]] | None
        if not self.book.typed:
            evicted = super().evict(n, protected)  # vLLM's own LRU
        else:
            chosen = self.book.choose(self._evictable, n, protected)
            if chosen is None:
                return None
            evicted = []
            for key in chosen:
                # As LRUCachePolicy.evict (lru.py:151-158); its heap entries for these
                # keys go stale and are skipped (lru.py:50-52).
                chunk = self.chunks.pop(key)
                assert chunk.ref_cnt == 0
                self._evictable.remove(key)
                del self._ranks[key]
                evicted.append((key, chunk))
            self._maybe_compact_heap()
        for key, _ in evicted or ():
            self.book.forget_key(key)
        return evicted


# --- the manager --------------------------------------------------------------------------


class AgentmarsCPUManager(CPUOffloadingManager):  # type: ignore[misc]
    """vLLM's CPU manager, plus ``discard`` and the figures the plugin reports."""

    blocks_per_chunk = 1

    @property
    def policy(self) -> AgentmarsCachePolicy:
        policy = self._policy  # private: manager.py:75
        assert isinstance(policy, AgentmarsCachePolicy), "the CPU tier's eviction policy"
        return policy

    @property
    def capacity_chunks(self) -> int:
        return int(self._num_chunks)  # private: manager.py:68

    def free_chunks(self) -> int:
        """Chunks a store may take without evicting anything, or by evicting chunks no
        transfer uses (vLLM's own count in ``prepare_store``, manager.py:311-317)."""
        return int(self._get_num_free_chunks() + self._num_evictable_cache_chunks)

    def evictable_chunks(self, label: Label) -> int:
        """Evictable chunks kept for sessions labelled ``label`` (a shared chunk is its
        best-kept session's)."""
        policy = self.policy
        book, evictable, rank = policy.book, policy._evictable, EVICTION_RANK[label]
        return sum(
            1
            for key, owners in book.key_sessions.items()
            if owners
            and key in evictable
            and max(EVICTION_RANK[book.label_of(s)] for s in owners) == rank
        )

    def stored_prefix(self, keys: Iterable[bytes]) -> int:
        """How many of ``keys`` (a context's, head to tail) are in the tier or being
        stored, from the head: what a lookup would find (scheduler.py:674-706)."""
        count = 0
        for key in keys:
            if self.lookup(key, None) is LookupResult.MISS:  # manager.py:188-195
                break
            count += 1
        return count

    def discard(self, keys: Collection[bytes]) -> int:
        """Drop these chunks now; a chunk being stored or loaded (``ref_cnt`` not 0) is
        left to LRU. Returns how many went. As ``prepare_store``'s eviction does it
        (manager.py:324-343), with a removal event."""
        dropped = []
        policy = self.policy
        for key in keys:
            chunk = policy.get(key)
            if chunk is None or chunk.ref_cnt != 0:
                continue
            policy.remove(key)
            self._num_evictable_cache_chunks -= 1
            self._free_chunk(chunk)
            dropped.append(key)
        if dropped and self.events is not None:
            self.events.append(OffloadingEvent(keys=dropped, medium=self.medium, removed=True))
        return len(dropped)


# --- the worker ---------------------------------------------------------------------------


class HostCopyWorker(OffloadingWorker):  # type: ignore[misc]
    """Copies pages between vLLM's KV tensors and a host buffer, synchronously, in the
    worker (on the CPU platform, the engine-core process). NOTE: ours — one block per
    chunk (the chunk is the block: ``block_size`` left at vLLM's)."""

    def __init__(self, kv_caches: Any, blocks_per_chunk: int, num_chunks: int) -> None:
        if blocks_per_chunk != 1:
            raise ValueError(
                "the agentmars CPU tier copies one block per chunk: leave "
                "kv_connector_extra_config's block_size at the KV block size"
            )
        self._kv: list[Any] = []
        self._host: list[Any] = []
        for tensor in kv_caches.tensors:
            pages = tensor.tensor.view(torch.int8).view((-1, tensor.page_size_bytes))
            self._kv.append(pages)
            self._host.append(torch.zeros((num_chunks, tensor.page_size_bytes), dtype=torch.int8))
        self._done: list[Any] = []

    def _copy(self, job_id: int, blocks: Any, chunks: Any, *, store: bool) -> bool:
        block_ids = torch.from_numpy(blocks.astype("int64"))
        chunk_ids = torch.from_numpy(chunks.astype("int64"))
        started = time.perf_counter()
        size = 0
        for kv, host in zip(self._kv, self._host, strict=True):
            if store:
                host.index_copy_(0, chunk_ids, kv.index_select(0, block_ids))
            else:
                kv.index_copy_(0, block_ids, host.index_select(0, chunk_ids))
            size += len(block_ids) * kv.shape[1]
        # The transfer's size and time feed vLLM's kv_offload counters
        # (offloading/worker.py:273-305).
        self._done.append(TransferResult(job_id, True, size, time.perf_counter() - started))
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        assert isinstance(dst_spec, CPULoadStoreSpec)
        return self._copy(job_id, src_spec.block_ids, dst_spec.block_ids, store=True)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        assert isinstance(src_spec, CPULoadStoreSpec)
        return self._copy(job_id, dst_spec.block_ids, src_spec.block_ids, store=False)

    def get_finished(self) -> list[Any]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every copy is done when submitted


# --- the spec -----------------------------------------------------------------------------


class AgentmarsOffloadingSpec(CPUOffloadingSpec):  # type: ignore[misc]
    """vLLM's CPU offloading spec with our manager, policy and host-copy worker."""

    _manager: AgentmarsCPUManager | None
    _worker: HostCopyWorker | None

    def __init__(self, config: Any) -> None:
        blocks = config.extra_config.get(CPU_BLOCKS_KEY)
        if blocks is not None:
            extra = {
                **config.extra_config,
                "cpu_bytes_to_use": self._bytes_for(config, int(blocks)),
            }
            config = dataclasses.replace(config, extra_config=extra)
        super().__init__(config)

    @classmethod
    def _bytes_for(cls, config: Any, blocks: int) -> int:
        """``cpu_bytes_to_use`` for ``blocks`` KV blocks, as ``CPUOffloadingSpec`` turns
        bytes into chunks (cpu/spec.py:107-126: one copy per worker on the CPU platform,
        each chunk's bytes rounded up to ``BLOCK_SIZE_ALIGNMENT``)."""
        per_chunk = config.worker_kv_bytes_per_block * max(config.parallel.world_size, 1)
        per_chunk *= config.cache.blocks_per_chunk
        chunks: int = -(-blocks // config.cache.blocks_per_chunk)
        # Never 0: vLLM refuses a missing size (cpu/spec.py:96-100).
        aligned: int = round_up(per_chunk, cls.BLOCK_SIZE_ALIGNMENT)
        return max(chunks * aligned, 1)

    def get_manager(self) -> AgentmarsCPUManager:
        # As CPUOffloadingSpec.get_manager (cpu/spec.py:139-159), with our class.
        if not self._manager:
            # vLLM 0.33's spec describes the tier to its manager, which reports it
            # (cpu/spec.py:132, manager.py:482 of 0.33.0: ``config_info``); 0.32's has
            # no such description.
            info = {"info": self.cpu_info} if hasattr(self, "cpu_info") else {}
            manager = AgentmarsCPUManager(
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=int(self.extra_config.get("store_threshold", 0)),
                max_tracker_size=int(self.extra_config.get("max_tracker_size", 64_000)),
                **info,
            )
            manager.blocks_per_chunk = self.blocks_per_chunk
            self._manager = manager
        return self._manager

    def get_worker(self, kv_caches: Any) -> HostCopyWorker:
        if not self._worker:
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
        return self._worker


# --- the scheduler plugin's handle ----------------------------------------------------------


class CpuTier:
    """The CPU tier as the scheduler plugin steers it: labels, offload checks, discards,
    figures. Found through the scheduler's connector (``CpuTier.of``)."""

    def __init__(self, manager: AgentmarsCPUManager) -> None:
        self.manager = manager
        self.book = manager.policy.book

    @classmethod
    def of(cls, scheduler: Any) -> CpuTier | None:
        """The tier behind ``scheduler``'s KV connector, if it is vLLM's
        ``OffloadingConnector`` with our manager (``Scheduler.get_kv_connector``,
        v1/core/sched/scheduler.py:2996; ``OffloadingConnector.connector_scheduler``,
        offloading_connector.py:91-96; ``OffloadingConnectorScheduler.manager``,
        offloading/scheduler.py:575)."""
        connector = scheduler.get_kv_connector()
        side = getattr(connector, "connector_scheduler", None)
        manager = getattr(side, "manager", None)
        if not isinstance(manager, AgentmarsCPUManager):
            return None
        if not isinstance(manager._policy, AgentmarsCachePolicy):
            logger.warning("agentmars: the CPU tier's eviction policy is not ours: no CPU tier")
            return None
        return cls(manager)

    # --- figures, in vLLM blocks ----------------------------------------------------------

    @property
    def total_blocks(self) -> int:
        return self.manager.capacity_chunks * self.manager.blocks_per_chunk

    @property
    def free_blocks(self) -> int:
        """Room for an offload without evicting another offloaded (idle) session's KV:
        free chunks and the evictable copies of busy and inactive sessions (the
        write-through copies that give way first)."""
        chunks = self.manager.free_chunks()
        if self.book.typed:
            chunks -= self.manager.evictable_chunks(Label.IDLE)
        return max(chunks, 0) * self.manager.blocks_per_chunk

    # --- the policy's decisions -----------------------------------------------------------

    def request(self, request_id: str, session_id: str) -> None:
        self.book.request(request_id, session_id)

    def label(self, session_id: str, label: Label) -> None:
        self.book.label(session_id, label)

    def label_of(self, session_id: str) -> Label:
        return self.book.label_of(session_id)

    def offload(self, session_id: str, block_hashes: Sequence[bytes], *, finished: bool) -> bool:
        """Label the session idle if its context (its blocks' hashes, head to tail) is
        in the tier, and say so; else inactive (as a release). vLLM stores write-through
        (offloading/scheduler.py:1570-1578), so it is there already unless a store
        failed (``cannot store chunks``, scheduler.py:1731-1739). A call that just
        finished has its last block stored in the next step (scheduler.py:2028-2031,
        1890-1898), so that one is not asked for; a partial copy counts (its prefix
        reloads, the rest is recomputed: ours)."""
        self.book.typed = True
        wanted = len(block_hashes) - (1 if finished else 0)
        stored = self.manager.stored_prefix(block_hashes)
        on_cpu = stored > 0 or wanted <= 0
        self.book.label(session_id, Label.IDLE if on_cpu else Label.INACTIVE)
        if stored < wanted:
            logger.debug(
                "agentmars: %s offloaded with %d of %d blocks in the CPU tier",
                session_id,
                stored,
                wanted,
            )
        return on_cpu

    def offload_known(self, session_id: str) -> bool:
        """An offload of a session that holds no pin: idle if the tier holds any chunk
        it used (as far as the book knows), else inactive."""
        self.book.typed = True
        keys = self.book.session_keys.get(session_id, ())
        on_cpu = any(self.manager.policy.get(key) is not None for key in keys)
        self.book.label(session_id, Label.IDLE if on_cpu else Label.INACTIVE)
        return on_cpu

    def end(self, session_id: str) -> int:
        """The session ended: its chunks no other session shares go now; returns how
        many blocks went."""
        return self.manager.discard(self.book.end(session_id)) * self.manager.blocks_per_chunk
