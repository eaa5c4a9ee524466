"""The CPU tier's session labels and its typed eviction order (seed 003 §4.3.2 on the CPU
tier). Imports no vLLM: the vLLM cache policy (``offload.AgentmarsCachePolicy``) keeps a
``CpuTierBook`` and asks it which chunks go, and the scheduler plugin writes the labels
into the same book (both run in vLLM's engine-core process).

Order (ours, after the seed): chunks of ``inactive`` sessions go first, then ``busy``
ones, then ``idle`` ones (an idle session's KV was offloaded to be reloaded); within a
label, the least recently used session first; within a session, its tail first, so
that what is left of it is still a prefix (vLLM's lookup is a maximal prefix: one
missing chunk hides every chunk after it,
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py:674-706``, vLLM
0.32.x). A chunk several sessions share (a common prefix: keys are content hashes) is
kept as its best-kept session's; a chunk no session owns (a call without a session)
counts as inactive and least recently used.

The order applies from the first offload a policy asks for (``typed``): until then, and
for a policy that never asks (``thunderagent-cpu``: ``offload_evicted`` only), the cache
policy is vLLM's own LRU, unchanged.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable
from enum import StrEnum
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)


class Label(StrEnum):
    """A session's state as the CPU tier sees it (seed 003's program types)."""

    INACTIVE = "inactive"
    """Released, unpinned, paused (not offloaded), or not yet labelled: first out."""
    BUSY = "busy"
    """A call in the engine, or a pin on the GPU: second."""
    IDLE = "idle"
    """Offloaded between its calls (its KV is to be reloaded from here): last."""


EVICTION_RANK = {Label.INACTIVE: 0, Label.BUSY: 1, Label.IDLE: 2}
"""Lower ranks are evicted first."""

REQUEST_MEMORY = 65_536
"""Requests whose session is remembered until the connector is done with them (ours:
a bound, should the connector never report one finished)."""


class CpuTierBook(Generic[Key]):
    """Which session owns which chunk key, each session's label and last use, and the
    typed order over them."""

    def __init__(self) -> None:
        self.typed = False
        """Order by label (set from the policy's first offload); else plain LRU."""
        self.labels: dict[str, Label] = {}
        self._request_sessions: OrderedDict[str, str] = OrderedDict()
        self.key_sessions: dict[Key, set[str]] = {}
        self.session_keys: dict[str, set[Key]] = {}
        self._positions: dict[Key, int] = {}
        self._last_use: dict[str, int] = {}
        self._clock = itertools.count(1)

    # --- written by the scheduler plugin ------------------------------------------------

    def request(self, request_id: str, session_id: str) -> None:
        """A request of the session (its chunks are the session's from now on)."""
        self._request_sessions[request_id] = session_id
        if len(self._request_sessions) > REQUEST_MEMORY:
            self._request_sessions.popitem(last=False)

    def label(self, session_id: str, label: Label) -> None:
        self.labels[session_id] = label

    def label_of(self, session_id: str) -> Label:
        return self.labels.get(session_id, Label.INACTIVE)

    def end(self, session_id: str) -> set[Key]:
        """The session ended: forget it; returns the keys only it owned (to discard)."""
        self.labels.pop(session_id, None)
        self._last_use.pop(session_id, None)
        only_its = set()
        for key in self.session_keys.pop(session_id, set()):
            owners = self.key_sessions.get(key)
            if owners is None:
                continue
            owners.discard(session_id)
            if not owners:
                only_its.add(key)
        return only_its

    # --- written by the cache policy ----------------------------------------------------

    def note(
        self,
        request_id: str,
        keys: Iterable[Key],
        position: Callable[[Key], int | None],
        *,
        finished: bool = False,
    ) -> None:
        """The request used (stored, reused or looked up) these chunks; ``position``:
        a key's end token in the context (vLLM's ``ReqContext``)."""
        session_id = self._request_sessions.get(request_id)
        if finished:
            self._request_sessions.pop(request_id, None)
        if session_id is None:
            return
        owned = self.session_keys.setdefault(session_id, set())
        for key in keys:
            self.key_sessions.setdefault(key, set()).add(session_id)
            owned.add(key)
            at = position(key)
            if at is not None:
                self._positions[key] = at
        self._last_use[session_id] = next(self._clock)

    def forget_key(self, key: Key) -> None:
        """The chunk left the tier (evicted, discarded, a failed store)."""
        self._positions.pop(key, None)
        for session_id in self.key_sessions.pop(key, ()):
            owned = self.session_keys.get(session_id)
            if owned is not None:
                owned.discard(key)

    def forget_all_keys(self) -> None:
        self.key_sessions.clear()
        self.session_keys.clear()
        self._positions.clear()

    # --- the order ----------------------------------------------------------------------

    def eviction_key(self, key: Key) -> tuple[int, int, int]:
        """Sorts first what goes first: (label rank, the session's last use, minus
        the position: the tail first)."""
        owners = self.key_sessions.get(key)
        position = -self._positions.get(key, 0)
        if not owners:
            return 0, 0, position
        rank = max(EVICTION_RANK[self.label_of(session)] for session in owners)
        last_use = max(self._last_use.get(session, 0) for session in owners)
        return rank, last_use, position

    def choose(
        self, evictable: Iterable[Key], n: int, protected: Collection[Key]
    ) -> list[Key] | None:
        """The ``n`` keys to evict, in order, or None if fewer than ``n`` may go (the
        cache policy's contract: then nothing changes)."""
        candidates = [key for key in evictable if key not in protected]
        if len(candidates) < n:
            return None
        candidates.sort(key=self.eviction_key)
        return candidates[:n]
