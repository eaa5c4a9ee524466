"""KV blocks held for sessions between their calls, inside vLLM's block pool: the touch
pattern of notes/vllm-plugin.md "KV cache internals".

A pin takes one extra reference on a finished call's full hashed blocks
(``BlockPool.touch``) before vLLM frees the call's own references, so the blocks stay
off the free queue and keep their hashes; the session's next call finds them as a
prefix-cache hit. Releasing a pin gives the reference back (``BlockPool.free_blocks``):
the blocks return to the LRU tail as ordinary cached blocks. When to pin and which pin
to drop are the policy's; this module only does it, and says so on the stream
(``kv_pin`` / ``kv_unpin``; why a pin goes: ``events.ReleaseReason``), handing its host
the making of each event (``Announce``: a host may make it off its hot path). It
imports no
vLLM: the blocks are vLLM's ``KVCacheBlock`` objects, handled through the pool they
came from.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_args

from agentmars.sdk.events import AnyEvent, KVPin, KVUnpin, ReleaseReason, clock

Announce = Callable[[Callable[[], AnyEvent]], None]
"""Takes the making of a ``kv_pin`` / ``kv_unpin`` event (its figures and time are read
when the pin changes; the event is made when the maker is called)."""


class BlockPoolLike(Protocol):
    """The two ``vllm.v1.core.block_pool.BlockPool`` methods the pins use."""

    def touch(self, blocks: Sequence[Any]) -> None: ...
    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None: ...


@dataclass(eq=False, slots=True)
class Pin:
    """Blocks held for one session (``policies.interface.PinView``)."""

    session_id: str
    held: list[Any]
    """vLLM ``KVCacheBlock`` objects, in the order of the context."""
    block_size: int
    pinned_s: float
    expires_s: float | None
    session_arrival_s: float
    blocks: int = field(init=False)
    """``len(held)``, kept as ``held`` shrinks (read at most decisions of MARS)."""

    def __post_init__(self) -> None:
        self.blocks = len(self.held)

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size


class PinTable:
    """The pins of one scheduler, at most one per session. ``announce`` takes the
    making of a ``kv_pin`` for each pin taken and of a ``kv_unpin`` for each released
    (None: no events); ``clock`` is the clock of the ``now`` given to ``pin`` (vLLM's
    is the wall clock), for how long a released pin was held."""

    def __init__(
        self,
        block_pool: BlockPoolLike,
        block_size: int,
        *,
        announce: Announce | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pool = block_pool
        self._block_size = block_size
        self._announce = announce
        self._clock = clock
        self.pins: dict[str, Pin] = {}
        self.pinned_blocks = 0
        """Blocks the pins hold (a block shared by a running call counts here too)."""
        # Every reason from the start: the status thread copies this while the
        # scheduler counts, and a dict that gains no keys can be copied meanwhile.
        self.released: Counter[ReleaseReason] = Counter(dict.fromkeys(get_args(ReleaseReason), 0))
        """Pins released so far, by reason."""
        self.expiries: list[tuple[float, int, Pin]] = []
        """Pins with a TTL by expiry (a heap; entries of released pins are skipped when
        they come up): the check at every step looks at the first one only, and not
        even that while it is empty (no pin has a TTL)."""
        self._order = itertools.count()
        self.changed: set[str] = set()
        """Sessions whose pin was taken or released since a reader last emptied this."""

    def pin(
        self,
        session_id: str,
        blocks: Sequence[Any],
        *,
        now: float,
        ttl_s: float | None,
        session_arrival_s: float,
    ) -> Pin:
        """Hold ``blocks`` for the session, replacing its previous pin."""
        held = list(blocks)
        # Touch before releasing the old pin: blocks the two share never reach the free
        # queue in between, where an allocation could take them.
        self._pool.touch(held)
        self.release(session_id, "replaced")
        pin = Pin(
            session_id=session_id,
            held=held,
            block_size=self._block_size,
            pinned_s=now,
            expires_s=None if ttl_s is None else now + ttl_s,
            session_arrival_s=session_arrival_s,
        )
        self.pins[session_id] = pin
        self.pinned_blocks += pin.blocks
        self.changed.add(session_id)
        if self._announce is not None:
            self._announce(
                functools.partial(
                    KVPin,
                    session_id=session_id,
                    blocks=pin.blocks,
                    ttl_s=ttl_s,
                    source="engine",
                    **clock(),
                )
            )
        if pin.expires_s is not None:
            heapq.heappush(self.expiries, (pin.expires_s, next(self._order), pin))
            if len(self.expiries) > 2 * len(self.pins) + 64:
                # Entries of released pins pile up under a long TTL: keep the live ones.
                self.expiries = [e for e in self.expiries if self.pins.get(e[2].session_id) is e[2]]
                heapq.heapify(self.expiries)
        return pin

    def release(self, session_id: str, reason: ReleaseReason) -> Pin | None:
        """Give the session's blocks back to the prefix cache (None: it had no pin)."""
        pin = self.pins.pop(session_id, None)
        if pin is not None:
            self.changed.add(session_id)
            self.released[reason] += 1
            # Last block first, as vLLM frees a request's blocks: the tail of a context
            # is evicted before its head, so a later call still hits the longest prefix.
            self._pool.free_blocks(reversed(pin.held))
            self.pinned_blocks -= pin.blocks
            if self._announce is not None:
                self._announce(self._unpinned(pin, reason))
        return pin

    def release_tail(self, session_id: str, blocks: int) -> int:
        """Give back only the pin's last ``blocks`` blocks (tail first), the rest staying
        pinned (a partial offload to the CPU tier); the whole pin if that is all of it
        (reason ``policy``). No event and no count for a partial one: the pin is still
        there. Returns the blocks given back."""
        pin = self.pins.get(session_id)
        if pin is None or blocks <= 0:
            return 0
        if blocks >= pin.blocks:
            self.release(session_id, "policy")
            return pin.blocks
        tail = pin.held[-blocks:]
        del pin.held[-blocks:]
        pin.blocks = len(pin.held)
        self._pool.free_blocks(reversed(tail))
        self.pinned_blocks -= blocks
        self.changed.add(session_id)
        return blocks

    def _unpinned(self, pin: Pin, reason: ReleaseReason) -> Callable[[], KVUnpin]:
        return functools.partial(
            KVUnpin,
            session_id=pin.session_id,
            blocks=pin.blocks,
            reason=reason,
            held_s=max(self._clock() - pin.pinned_s, 0.0),
            source="engine",
            **clock(),
        )

    def release_expired(self, now: float) -> list[Pin]:
        """Release the pins whose time is up, earliest expiry first."""
        due = []
        while self.expiries and self.expiries[0][0] <= now:
            pin = heapq.heappop(self.expiries)[2]
            if self.pins.get(pin.session_id) is pin:
                self.release(pin.session_id, "expired")
                due.append(pin)
        return due

    def release_all(self, reason: ReleaseReason) -> int:
        """Release every pin; returns how many there were."""
        count = len(self.pins)
        for session_id in list(self.pins):
            self.release(session_id, reason)
        self.expiries.clear()
        return count

    def get(self, session_id: str) -> Pin | None:
        return self.pins.get(session_id)

    def __len__(self) -> int:
        return len(self.pins)
