"""The policy contract: a policy has two halves, as MARS has (seed 000 §4.2-§4.3;
docs/policies.md).

- ``AdmissionHalf`` runs in front of the engine, in the gateway (the external control
  plane): which waiting *sessions* enter now, in what order, and how wide the
  admission window is, on its own control period.
- ``EngineHalf`` runs inside the engine (the internal scheduler): the order of the
  engine's waiting calls, the size of a prompt chunk, the preemption victim, what
  happens to a finished call's KV, which pins to drop under pressure, and periodic
  actions on sessions.

The halves live in different processes on the real stack (the gateway; vLLM's engine
core) and share state only through the event stream: each gets every event with
``on_event`` and may add events of its own with ``publish`` (e.g. ``window_update``
from the admission half, ``session_pause`` from the engine half), which reach the other
half through the stream. The simulator runs them the same way. A registered ``Policy``
holds the settings and builds either half on demand; no object is shared between them.

The defaults are stock vLLM V1 (FCFS): admit everything, serve calls in arrival order,
admit a new call only when its whole prompt fits, preempt the newest running call,
release KV when a call finishes, never pin.

Views (what each half may read) are in ``policies.views``; what a policy needs from
its hosts, and the check at start, in ``policies.capabilities``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from agentmars.sdk.events import AnyEvent
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.views import (
    AdmissionView,
    CallView,
    EngineView,
    PinView,
    SessionView,
)

SortKey = tuple[Any, ...]
Publish = Callable[[AnyEvent], None]


@dataclass(frozen=True, slots=True)
class Release:
    """Return the call's KV to the prefix cache (reusable until reallocated)."""


@dataclass(frozen=True, slots=True)
class Pin:
    """Keep the call's full blocks resident for its session's next call; ``ttl_s``:
    release after that long (None: until the next call, the session's end, or a
    ``reclaim``)."""

    ttl_s: float | None = None


@dataclass(frozen=True, slots=True)
class Offload:
    """Copy the call's full blocks to the CPU tier and release them on the GPU."""


KVDecision = Release | Pin | Offload


@dataclass(frozen=True, slots=True)
class SessionAction:
    """What ``tick`` may do to a session: ``unpin`` its KV, ``offload`` its pin to the
    CPU tier, ``prefetch`` its CPU-tier copy back to the GPU as a pin ahead of its next
    call (``Capability.PREFETCH``; an engine without it leaves the copy for the call to
    load), ``pause`` it (its calls are held, its KV dropped) or ``resume`` a paused
    one. The engine publishes ``session_pause`` / ``session_resume`` for the last two,
    so the admission half learns of them from the stream."""

    kind: Literal["unpin", "offload", "prefetch", "pause", "resume"]
    session_id: str
    reason: str = ""
    """For ``pause``: why, as the ``session_pause`` event says it (the admission half
    of the same policy may read it)."""
    blocks: int | None = None
    """For ``offload``: swap out only the pin's last ``blocks`` blocks, the rest staying
    pinned for a later step (InferCept's swap within a per-step budget); None: the whole
    pin. An engine without a CPU tier releases the whole pin whatever this says."""


def _drop(event: AnyEvent) -> None:
    """Where a half's events go until a host connects it to the stream."""


class _Half:
    needs: ClassVar[frozenset[Capability]] = frozenset()
    """What the host running this half must provide (``capabilities``); checked at
    start with ``refuse_unless``."""
    uses: ClassVar[frozenset[Capability]] = frozenset()
    """What the half uses when its host provides it and does without otherwise (e.g. a
    CPU tier to swap to: without one, swapping is never the cheapest choice); a host
    that can provide it on demand does (the simulator's CPU tier)."""
    publish: Publish = staticmethod(_drop)
    """Adds an event to the stream (set by the host that runs the half)."""

    def on_event(self, event: AnyEvent) -> None:
        """Every event of the stream, once, in the order this half's host sees them
        (the other half's published events included)."""


class AdmissionHalf(_Half):
    """The external control plane; the default admits every session at once."""

    control_interval_s: float | None = None
    """Call ``admit`` at least this often while sessions wait (None: only when
    something happens: an arrival, an event, a session's end)."""

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        """Sessions to admit now, in order (a prefix of a reordering of ``queue``)."""
        return queue

    def place(self, session: SessionView, view: AdmissionView) -> int:
        """The engine replica (an index of ``view.replicas``) that serves a session just
        admitted, for its whole life unless ``moves`` moves it: its KV lives there
        (session affinity). Asked only behind several replicas. The default: the
        replica with the fewest sessions, the first among equals."""
        return min(view.replicas, key=lambda replica: (replica.sessions, replica.index)).index

    def moves(self, session: SessionView, current: int, view: AdmissionView) -> int | None:
        """Asked when a call of a placed session reaches the host, behind several
        replicas (``session.prompt_tokens``: that call's prompt): a replica to move the
        session to before the call goes on, or None to keep it on ``current``. The
        host then publishes ``session_move``, and the replica left forgets the session
        as if it had ended there (its pins and CPU-tier copies are dropped: move only a
        session with nothing to lose there). The default: never (affinity)."""
        return None

    def release(self, session_id: str) -> None:
        """The host took back the seat of a session it had admitted: the session has
        nothing open and stayed quiet past its gap (docs/gateway.md "Seats"). It is not
        over (no ``session_end``; the engine half keeps its pins and priority); its
        next call comes through ``admit`` again. Drop what the half reserves for it
        (its projected KV, say). The default reserves nothing."""

    def seated(self, session: SessionView, view: AdmissionView) -> None:
        """The host seated a session that had given its seat back without asking
        ``admit``: its KV is pinned in the engine, so its call goes on at once. Count
        what the half counts for a session it admits. The default counts nothing."""

    def tool_priority(self, session_id: str) -> int:
        """Where the session's queued tool calls go in the sandbox pool's queue (lower
        first; ties FIFO): the CPU side of co-scheduling. The gateway sends it with
        each answer (``X-Agentmars-Tool-Priority``) for the client to pass to the pool;
        the simulator's host orders its tool queue by it. The default keeps FIFO."""
        return 0


