"""Where the KV of a session parked at a tool waits: on the GPU (a pin), in the CPU
tier (an offload, loaded back for its next call) or nowhere (dropped, recomputed).
MARS's engine half asks it when a call ends in a tool call and at every pin review
(``co_scheduler``); the paper's MARS (``mars-paper``) has no tier and only keeps or
drops.

Each place is priced as InferCept prices it (Eq. 1-3, ``infercept.waste``): memory
held x time, in token-seconds. MARS's own estimates go in, not an oracle: the tool's
expected remaining time from the stream's per-kind EMA, the prefill and transfer
times from the engine's costs.

- keep: ``pressure`` x T_remaining x C. NOTE: ours — InferCept's WastePreserve
  weighted by the KV pressure (``co_scheduler.kv_pressure``), so a pin in a pool
  nobody waits for costs nothing, as MARS's keep-or-drop rule always had it.
- drop: T_prefill(C) x P, where P is the pool in tokens. NOTE: ours — InferCept's
  WasteDiscard charges the running batch (C + C_other); MARS's rule charges the
  pool, which the batch fills under pressure, the only time this choice is made.
  With these two, keep-or-drop is exactly MARS's ``kv_value.keeping_pays``.
- offload: ``pressure`` x T_transfer(C) x P, or nothing when the load back is hidden
  behind the tool (``prefetch``: the engine loads ahead of need, and the tool is
  expected to outlast the copy). NOTE: ours — InferCept's WasteSwap (2 x T_swap x
  C_batch) charges a swap that stalls the batch both ways. Here the copy out runs
  beside the steps (vLLM's offloading connector; the simulator's pin offloads), and
  the blocks stay in the GPU prefix cache, free: the next call finds them there
  unless the pool needed them, and only then loads them back. So the one waste is
  that load, priced as the drop is, and only under pressure. Only while the tier
  has room for the whole context. The half cannot tell whether its engine loads
  ahead (``Capability.PREFETCH``): on one that does not (the vLLM plugin), a
  "hidden" load is one the next call waits for, a transfer's time.

Ties go to offloading (it keeps a copy in both places), then keeping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from agentmars.server.policies.views import EngineView


class Place(StrEnum):
    GPU = "gpu"
    CPU = "cpu"
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class Prices:
    """Token-seconds of KV each place wastes (module docstring)."""

    keep: float
    drop: float | None
    """None: not worked out (something else costs nothing)."""
    offload: float | None
    """None: no tier, no room in it, or no transfer time to price it by."""

    def cheapest(self) -> Place:
        options = [(self.keep, Place.GPU)]
        if self.offload is not None:
            options.insert(0, (self.offload, Place.CPU))
        if self.drop is not None:
            options.append((self.drop, Place.DROP))
        return min(options, key=lambda option: option[0])[1]


def transfer_s(blocks: int, view: EngineView) -> float | None:
    """One copy of ``blocks`` between the GPU and the CPU tier (None: not known)."""
    return view.costs.transfer_time(blocks) if view.has_costs else None


def prices(
    tokens: int,
    remaining_s: float,
    pressure: float,
    view: EngineView,
    recompute_s: Callable[[], float | None],
    *,
    tier: bool,
    prefetch: bool,
) -> Prices:
    """What keeping, dropping and offloading ``tokens`` of context for a tool expected
    to run ``remaining_s`` more would waste at ``pressure`` (0..1). ``tier``: the
    policy uses the engine's CPU tier; ``prefetch``: it loads back ahead of need."""
    keep = pressure * remaining_s * tokens
    blocks = view.blocks_for(tokens)
    copy_s = transfer_s(blocks, view) if tier and view.cpu_free_blocks >= blocks else None
    offload = None
    pool = view.total_blocks * view.block_size
    if copy_s is not None:
        hidden = prefetch and remaining_s >= copy_s
        offload = 0.0 if hidden else pressure * copy_s * pool
    if keep == 0 or offload == 0:
        return Prices(keep, None, offload)  # nothing cheaper: the drop not worked out
    recompute = recompute_s()
    # An unknown saving never outweighs a cost (``kv_value.keeping_pays``).
    drop = 0.0 if recompute is None else recompute * pool
    return Prices(keep, drop, offload)
