"""When a session holds its admission seat (issue 38): while it has a call in flight or
a tool the stream shows open, and for a gap after that; past the gap the seat goes
back, the session stays open and keeps its place. The admission runs on its own here,
with a clock the test moves: no waiting on time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agentmars.sdk.events import (
    AnyEvent,
    KVPin,
    KVStats,
    KVUnpin,
    SessionEnd,
    ToolEnd,
    ToolStart,
)
from agentmars.server.gateway.admission import Admission
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.gateway.gaps import FIRST_GAP_S, MIN_GAP_S
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.interface import AdmissionHalf
from agentmars.server.policies.views import AdmissionView, SessionView
from tests.server.gateway.clock import Clock


class Seats(AdmissionHalf):
    """Seats while fewer than ``width`` sessions hold one; records what it is told."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.released: list[str] = []
        self.seated_back: list[str] = []
        self.queues: list[list[tuple[str, float]]] = []

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        self.queues.append([(s.session_id, s.arrival_s) for s in queue])
        return queue[: max(0, self.width - view.active_sessions)]

    def release(self, session_id: str) -> None:
        self.released.append(session_id)

    def seated(self, session: SessionView, view: AdmissionView) -> None:
        self.seated_back.append(session.session_id)


def make(
    width: int = 1, kv: KVStats | None = None, **settings: float
) -> tuple[Admission, Seats, list[AnyEvent], Clock]:
    clock = Clock()
    sources = [lambda: kv] if kv is not None else None
    view = StreamAdmissionView(clock=clock, block_size=16, tool_cores=2, kv_sources=sources)
    half = Seats(width)
    published: list[AnyEvent] = []
    admission = Admission(half, view, publish=published.extend, clock=clock, **settings)
    return admission, half, published, clock


def meta(session_id: str, prompt_tokens: int = 10) -> CallMeta:
    return CallMeta(
        session_id=session_id, call_id=f"{session_id}-c", turn=None, follows_tool=False,
        expects_tool=True, prompt_tokens=prompt_tokens, ephemeral=False,
    )  # fmt: skip


async def call(admission: Admission, session_id: str) -> int:
    turn = await asyncio.wait_for(admission.enter(meta(session_id)), 1.0)
    admission.leave(session_id)
    return turn


def at(admission: Admission, clock: Clock, now: float) -> None:
    clock.now = now
    admission.admit()


async def test_a_seat_goes_back_after_the_gap_and_the_session_keeps_its_place() -> None:
    # Today a session without tool events or a goodbye kept its seat for 300 s.
    admission, half, published, clock = make(width=1)
    await call(admission, "a")
    at(admission, clock, FIRST_GAP_S - 0.01)
    assert list(admission.admitted) == ["a"]  # no gap measured yet: the first limit
    at(admission, clock, FIRST_GAP_S)
    assert admission.admitted == {} and half.released == ["a"]
    assert [e for e in published if isinstance(e, SessionEnd)] == []  # still open
    assert admission.known["a"].next_turn == 1
    # "b" takes the seat; "a" comes back and waits with its first arrival (0.0)
    clock.now = 11.0
    await call(admission, "b")
    back = asyncio.create_task(admission.enter(meta("a")))
    await asyncio.sleep(0)
    assert half.queues[-1] == [("a", 0.0)] and not back.done()
    # the gaps measured so far: a's 11 s (b's first call had none): the limit is 11 s
    at(admission, clock, 11.0 + 10.9)
    assert not back.done()
    at(admission, clock, 11.0 + 11.0)
    assert await asyncio.wait_for(back, 1.0) == 1  # its turns go on
    assert list(admission.admitted) == ["a"]


async def test_a_tool_the_stream_shows_open_holds_the_seat_until_its_end() -> None:
    admission, half, _, clock = make(width=1)
    await call(admission, "a")
    admission.on_events([ToolStart(session_id="a", call_id="t", tool="pytest")])
    at(admission, clock, 1000.0)  # far past any gap, short of the tool silence
    assert list(admission.admitted) == ["a"] and half.released == []
    admission.on_events([ToolEnd(session_id="a", call_id="t", tool="pytest", duration_s=1e9)])
    at(admission, clock, 1000.0 + FIRST_GAP_S)
    assert admission.admitted == {} and half.released == ["a"]


