"""What the gateway knows of the engine and the tools: the ``EngineView`` its policy's
``admit`` sees.

The gateway does not see inside the engine: ``running``, ``waiting`` and ``pins`` are
empty here (the scheduler plugin decides on those inside vLLM). It counts the
sessions it admitted and the tools in flight from the tool events of the stream
(``ToolActivity``), and takes KV figures from a ``KVSource``: the plugin's side channel
(``plugin_link.PluginLink``) when the gateway runs in front of the plugin, else the
newest ``kv_stats`` event of the stream (``LatestKVStats``: anyone with the token can
post them to ``POST /v1/events``); until figures arrive every KV figure is 0 (unknown).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentmars.sdk.events import AnyEvent, KVStats
from agentmars.server.policies.interface import CallView, PinView
from agentmars.server.tool_activity import ToolActivity, ToolFigures


@dataclass(frozen=True, slots=True)
class KVFigures:
    """The engine's block pool in blocks; all zero when unknown."""

    total_blocks: int = 0
    free_blocks: int = 0
    used_blocks: int = 0
    pinned_blocks: int = 0
    pins: int = 0
    """Sessions holding pinned blocks (the plugin's figure; 0 from ``kv_stats`` events)."""
    released: Mapping[str, int] = field(default_factory=dict)
    """Pins released so far, by reason (the plugin's ``pins.ReleaseReason``)."""


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


class GatewayView(ToolFigures):
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
        self.tools = ToolActivity()
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

    def runs_tools(self, session_id: str) -> bool:
        """The session has a tool call queued or running."""
        return self.tools.runs_tools(session_id)

    def pin_of(self, session_id: str) -> PinView | None:
        return None

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def observe(self, event: AnyEvent) -> None:
        """Follow tool and KV events."""
        if event.kind == "kv_stats":
            self.latest_kv.observe(event)
        self.tools.observe(event)
