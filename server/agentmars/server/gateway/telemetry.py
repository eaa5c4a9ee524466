"""What the gateway knows of the engine and the tools: the ``EngineView`` its policy's
``admit`` sees.

The gateway does not see inside the engine: ``running``, ``waiting`` and ``pins`` are
empty here (the scheduler plugin decides on those inside vLLM). It counts the
sessions it admitted and the tools in flight from the tool events of the stream, and
takes KV figures from a ``KVSource``. The default source, ``LatestKVStats``, reads the
newest ``kv_stats`` event of the stream (the plugin's side channel, or anyone with the
token, can post them to ``POST /v1/events``); until one arrives every KV figure is 0
(unknown). A plugin bridge may pass any object with ``kv_figures()`` instead.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentmars.sdk.events import AnyEvent, KVStats
from agentmars.server.policies.interface import CallView, PinView

EMA_WEIGHT = 0.2
"""Weight of the newest tool duration in the per-kind moving average (our choice:
about the last five calls dominate)."""


@dataclass(frozen=True, slots=True)
class KVFigures:
    """The engine's block pool in blocks; all zero when unknown."""

    total_blocks: int = 0
    free_blocks: int = 0
    used_blocks: int = 0
    pinned_blocks: int = 0


class KVSource(Protocol):
    """Where the gateway reads the engine's KV statistics."""

    def kv_figures(self) -> KVFigures: ...


class LatestKVStats:
    """A ``KVSource`` holding the newest ``kv_stats`` event seen."""

    def __init__(self) -> None:
        self._figures = KVFigures()

    def observe(self, event: KVStats) -> None:
        self._figures = KVFigures(
            event.total_blocks, event.free_blocks, event.used_blocks, event.pinned_blocks
        )

    def kv_figures(self) -> KVFigures:
        return self._figures


class UnknownCosts:
    """The gateway has no cost model of the engine: every estimate is 0 (unknown)."""

    def prefill_time(self, tokens: int, context_before: int = 0) -> float:
        return 0.0

    def decode_time(self, context: int, seqs: int = 1) -> float:
        return 0.0

    def transfer_time(self, blocks: int) -> float:
        return 0.0


class GatewayView:
    """An ``EngineView`` built from what the gateway sees (module docstring)."""

    def __init__(
        self,
        kv: KVSource | None = None,
        *,
        block_size: int = 16,
        max_num_seqs: int = 256,
        tool_cores: int | None = None,
    ) -> None:
        self.latest_kv = LatestKVStats()
        self.kv: KVSource = kv or self.latest_kv
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.tool_cores = tool_cores if tool_cores is not None else os.cpu_count() or 1
        self.active_sessions_of: Callable[[], int] = lambda: 0
        """Set by the admission that owns the sessions."""
        self._queued: set[tuple[str, str]] = set()
        self._active: set[tuple[str, str]] = set()
        self._ema: dict[str, float] = {}
        self.costs = UnknownCosts()
        self.cpu_total_blocks = 0
        self.cpu_free_blocks = 0
        self.running: Sequence[CallView] = ()
        self.waiting: Sequence[CallView] = ()
        self.pins: Sequence[PinView] = ()

    @property
    def now(self) -> float:
        return time.monotonic()

    @property
    def total_blocks(self) -> int:
        return self.kv.kv_figures().total_blocks

    @property
    def free_blocks(self) -> int:
        return self.kv.kv_figures().free_blocks

    @property
    def used_blocks(self) -> int:
        return self.kv.kv_figures().used_blocks

    @property
    def pinned_blocks(self) -> int:
        return self.kv.kv_figures().pinned_blocks

    @property
    def active_sessions(self) -> int:
        return self.active_sessions_of()

    @property
    def active_tools(self) -> int:
        return len(self._active)

    @property
    def queued_tools(self) -> int:
        return len(self._queued)

    @property
    def tool_ema_s(self) -> Mapping[str, float]:
        return self._ema

    def runs_tools(self, session_id: str) -> bool:
        """The session has a tool call queued or running."""
        return any(s == session_id for s, _ in self._active | self._queued)

    def pin_of(self, session_id: str) -> PinView | None:
        return None

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def observe(self, event: AnyEvent) -> None:
        """Follow tool and KV events (tool calls keyed by session and call id)."""
        if event.kind == "kv_stats":
            self.latest_kv.observe(event)
        elif event.kind == "session_end":
            # A session's tool that never reported its end is over with the session.
            self._queued = {key for key in self._queued if key[0] != event.session_id}
            self._active = {key for key in self._active if key[0] != event.session_id}
        elif event.kind == "tool_enqueue":
            self._queued.add((event.session_id, event.call_id))
        elif event.kind == "tool_start":
            self._queued.discard((event.session_id, event.call_id))
            self._active.add((event.session_id, event.call_id))
        elif event.kind == "tool_end":
            self._queued.discard((event.session_id, event.call_id))
            self._active.discard((event.session_id, event.call_id))
            previous = self._ema.get(event.tool)
            self._ema[event.tool] = (
                event.duration_s
                if previous is None
                else EMA_WEIGHT * event.duration_s + (1 - EMA_WEIGHT) * previous
            )