class EngineHalf(_Half):
    """The internal scheduler; the defaults are stock vLLM V1's (module docstring)."""

    tick_interval_s: float | None = None
    """Call ``tick`` this often (None: never; 0: at every engine step)."""
    preempt_by_swap: bool = False
    """Preempted calls' KV goes to the CPU tier (else it is recomputed)."""
    offload_evicted: bool = False
    """Blocks the GPU prefix cache evicts are kept in the CPU tier (LRU), as vLLM's
    offloading connector does; else the tier only holds what the policy sends there."""
    reserve_full_prompt: bool = True
    """Admit a waiting call only if blocks for its whole remaining prompt are free now
    (vLLM 0.32's ``scheduler_reserve_full_isl``), unless ``may_start_partial`` lets it
    start on what fits; False: ``chunk`` decides alone for every call."""
    priority_reads_pins_only: ClassVar[bool] = False
    """``priority`` reads only the call and which sessions hold pins (nothing else that
    changes while a call waits), so an engine may keep the waiting order until the
    queue or the pins change (the vLLM plugin does: sorting at every step is a tenth
    of ``schedule()``); else it asks again at every step."""

    preemptive: ClassVar[bool] = False
    """Running calls are ranked with the waiting ones by ``priority`` at every step (a
    policy that re-selects its running batch each iteration, as seed 001's Algorithm
    1): a waiting call that sorts before a running one and cannot start (no room for
    it, or the batch is full) displaces the running calls that sort after it, the
    last-ranked first, until it can. A displaced call is preempted as any other
    (recomputed, or swapped with ``preempt_by_swap``). False: vLLM's own rule, under
    which a waiting call never preempts a running one."""
    priority_refresh_s: ClassVar[float | None] = None
    """``priority`` also changes with time, but slowly (e.g. a promotion per tens of
    seconds waited): an engine may keep a waiting call's key as with
    ``priority_reads_pins_only`` for at most this long (the vLLM plugin does; the
    simulator asks at every step)."""

    def priority(self, call: CallView, view: EngineView) -> SortKey:
        """Sort key of a waiting call: lower runs first; ties go to the earlier call."""
        return (call.arrival_s,)

    def chunk(self, call: CallView, tokens: int, fit_tokens: int, view: EngineView) -> int:
        """Prompt tokens of ``call`` to compute in this step. ``tokens``: what the token
        budget allows; ``fit_tokens``: what the free KV blocks can hold now. Returning
        more than ``fit_tokens`` lets the engine reclaim pins or preempt to make room;
        returning 0 skips the call in this step."""
        return tokens

    def may_start_partial(self, call: CallView, view: EngineView) -> bool:
        """Whether a waiting call whose whole remaining prompt does not fit the free
        blocks may start now on the chunk that does (``chunk`` sizes it); asked only
        when ``reserve_full_prompt``."""
        return False

    def victim(self, running: Sequence[CallView], view: EngineView) -> CallView:
        """The running call to preempt (``running`` in the engine's order)."""
        return running[-1]

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        """What to do with a finished call's KV (a call that ends its session is always
        released)."""
        return Release()

    def reclaim(
        self, pins: Sequence[PinView], needed_blocks: int, view: EngineView
    ) -> Sequence[PinView]:
        """Pins to drop, in order, until ``needed_blocks`` are free; dropping every pin
        comes before any preemption."""
        return sorted(pins, key=lambda pin: pin.pinned_s)

    def tick(self, view: EngineView) -> Sequence[SessionAction]:
        """Periodic actions (see ``tick_interval_s``; needs ``Capability.TICK``)."""
        return ()

    def decode_sm_share(self, view: EngineView) -> float | None:
        """The share of the GPU's SMs (0 to 1) reserved for decoding from now on, the
        rest running prefills at the same time (seed 002's Green Contexts;
        ``Capability.SM_PARTITION``); asked at every step by an engine that provides
        the partition. None (the default): no partition, prefills and decodes share
        each step, as stock vLLM's."""
        return None

    def runs_with_decodes(self, call: CallView, view: EngineView) -> bool:
        """Whether a call computing prompt tokens runs in the decode partition, with the
        decodes, rather than in the prefill one; asked only while ``decode_sm_share``
        gives a share. The default (False) puts every prefill in the prefill
        partition."""
        return False


class Policy:
    """A registered scheduling policy: its settings and its two halves. Subclasses take
    their settings as constructor keywords (checked there) and override the halves
    they change."""

    name: ClassVar[str] = ""
    """The registry name (``--policy NAME``)."""
    variant: ClassVar[str] = ""
    """Which published rule or code this implements (notes/baselines.md)."""

    def admission(self) -> AdmissionHalf:
        """A fresh admission half (the gateway's, or the simulator's gateway)."""
        return AdmissionHalf()

    def engine(self) -> EngineHalf:
        """A fresh engine half (the plugin's, the simulator's or the twin's)."""
        return EngineHalf()

    def settings(self) -> dict[str, Any]:
        """The policy's parameters, for the results file."""
        return {}
