"""MARS's External Control Plane, the admission half (seed 000 §4.2, Algorithm 1):
BalanceAndAdmit = PackQueue (``pack_queue``), then UpdateWindow (``window``), then
admit ``limit - active`` sessions from the front of the packed queue.

It reads only the stream (docs/policies.md): the engine's sampled ``kv_stats``, the
tool figures (active and queued tools, durations), and the LLM calls' boundaries
(their projected and actual KV, for the KV limit; their duration, for the CPU
limit). Every change of the admission limit it works out at a
control update is a ``window_update`` event, which the gateway's ``/metrics`` shows
as ``agentmars_admission_window_sessions``.

The CPU side of co-scheduling: ``tool_priority`` ranks a session's queued tool calls
in the sandbox pool as PackQueue ranks sessions. NOTE: ours — seed 000 throttles tools
only through admission (fewer sessions admitted under CPU overload); ordering the
pool's queue the same way is this project's addition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMEnd,
    LLMSubmit,
    SessionEnd,
    ToolEnd,
    WindowUpdate,
)
from agentmars.sdk.tool_stats import ToolDurations
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.interface import AdmissionHalf
from agentmars.server.policies.mars.kv_value import KeepingRegime
from agentmars.server.policies.mars.pack_queue import pack_mode, pack_queue, tool_rank
from agentmars.server.policies.mars.settings import MarsSettings
from agentmars.server.policies.mars.window import (
    AdmissionWindow,
    Pressure,
    cpu_limit,
    kv_limit,
    soft_cap_share,
)
from agentmars.server.policies.views import AdmissionView, SessionView

ALL_TOOLS = "*"
TOOL_CPU = "*cpu"
"""The EMAs kept beside the LLM calls' (``llm``): every tool's duration, and its CPU
time."""


class MarsControlPlane(AdmissionHalf):
    needs = frozenset({Capability.KV_FIGURES, Capability.TOOL_FIGURES})
    tail_guard: ClassVar[bool] = True
    """No session waits past ``tail_guard_factor`` times its predicted service
    (``overdue_first``), and W_adm holds no session back while the KV and the tool
    cores have room (``update_window``)."""
    tier: ClassVar[bool] = True
    """The engine half keeps parked sessions' KV in the engine's CPU tier where that
    pays: the admitted KV may fill the GPU and the tier together (``resident_blocks``)."""

    def __init__(self, settings: MarsSettings) -> None:
        self.settings = settings
        self.control_interval_s = settings.control_interval_s
        self.window = AdmissionWindow(settings)
        self.limit: float = math.inf
        """The newest admission limit: min(W_adm, W_cpu, W_kv)."""
        self.published: int | None = None
        self._durations = ToolDurations()
        """EMAs of every tool's duration and CPU time and every LLM call's duration."""
        self._footprint: dict[str, int] = {}
        """Each admitted session's newest projected KV, in blocks."""
        self._settled: dict[str, int] = {}
        """Each admitted session's KV as its last finished call left it, in blocks: what
        its footprint falls back to when a call fails (refused, cut off, timed out)."""
        self.working_set = 0
        """The admitted sessions' projected KV together, in blocks."""
        self._parked: set[str] = set()
        """Admitted sessions between two calls (their tool runs)."""
        self.parked_blocks = 0
        """Their part of the working set."""
        self._keeping = KeepingRegime(settings)
        self._cpu_overloaded = False
        self._block_size = 1

    def on_event(self, event: AnyEvent) -> None:
        self._keeping.observe(event)
        if isinstance(event, ToolEnd):
            self._durations.record(ALL_TOOLS, event.duration_s)
            # A tool whose CPU time is not reported is taken to keep a core busy.
            cpu = event.cpu_time_s if event.cpu_time_s is not None else event.duration_s
            self._durations.record(TOOL_CPU, cpu)
        elif isinstance(event, LLMEnd):
            self._call_ended(event)
        elif isinstance(event, LLMSubmit):
            self._park(event.session_id, False)
            if event.projected_prompt_tokens is not None:
                tokens = event.projected_prompt_tokens + (event.max_tokens or 0)
                self._project(event.session_id, tokens)
        elif isinstance(event, SessionEnd):
            self.release(event.session_id)

    def release(self, session_id: str) -> None:
        """The session ended or gave its seat back: its KV is no longer ours to count."""
        self._park(session_id, False)
        self.working_set -= self._footprint.pop(session_id, 0)
        self._settled.pop(session_id, None)

    def _call_ended(self, event: LLMEnd) -> None:
        """A call's projection gives way to what the call left: its actual KV when it
        ran, or what the session held before it when it failed."""
        session_id = event.session_id
        if event.status == "ok":
            self._durations.record("llm", event.duration_s)
            # Without the engine's count (a stream that reported no usage) the call's
            # projection from its submit stands: an unknown context is not an empty one.
            if event.prompt_tokens is not None:
                self._project(session_id, event.prompt_tokens + (event.output_tokens or 0))
            if session_id in self._footprint:
                self._settled[session_id] = self._footprint[session_id]
        elif session_id in self._footprint:
            self._set_footprint(session_id, self._settled.get(session_id, 0))
        self._park(session_id, True)

    def _project(self, session_id: str, tokens: int) -> None:
        """The session's projected KV (gpu_submit's projection, gpu_end's actual);
        only admitted sessions count."""
        if session_id in self._footprint:
            self._set_footprint(session_id, -(-tokens // self._block_size))

    def _set_footprint(self, session_id: str, blocks: int) -> None:
        change = blocks - self._footprint.get(session_id, 0)
        self.working_set += change
        if session_id in self._parked:
            self.parked_blocks += change
        self._footprint[session_id] = blocks

    def _park(self, session_id: str, parked: bool) -> None:
        """An admitted session's call ended (parked: its tool runs) or its next one
        came (or it ended)."""
        if session_id not in self._footprint or parked == (session_id in self._parked):
            return
        blocks = self._footprint[session_id]
        if parked:
            self._parked.add(session_id)
            self.parked_blocks += blocks
        else:
            self._parked.remove(session_id)
            self.parked_blocks -= blocks

    # --- the telemetry --------------------------------------------------------------------

    def cores_per_tool(self) -> float:
        """The cores a running tool keeps busy, by the EMAs (1 until a tool ended)."""
        ema = self._durations.ema_s
        wall, cpu = ema.get(ALL_TOOLS), ema.get(TOOL_CPU)
        return cpu / wall if wall and cpu is not None else 1.0

    def cpu_overloaded(self, view: AdmissionView) -> bool:
        """Tools queue (backlog), or the running ones ask for more than the tool
        cores (their CPU time over their duration, from the stream: tools that wait
        on something remote ask for none)."""
        demand = view.active_tools * self.cores_per_tool()
        return view.queued_tools > 0 or demand > view.tool_cores * self.settings.cpu_overload_ratio

    def pressure(self, view: AdmissionView) -> Pressure:
        """KV usage is the larger of what the running calls hold now (pins yield
        before any preemption, so they do not count) and the admitted sessions'
        resident KV against what holds it (``capacity_blocks``)."""
        kv = view.kv
        usage = None
        if kv is not None and kv.total_blocks:
            held = (kv.used_blocks - kv.pinned_blocks) / kv.total_blocks
            usage = max(held, self.resident_blocks(view) / self.capacity_blocks(kv))
        return Pressure(self.cpu_overloaded(view), usage)

    def resident_blocks(self, view: AdmissionView) -> int:
        """The KV the admitted sessions hold, projected: the working set, less the
        sessions parked in a tool when keeping their KV does not pay
        (``kv_value.KeepingRegime``).

        A session in a tool holds no blocks, but its context comes back, and admitting
        past the pool evicts it (NOTE: ours — the cached prefix of a session in a tool
        counts as free in the engine's figures, so those alone miss the churn seed 000
        Fig. 3 shows). That churn costs a resume's prefill: dear on a long context and
        a slow engine, cheap on a short one and a fast engine, where counting the
        parked sessions anyway held sessions at the gateway while the engine had the
        time to recompute the contexts they would evict (docs/results/mars.md)."""
        kv = view.kv
        if self.parked_blocks == 0 or kv is None:
            return self.working_set
        if self._keeping.keeping_pays(kv.total_blocks * view.block_size):
            return self.working_set
        return self.working_set - self.parked_blocks

    def capacity_blocks(self, kv: KVStats) -> int:
        """What holds the admitted sessions' KV: the GPU pool, and with ``tier`` the
        engine's CPU tier too, where the engine half sends parked contexts and
        preempted calls. NOTE: ours — a context evicted to the tier comes back by a
        transfer, not a recompute, so filling both is not thrashing. A limit on the
        KV of the sessions not parked against the GPU alone, tried beside it, held
        back short-context sessions the engine had room to queue (ILR-1 at 0.4/s,
        H100: 77.1 s mean against 73.6 s; docs/mars.md)."""
        return kv.total_blocks + (kv.cpu_total_blocks if self.tier else 0)

    def available_blocks(self, view: AdmissionView) -> int | None:
        """The capacity less the admitted sessions' resident KV (None: no figures)."""
        kv = view.kv
        if kv is None:
            return None
        return max(self.capacity_blocks(kv) - self.resident_blocks(view), 0)

    # --- BalanceAndAdmit ------------------------------------------------------------------

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        self._block_size = view.block_size
        pressure = self.pressure(view)
        self._cpu_overloaded = pressure.cpu_overloaded
        packed, blocks = self.pack(queue, view, pressure)
        limit = self.update_window(view, pressure, blocks, bool(queue))
        slots = limit - view.active_sessions
        if slots <= 0:
            return ()
        admitted = packed[: int(min(slots, len(packed)))]
        for session in admitted:
            self.seated(session, view)
        return admitted

    def seated(self, session: SessionView, view: AdmissionView) -> None:
        self._set_footprint(session.session_id, view.blocks_for(session.prompt_tokens))

    def pack(
        self, queue: Sequence[SessionView], view: AdmissionView, pressure: Pressure
    ) -> tuple[list[SessionView], list[int]]:
        """PackQueue: the queue in admission order and each session's blocks."""
        blocks = [view.blocks_for(session.prompt_tokens) for session in queue]
        total = view.kv.total_blocks if view.kv is not None else 0
        long_blocks = total * self.settings.long_session_fraction if total else math.inf
        mode = pack_mode(blocks, cpu_overloaded=pressure.cpu_overloaded, long_blocks=long_blocks)
        packed = pack_queue(queue, blocks, mode, self.available_blocks(view))
        if self.tail_guard:
            packed = self.overdue_first(packed, view)
        by_id = {session.session_id: need for session, need in zip(queue, blocks, strict=True)}
        return packed, [by_id[session.session_id] for session in packed]

    def overdue_first(self, packed: list[SessionView], view: AdmissionView) -> list[SessionView]:
        """The tail guard: sessions that have waited past ``tail_guard_factor`` times
        their predicted service go first, the longest waiting first; the rest keep
        PackQueue's order. A session's predicted service is its first call: the
        stream's mean LLM call and the prefill of its prompt at the stream's prefill
        rate (None until a call has ended: no guard).

        NOTE: ours — aging, not a virtual-time rule like Justitia's: PackQueue's
        order (small first) is what makes MARS's mean, and aging leaves it alone
        until a session's wait is out of proportion to its work, which is where the
        P95 comes from (the largest sessions waited longest, docs/results/mars.md)."""
        llm = self._durations.ema_s.get("llm")
        if llm is None:
            return packed
        rate = self._keeping.prefill.seconds_per_token() or 0.0
        factor = self.settings.tail_guard_factor

        def overdue_for(session: SessionView) -> float:
            bound = factor * (llm + rate * session.prompt_tokens)
            return view.now - session.arrival_s - bound

        late = sorted((s for s in packed if overdue_for(s) > 0), key=lambda s: s.arrival_s)
        if not late:
            return packed
        ahead = {session.session_id for session in late}
        return late + [session for session in packed if session.session_id not in ahead]

    def update_window(
        self, view: AdmissionView, pressure: Pressure, packed_blocks: list[int], waiting: bool
    ) -> float:
        """UpdateWindow: min(W_adm, W_cpu, W_kv); publishes the limit when it changed
        at a control update."""
        active = view.active_sessions
        updated = self.window.update(view.now, pressure, active, waiting)
        ema = self._durations.ema_s
        w_cpu = cpu_limit(
            ema.get(TOOL_CPU), ema.get(ALL_TOOLS), ema.get("llm"), view.tool_cores, self.settings
        )
        share = soft_cap_share(pressure.kv_usage, self.settings)
        w_kv = kv_limit(active, packed_blocks, self.available_blocks(view), share)
        room = not pressure.cpu_overloaded and (
            pressure.kv_usage is None or pressure.kv_usage < self.settings.kv_slack_usage
        )
        raw = math.inf if self.tail_guard and room else self.window.raw
        self.limit = min(raw, w_cpu, w_kv)
        if updated or self.published is None:
            self._publish_window(view, pressure, w_cpu, w_kv)
        return self.limit

    def _publish_window(
        self, view: AdmissionView, pressure: Pressure, w_cpu: float, w_kv: float
    ) -> None:
        window = int(min(self.limit, self.settings.max_window))
        if window == self.published:
            return
        if self.limit == self.window.raw:
            reason = self.window.reason
        else:
            reason = "cpu limit" if w_cpu <= w_kv else "kv soft cap"
        kv = view.kv
        self.publish(
            WindowUpdate(
                window=window,
                previous=self.published if self.published is not None else window,
                reason=reason,
                kv_free_blocks=kv.free_blocks if kv is not None else None,
                active_tools=view.active_tools,
                source="gateway",
            )
        )
        self.published = window

    def tool_priority(self, session_id: str) -> int:
        return tool_rank(self._footprint.get(session_id, 0), self._cpu_overloaded)


class PaperControlPlane(MarsControlPlane):
    """Seed 000's admission half: no tail guard, and the GPU alone holds the KV."""

    tail_guard = False
    tier = False


class NoTierControlPlane(MarsControlPlane):
    """The tail guard without a tier to count."""

    tier = False


class NoTailGuardControlPlane(MarsControlPlane):
    """A tier to count without the tail guard."""

    tail_guard = False
