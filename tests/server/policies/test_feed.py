"""The event feed in front of a policy half: a call or session boundary reaches the half
once, whichever side (the SDK, the gateway, the engine) reports it first; every other
event is told apart by its event id only; and the feed remembers a bounded number of
boundaries."""

from __future__ import annotations

from agentmars.sdk.events import (
    AnyEvent,
    KVStats,
    LLMEnd,
    LLMSubmit,
    SessionEnd,
    SessionEvent,
    SessionPause,
    SessionStart,
    Source,
    ToolEnd,
    ToolStats,
)
from agentmars.server.policies.feed import MEMORY, EventFeed


def feed_and_log(memory: int = MEMORY) -> tuple[EventFeed, list[AnyEvent]]:
    delivered: list[AnyEvent] = []
    return EventFeed(delivered.append, memory=memory), delivered


def submit(source: Source, session_id: str = "s", call_id: str = "c1") -> LLMSubmit:
    """One side's report of call ``call_id``'s submission (its own event id)."""
    return LLMSubmit(session_id=session_id, call_id=call_id, source=source)


def test_a_call_boundary_is_delivered_once_whoever_reports_it_first() -> None:
    orders: list[tuple[Source, Source]] = [
        ("sdk", "gateway"),
        ("gateway", "sdk"),
        ("engine", "sdk"),
    ]
    for first, second in orders:
        feed, delivered = feed_and_log()
        early, late = submit(first), submit(second)
        assert early.event_id != late.event_id  # two reports, not one event twice
        assert feed(early) is True
        assert feed(late) is False
        assert delivered == [early]  # the first report wins, whichever side made it
        assert feed.duplicates == 1


def test_a_tool_call_id_seen_again_in_a_later_turn_is_a_new_boundary() -> None:
    # A model's tool call id ("call_0") can come back in a later turn of one session.
    feed, delivered = feed_and_log()
    first = ToolEnd(session_id="s", call_id="call_0", turn=0, tool="bash", source="sdk")
    again = ToolEnd(session_id="s", call_id="call_0", turn=3, tool="bash", source="sdk")
    echo = ToolEnd(session_id="s", call_id="call_0", turn=3, tool="bash", source="sandbox")
    assert [feed(first), feed(again), feed(echo)] == [True, True, False]
    assert delivered == [first, again]


def test_one_calls_other_boundaries_and_other_calls_are_not_duplicates() -> None:
    feed, delivered = feed_and_log()
    events: list[AnyEvent] = [
        submit("sdk"),
        LLMEnd(session_id="s", call_id="c1", source="engine"),  # same call, other kind
        submit("sdk", call_id="c2"),  # same session, other call
        submit("sdk", session_id="t"),  # same call id in another session
        ToolEnd(session_id="s", call_id="c1", tool="bash"),  # a tool of that id
    ]
    assert [feed(event) for event in events] == [True] * 5
    assert delivered == events
    assert feed.duplicates == 0
    # Each of them reported again by another side (new event ids): all dropped.
    again: list[AnyEvent] = [
        submit("gateway"),
        LLMEnd(session_id="s", call_id="c1", source="gateway"),
        submit("gateway", call_id="c2"),
        submit("gateway", session_id="t"),
        ToolEnd(session_id="s", call_id="c1", tool="bash", source="sandbox"),
    ]
    assert [feed(event) for event in again] == [False] * 5
    assert delivered == events
    assert feed.duplicates == 5


def test_session_boundaries_are_known_by_kind_and_session() -> None:
    feed, delivered = feed_and_log()
    start = SessionStart(session_id="s", source="sdk")
    end = SessionEnd(session_id="s", source="sdk")
    assert feed(start) and feed(end)
    assert not feed(SessionStart(session_id="s", source="gateway"))
    assert not feed(SessionEnd(session_id="s", source="gateway", turns=3))
    assert feed(SessionStart(session_id="other", source="gateway"))
    assert all(isinstance(e, SessionEvent) for e in delivered)
    assert [(e.kind, e.session_id, e.source) for e in delivered if isinstance(e, SessionEvent)] == [
        ("session_start", "s", "sdk"),
        ("session_end", "s", "sdk"),
        ("session_start", "other", "gateway"),
    ]


def test_other_events_are_deduplicated_by_event_id_only() -> None:
    feed, delivered = feed_and_log()
    # Two samples with the same figures are two events: both delivered.
    sample = KVStats(total_blocks=8, free_blocks=3, used_blocks=5, source="engine")
    same_figures = KVStats(total_blocks=8, free_blocks=3, used_blocks=5, source="engine")
    assert feed(sample) and feed(same_figures)
    # One event that comes back over the side channel (the same event id): once.
    assert not feed(sample)
    assert not feed(sample.model_copy(update={"source": "gateway"}))
    # A session paused twice (paused, resumed, paused again) is two events, although
    # both are about the same session: not a boundary, only the event id counts.
    pauses = [SessionPause(session_id="s"), SessionPause(session_id="s")]
    assert [feed(p) for p in pauses] == [True, True]
    stats = ToolStats(active=1)
    assert feed(stats) and not feed(stats)
    assert delivered == [sample, same_figures, *pauses, stats]
    assert feed.duplicates == 3


def test_memory_is_bounded_and_the_oldest_boundary_is_forgotten_first() -> None:
    feed, delivered = feed_and_log(memory=2)
    a, b, c = (submit("sdk", call_id=call_id) for call_id in ("a", "b", "c"))
    assert feed(a) and feed(b) and feed(c)
    # Room for 2: a, the oldest, is forgotten; b and c are still known.
    assert not feed(submit("gateway", call_id="c"))
    assert not feed(submit("gateway", call_id="b"))
    late_a = submit("gateway", call_id="a")
    assert feed(late_a)  # delivered again: past the memory
    # Now a and c are known (b went when a came back): b is delivered, c still not.
    assert not feed(submit("engine", call_id="c"))
    assert feed(submit("engine", call_id="b"))
    assert not feed(submit("engine", call_id="a"))
    assert all(isinstance(e, LLMSubmit) for e in delivered)
    assert [e.call_id for e in delivered if isinstance(e, LLMSubmit)] == ["a", "b", "c", "a", "b"]


def test_the_default_memory_holds_a_long_run_of_boundaries() -> None:
    feed, delivered = feed_and_log()
    first = submit("sdk", call_id="0")
    feed(first)
    for index in range(1, MEMORY):
        feed(submit("sdk", call_id=str(index)))
    # MEMORY boundaries in all: the first is still known...
    assert not feed(submit("gateway", call_id="0"))
    feed(submit("sdk", call_id=str(MEMORY)))
    # ... until one more pushes it out.
    assert feed(submit("gateway", call_id="0"))
    assert len(delivered) == MEMORY + 2
