"""Admission under hostile or careless clients: every structure bounded, each call's
and each event's cost independent of how many sessions sit idle (issue 10). The
admission runs on its own here, with a clock the test moves: no waiting on time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from agentmars.sdk.events import AnyEvent, SessionEnd, SessionStart, ToolEnd, ToolStart
from agentmars.server.gateway import admission as admission_module
from agentmars.server.gateway.admission import Admission
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.gateway.proxy import GatewayError
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.interface import AdmissionHalf
from agentmars.server.policies.views import AdmissionView, SessionView
from tests.server.gateway.clock import Clock


class Window(AdmissionHalf):
    """Admits while fewer than ``width`` sessions are admitted."""

    def __init__(self, width: int) -> None:
        self.width = width

    def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
        return queue[: max(0, self.width - view.active_sessions)]


class CountingView(StreamAdmissionView):
    """Counts the questions admission asks about tool activity."""

    asked = 0

    def runs_tools(self, session_id: str) -> bool:
        self.asked += 1
        return super().runs_tools(session_id)


def make(width: int = 1_000_000, **settings: float) -> tuple[Admission, list[AnyEvent], Clock]:
    clock = Clock()
    view = CountingView(clock=clock, block_size=16, tool_cores=2)
    published: list[AnyEvent] = []
    admission = Admission(
        Window(width), view, publish=published.extend, clock=clock, **settings
    )  # fmt: skip
    return admission, published, clock


def meta(session_id: str) -> CallMeta:
    return CallMeta(
        session_id=session_id, call_id=f"{session_id}-c", turn=None, follows_tool=False,
        expects_tool=False, prompt_tokens=10, ephemeral=False,
    )  # fmt: skip


def ends(published: list[AnyEvent]) -> list[tuple[str, str | None]]:
    return [(e.session_id, e.error) for e in published if isinstance(e, SessionEnd)]


async def test_a_call_asks_nothing_of_the_idle_sessions() -> None:
    admission, _, clock = make()
    for n in range(2_000):
        await admission.enter(meta(f"s{n}"))
        admission.leave(f"s{n}")
        admission.on_events([ToolStart(session_id=f"s{n}", call_id="t", tool="bash")])
    view = admission.view
    assert isinstance(view, CountingView)
    view.asked = 0
    clock.now += 1.0
    await admission.enter(meta("new"))
    admission.leave("new")
    admission.on_events([ToolEnd(session_id="s0", call_id="t", tool="bash", duration_s=1.0)])
    # Today's admission walked every admitted session, asking each about its tools.
    assert view.asked < 10  # one or two per change, not one per session (2,000)


async def test_idle_sessions_end_when_due_and_only_then() -> None:
    admission, published, clock = make(session_idle_s=10.0)
    await admission.enter(meta("a"))
    admission.leave("a")
    clock.now = 5.0
    await admission.enter(meta("b"))
    admission.leave("b")
    clock.now = 10.0
    admission.admit()
    assert ends(published) == [("a", "no call or tool for 10 s")]
    assert list(admission.admitted) == ["b"]
    clock.now = 15.0
    admission.admit()
    assert [s for s, _ in ends(published)] == ["a", "b"] and admission.admitted == {}


async def test_a_tool_that_never_ends_holds_its_session_only_so_long() -> None:
    admission, published, clock = make(session_idle_s=10.0, tool_silence_s=100.0)
    await admission.enter(meta("a"))
    admission.leave("a")
    admission.on_events([ToolStart(session_id="a", call_id="t", tool="bash")])
    clock.now = 99.0
    admission.admit()
    assert ends(published) == []  # its tool runs: not idle
    clock.now = 100.0
    admission.admit()
    assert ends(published) == [("a", "no call and no tool event for 100 s")]


async def test_a_session_known_only_from_the_stream_ends_too() -> None:
    # Today a session_start with no call stayed in the gateway (and both halves) forever.
    admission, published, clock = make(session_idle_s=10.0)
    admission.on_events([SessionStart(session_id="x", agent="coder")])
    assert admission.known["x"].agent == "coder"
    clock.now = 10.0
    admission.admit()
    assert ends(published) == [("x", "no call or tool for 10 s")]
    assert admission.known == {}


async def test_known_sessions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "MAX_KNOWN_SESSIONS", 3)
    admission, published, clock = make()
    for n in range(5):
        clock.now = n
        admission.on_events([SessionStart(session_id=f"x{n}")])
    assert list(admission.known) == ["x2", "x3", "x4"]
    assert [s for s, _ in ends(published)] == ["x0", "x1"]
    # the agent name of a known session reaches its first call's SessionView
    admission.on_events([SessionStart(session_id="x4", agent="coder")])
    await admission.enter(meta("x4"))
    assert "x4" in admission.admitted and "x4" not in admission.known


async def test_past_the_waiting_limit_a_new_session_gets_429(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission_module, "MAX_WAITING_SESSIONS", 2)
    admission, _, _ = make(width=0)
    waiting = [asyncio.create_task(admission.enter(meta(s))) for s in ("a", "b")]
    await asyncio.sleep(0)
    assert list(admission.waiting) == ["a", "b"]
    with pytest.raises(GatewayError) as refused:
        await admission.enter(meta("c"))
    assert refused.value.status == 429
    # a further call of a session that already waits joins it
    also_a = asyncio.create_task(admission.enter(meta("a")))
    await asyncio.sleep(0)
    assert admission.waiting["a"].calls == 2
    for task in [*waiting, also_a]:
        task.cancel()
    await asyncio.gather(*waiting, also_a, return_exceptions=True)
    assert admission.waiting == {}
    # sessions that gave up waiting are known until they idle out
    assert set(admission.known) == {"a", "b"}


async def test_past_the_seats_a_new_session_gets_429_at_once_while_all_are_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Today a new session waited for the idle expiry (300 s), with no 429.
    monkeypatch.setattr(admission_module, "MAX_ADMITTED_SESSIONS", 2)
    admission, _, _ = make()
    for s in ("a", "b"):
        await admission.enter(meta(s))  # each with a call in flight
    with pytest.raises(GatewayError) as refused:
        await admission.enter(meta("c"))
    assert refused.value.status == 429
    assert refused.value.headers == {"Retry-After": "1"}
    assert admission.waiting == {} and sorted(admission.admitted) == ["a", "b"]


async def test_past_the_seats_the_least_recently_active_idle_seat_goes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission_module, "MAX_ADMITTED_SESSIONS", 3)
    admission, published, clock = make()
    for n, s in enumerate(("a", "b", "c")):
        clock.now = float(n)
        await admission.enter(meta(s))
    admission.leave("b")  # idle since 2.0
    clock.now = 2.5
    admission.leave("a")  # idle since 2.5
    await asyncio.wait_for(admission.enter(meta("d")), 1.0)
    # "b" was quiet longest: its seat went back, but it is not over
    assert sorted(admission.admitted) == ["a", "c", "d"]
    assert "b" in admission.known and ends(published) == []
    # a busy session is never evicted: "c" has a call in flight
    await asyncio.wait_for(admission.enter(meta("e")), 1.0)
    assert sorted(admission.admitted) == ["c", "d", "e"]