async def test_a_tool_announced_but_never_started_holds_nothing() -> None:
    # Issue 38 item 3: another session reports a tool of 600 s (or 1e9) for "t"; calls
    # that expect "t" (vllm_xargs expects_tool, next_tool) but never start it.
    admission, half, _, clock = make(width=2)
    admission.on_events([ToolEnd(session_id="x", call_id="q", tool="t", duration_s=1e9)])
    assert admission.view.tools.durations.ema_s["t"] == 24 * 3600.0  # bounded
    for session_id in ("a", "b"):
        await call(admission, session_id)
    clock.now = 1.0
    new = asyncio.create_task(admission.enter(meta("c")))
    await asyncio.sleep(0)
    at(admission, clock, FIRST_GAP_S)
    await asyncio.wait_for(new, 1.0)
    assert sorted(half.released) == ["a", "b"]


async def test_the_gap_limit_follows_the_gaps_measured() -> None:
    admission, half, _, clock = make(width=100)
    for n in range(20):  # sessions that call again 0.2 s after their call ended
        clock.now = float(n)
        await call(admission, f"s{n}")
        clock.now += 0.2
        await call(admission, f"s{n}")
    clock.now = 100.0
    await call(admission, "a")
    at(admission, clock, 100.0 + MIN_GAP_S - 0.01)
    assert "a" in admission.admitted
    at(admission, clock, 100.0 + MIN_GAP_S)  # P95 of 0.2 s gaps, floored at 1 s
    assert "a" not in admission.admitted and "a" in half.released


async def test_the_gateways_session_end_says_how_long_the_session_lasted() -> None:
    # Today sessions ended by the expiry were recorded as lasting until it (300 s).
    admission, _, published, clock = make(width=10, session_idle_s=300.0)
    await call(admission, "a")
    clock.now = 4.0
    await call(admission, "a")
    clock.now = 5.0
    admission.on_events([ToolStart(session_id="a", call_id="t", tool="bash")])
    admission.on_events([ToolEnd(session_id="a", call_id="t", tool="bash", duration_s=2.0)])
    at(admission, clock, 5.0 + 300.0)
    (ended,) = [e for e in published if isinstance(e, SessionEnd)]
    assert (ended.session_id, ended.duration_s, ended.turns) == ("a", 5.0, 2)


async def test_a_prompt_larger_than_the_engines_kv_goes_in_at_once() -> None:
    # Issue 38 item 2: the hog's call hung while other sessions were seated; now the
    # engine answers it with its own 4xx at once.
    kv = KVStats(total_blocks=48, free_blocks=48, used_blocks=0)
    admission, _, _, _ = make(width=1, kv=kv)
    await asyncio.wait_for(admission.enter(meta("busy")), 1.0)  # the one seat, busy
    hog = await asyncio.wait_for(admission.enter(meta("hog", 48 * 16 + 1)), 1.0)
    assert hog == 0 and "hog" in admission.admitted
    fits = asyncio.create_task(admission.enter(meta("small", 48 * 16)))
    await asyncio.sleep(0)
    assert not fits.done()  # a prompt that fits waits for its seat as usual
    fits.cancel()


async def test_a_session_whose_kv_is_pinned_is_seated_again_at_once() -> None:
    # MORI pinned the contexts of sessions that had given their seat back, and fitted
    # their next calls into the free KV those pins left: no call ever came back.
    admission, half, _, clock = make(width=1)
    await call(admission, "a")
    admission.on_events([KVPin(session_id="a", blocks=20)])
    at(admission, clock, FIRST_GAP_S)
    assert admission.admitted == {} and half.released == ["a"]  # pinned or not
    clock.now = 11.0
    await call(admission, "b")  # the one seat
    assert await call(admission, "a") == 1  # no wait, past the window
    assert half.seated_back == ["a"] and half.queues[-1] == [("b", 11.0)]
    # unpinned, a session that gave its seat back waits for one again
    at(admission, clock, 11.0 + 11.0)
    admission.on_events([KVUnpin(session_id="a", blocks=20, reason="expired")])
    await call(admission, "b")
    back = asyncio.create_task(admission.enter(meta("a")))
    await asyncio.sleep(0)
    assert not back.done() and half.seated_back == ["a"]
    back.cancel()


async def test_a_call_longer_than_the_gap_keeps_its_seat_for_a_gap_after_it() -> None:
    # Seen on vLLM: a session seated at 0 whose call ended at 18 s gave its seat back at
    # once: its gap was counted from its admission, not from its call's end.
    admission, half, _, clock = make(width=1)
    await asyncio.wait_for(admission.enter(meta("a")), 1.0)
    at(admission, clock, 3 * FIRST_GAP_S)
    admission.leave("a")
    at(admission, clock, 4 * FIRST_GAP_S - 0.01)
    assert list(admission.admitted) == ["a"] and half.released == []
    at(admission, clock, 4 * FIRST_GAP_S)
    assert half.released == ["a"]
