"""The event schema: wire round trips, the discriminator, and rejection of bad input."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from agentmars.sdk.events import (
    EVENT_KINDS,
    MAX_COUNT,
    MAX_NS,
    MAX_SECONDS,
    SCHEMA_VERSION,
    Event,
    EventError,
    KVPin,
    KVStats,
    KVUnpin,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    MalformedEvent,
    SessionEnd,
    SessionMove,
    SessionPause,
    SessionResume,
    SessionStart,
    TaskCost,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    ToolStats,
    UnknownEventVersion,
    WindowUpdate,
    decode_event,
    decode_jsonl,
    encode_jsonl,
)

SID = "5f0c2a9e8b7d4c31a2e6f7b8c9d0e1f2"
CALL = "c3d1e5f7a9b2c4d6"


def realistic_events() -> list[Event]:
    """One fully populated event of every kind, as an agent run would produce them."""
    return [
        SessionStart(
            session_id=SID,
            mono_ns=1_000_000_000,
            wall_ns=1_718_000_000_000_000_000,
            agent="coder",
            metadata={"task": "django__django-11099", "benchmark": "swe-bench-lite"},
        ),
        LLMSubmit(
            session_id=SID,
            call_id=CALL,
            turn=0,
            model="Qwen/Qwen2.5-Coder-7B-Instruct",
            operation="chat",
            stream=True,
            projected_prompt_tokens=1830,
            projected_kv_blocks=115,
            max_tokens=512,
            follows_tool=False,
            expects_tool=True,
        ),
        LLMFirstToken(session_id=SID, call_id=CALL, turn=0, ttft_s=0.183),
        LLMEnd(
            session_id=SID,
            call_id=CALL,
            turn=0,
            status="ok",
            prompt_tokens=1830,
            cached_tokens=1024,
            output_tokens=97,
            freed_blocks=121,
            finish_reason="tool_calls",
            ended_in_tool_call=True,
            duration_s=2.25,
        ),
        SessionPause(session_id=SID, source="engine", reason="thrashing"),
        SessionResume(session_id=SID, source="engine"),
        SessionMove(session_id=SID, source="gateway", from_replica=0, to_replica=2),
        TaskCost(source="gateway", task_id="mrs-00007", agent="MRS", cost=3.9e7),
        ToolEnqueue(session_id=SID, call_id="call_0", turn=0, tool="terminal", priority=-2),
        ToolStart(session_id=SID, call_id="call_0", turn=0, tool="terminal", queue_wait_s=0.004),
        ToolEnd(
            session_id=SID,
            call_id="call_0",
            turn=0,
            tool="terminal",
            source="sandbox",
            status="timeout",
            exit_status=124,
            error="command timed out after 30 s: pytest tests/",
            duration_s=30.0,
            cpu_time_s=11.75,
        ),
        ToolStats(source="sandbox", active=4, queued=2, exec_ema_s={"terminal": 1.7, "py": 0.3}),
        WindowUpdate(
            source="gateway",
            window=12,
            previous=16,
            reason="kv pressure: 80 free blocks, 5 active tools",
            kv_free_blocks=80,
            active_tools=5,
        ),
        KVStats(
            source="engine",
            total_blocks=4096,
            free_blocks=1000,
            used_blocks=3000,
            pinned_blocks=512,
            pins=3,
            released={"expired": 2, "next_call": 5},
            cpu_total_blocks=8192,
            cpu_free_blocks=8000,
            steps=1234,
        ),
        KVPin(session_id=SID, source="engine", blocks=121, ttl_s=30.0),
        KVUnpin(session_id=SID, source="engine", blocks=121, reason="next_call", held_s=4.5),
        SessionEnd(
            session_id=SID,
            status="error",
            error="RuntimeError: the agent gave up",
            turns=7,
            duration_s=125.5,
        ),
    ]


def minimal_events() -> list[Event]:
    """Every kind with only its required fields (optional ones left at their defaults)."""
    return [
        SessionStart(session_id=SID),
        SessionEnd(session_id=SID),
        SessionPause(session_id=SID),
        SessionResume(session_id=SID),
        SessionMove(session_id=SID, from_replica=0, to_replica=1),
        TaskCost(task_id="t", cost=0.0),
        LLMSubmit(session_id=SID, call_id=CALL),
        LLMFirstToken(session_id=SID, call_id=CALL, ttft_s=0.0),
        LLMEnd(session_id=SID, call_id=CALL),
        ToolEnqueue(session_id=SID, call_id=CALL, tool="t"),
        ToolStart(session_id=SID, call_id=CALL, tool="t"),
        ToolEnd(session_id=SID, call_id=CALL, tool="t"),
        ToolStats(active=0),
        WindowUpdate(window=0, previous=0),
        KVStats(total_blocks=0, free_blocks=0, used_blocks=0),
        KVPin(session_id=SID, blocks=0),
        KVUnpin(session_id=SID, blocks=0, reason="shutdown"),
    ]


ALL_EVENTS = realistic_events() + minimal_events()


def test_samples_cover_every_event_kind() -> None:
    # A new kind added to the schema must get a sample here to be round-trip tested.
    assert {e.kind for e in realistic_events()} == set(EVENT_KINDS)
    assert {e.kind for e in minimal_events()} == set(EVENT_KINDS)
    assert len(EVENT_KINDS) == len(set(EVENT_KINDS)) == 17


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: e.kind)
def test_json_round_trip(event: Event) -> None:
    text = event.to_json()
    assert "\n" not in text
    wire = json.loads(text)
    assert wire["kind"] == event.kind
    assert wire["v"] == SCHEMA_VERSION == 1
    assert wire["session_id"] == event.session_id if "session_id" in wire else True

    for form in (text, text.encode(), wire):
        decoded = decode_event(form)
        assert type(decoded) is type(event)
        assert decoded == event
        assert decoded.kind == event.kind
    # Encoding again gives the same bytes.
    assert decode_event(text).to_json() == text


def test_none_fields_are_left_out_of_the_wire_form_and_come_back() -> None:
    end = LLMEnd(session_id=SID, call_id=CALL)
    wire = json.loads(end.to_json())
    for absent in ("turn", "prompt_tokens", "cached_tokens", "error", "finish_reason"):
        assert absent not in wire
    decoded = decode_event(end.to_json())
    assert isinstance(decoded, LLMEnd)
    assert decoded.turn is None and decoded.prompt_tokens is None and decoded.error is None


def test_jsonl_round_trip_of_every_kind() -> None:
    text = encode_jsonl(ALL_EVENTS)
    assert text.endswith("\n")
    assert text.count("\n") == len(ALL_EVENTS)

    for form in (text, text.encode(), io.StringIO(text), text.splitlines(keepends=True)):
        stream = decode_jsonl(form)
        assert stream.errors == []
        assert stream.unknown_versions == []
        assert stream.events == ALL_EVENTS
        assert [type(e) for e in stream.events] == [type(e) for e in ALL_EVENTS]


def test_jsonl_accepts_crlf_and_a_missing_final_newline() -> None:
    events = realistic_events()[:3]
    text = "\r\n".join(e.to_json() for e in events)
    assert decode_jsonl(text).events == events
    assert decode_jsonl(text.encode()).events == events


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_jsonl_lines_split_only_at_newline(separator: str) -> None:
    # JSON writers leave these characters unescaped inside strings; a JSONL line
    # ends at "\n" only, so an event carrying one must still decode from a str.
    end = ToolEnd(
        session_id=SID, call_id=CALL, tool="terminal", error=f"line one{separator}line two"
    )
    start = SessionStart(session_id=SID)
    text = encode_jsonl([start, end, start])
    assert separator in text  # really unescaped on the wire

    stream = decode_jsonl(text)
    assert stream.errors == []
    assert stream.events == [start, end, start]
    assert decode_jsonl(text.encode()).events == [start, end, start]


def test_discriminator_picks_the_class_from_kind() -> None:
    base = {"v": 1, "session_id": SID, "call_id": CALL, "tool": "terminal"}
    assert type(decode_event({**base, "kind": "tool_enqueue"})) is ToolEnqueue
    assert type(decode_event({**base, "kind": "tool_start"})) is ToolStart
    assert type(decode_event({**base, "kind": "tool_end"})) is ToolEnd
    # The same payload with a kind whose fields it lacks is rejected, not coerced.
    with pytest.raises(MalformedEvent, match="ttft_s"):
        decode_event({**base, "kind": "llm_first_token"})


def test_event_defaults() -> None:
    a, b = SessionStart(session_id=SID), SessionStart(session_id=SID)
    assert a.v == SCHEMA_VERSION
    assert a.source == "sdk"
    assert len(a.event_id) == 32 and a.event_id != b.event_id
    assert a.mono_ns <= b.mono_ns
    assert a.wall_ns > 1_600_000_000 * 10**9  # a real wall clock, in ns


@pytest.mark.parametrize("event", realistic_events(), ids=lambda e: e.kind)
def test_events_are_frozen(event: Event) -> None:
    with pytest.raises(ValidationError, match="frozen"):
        event.mono_ns = 5
    with pytest.raises(ValidationError, match="frozen"):
        event.kind = "session_start"
    with pytest.raises(ValidationError, match="frozen"):
        event.source = "engine"


def test_construction_validates_like_decoding() -> None:
    with pytest.raises(ValidationError, match="cached_tokens"):
        LLMEnd(session_id=SID, call_id=CALL, prompt_tokens=10, cached_tokens=11)
    with pytest.raises(ValidationError, match="total_blocks"):
        KVStats(total_blocks=10, free_blocks=6, used_blocks=5)
    with pytest.raises(ValidationError, match="unexpected"):
        SessionStart(session_id=SID, unexpected=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="session_id"):
        SessionStart(session_id="")


# --- malformed input ----------------------------------------------------------------


def llm_end(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "kind": "llm_end", "session_id": SID, "call_id": CALL, **fields}


def tool_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "kind": kind, "session_id": SID, "call_id": CALL, "tool": "t", **fields}


def without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


GE0 = "greater than or equal to 0"

MALFORMED: list[tuple[str, Any, list[str]]] = [
    ("not-json", "this is not json", ["not valid JSON"]),
    ("truncated-json", '{"v": 1, "kind": "llm_end"', ["not valid JSON"]),
    ("bad-utf8", b'{"v": 1, "kind": "\xff"}', ["not valid JSON"]),
    ("array", "[1, 2]", ["JSON object", "list"]),
    ("string", '"llm_end"', ["JSON object", "str"]),
    ("number", "42", ["JSON object", "int"]),
    ("missing-v", without(llm_end(), "v"), ["'v'"]),
    ("null-v", llm_end(v=None), ["'v'"]),
    ("missing-kind", without(llm_end(), "kind"), ["'kind'"]),
    ("unknown-kind", llm_end(kind="gpu_magic"), ["unknown event kind 'gpu_magic'", "llm_end"]),
    ("missing-session-id", without(llm_end(), "session_id"), ["session_id", "Field required"]),
    ("missing-call-id", without(llm_end(), "call_id"), ["call_id", "Field required"]),
    ("missing-tool", {**llm_end(), "kind": "tool_start"}, ["tool_start", "tool", "required"]),
    ("negative-prompt-tokens", llm_end(prompt_tokens=-1), ["prompt_tokens", GE0]),
    ("negative-output-tokens", llm_end(output_tokens=-5), ["output_tokens", GE0]),
    ("negative-turn", llm_end(turn=-1), ["turn", GE0]),
    ("negative-mono-ns", llm_end(mono_ns=-1), ["mono_ns", GE0]),
    ("negative-duration", llm_end(duration_s=-0.5), ["duration_s", GE0]),
    (
        "unknown-release-reason",
        {"v": 1, "kind": "kv_unpin", "session_id": SID, "blocks": 1, "reason": "whim"},
        ["kv_unpin", "reason", "next_call"],
    ),
    ("extra-field", llm_end(temperature=0.7), ["temperature", "Extra inputs are not permitted"]),
    ("wrong-type-count", llm_end(prompt_tokens="many"), ["prompt_tokens", "integer"]),
    ("numeric-string-count", llm_end(prompt_tokens="12"), ["prompt_tokens", "integer"]),
    ("fractional-turn", llm_end(turn=2.5), ["turn", "integer"]),
    ("bool-as-string", llm_end(ended_in_tool_call="yes"), ["ended_in_tool_call", "boolean"]),
    ("int-as-bool", llm_end(ended_in_tool_call=1), ["ended_in_tool_call", "boolean"]),
    ("bool-as-count", llm_end(prompt_tokens=True), ["prompt_tokens", "integer"]),
    ("int-session-id", llm_end(session_id=5), ["session_id", "string"]),
    ("bad-status", llm_end(status="exploded"), ["status", "'ok'"]),
    ("bad-source", llm_end(source="browser"), ["source", "'sdk'"]),
    (
        "metadata-value-not-str",
        {"v": 1, "kind": "session_start", "session_id": SID, "metadata": {"retries": 3}},
        ["metadata.retries", "string"],
    ),
    (
        "cached-exceeds-prompt",
        llm_end(prompt_tokens=10, cached_tokens=20),
        ["cached_tokens (20) exceeds prompt_tokens (10)"],
    ),
    (
        "kv-free-plus-used-exceeds-total",
        {"v": 1, "kind": "kv_stats", "total_blocks": 100, "free_blocks": 60, "used_blocks": 41},
        ["free_blocks + used_blocks (60 + 41) exceeds total_blocks (100)"],
    ),
    (
        "kv-pinned-exceeds-used",
        {
            "v": 1,
            "kind": "kv_stats",
            "total_blocks": 100,
            "free_blocks": 50,
            "used_blocks": 10,
            "pinned_blocks": 11,
        },
        ["pinned_blocks (11) exceeds used_blocks (10)"],
    ),
    ("empty-session-id", llm_end(session_id=""), ["session_id", "at least 1 character"]),
    ("empty-call-id", llm_end(call_id=""), ["call_id", "at least 1 character"]),
    ("empty-event-id", llm_end(event_id=""), ["event_id", "at least 1 character"]),
    (
        "empty-tool",
        {"v": 1, "kind": "tool_end", "session_id": SID, "call_id": CALL, "tool": ""},
        ["tool", "at least 1 character"],
    ),
    ("overlong-session-id", llm_end(session_id="s" * 257), ["session_id", "at most 256"]),
    (
        "inf-duration-json",
        '{"v":1,"kind":"session_end","session_id":"s","duration_s":Infinity}',
        ["duration_s", "finite"],
    ),
    (
        "neg-inf-duration-json",
        '{"v":1,"kind":"llm_end","session_id":"s","call_id":"c","duration_s":-Infinity}',
        ["duration_s"],
    ),
    (
        "nan-duration-json",
        '{"v":1,"kind":"llm_first_token","session_id":"s","call_id":"c","ttft_s":NaN}',
        ["ttft_s", "finite"],
    ),
    ("inf-duration-mapping", llm_end(duration_s=math.inf), ["duration_s", "finite"]),
    ("nan-duration-mapping", llm_end(duration_s=math.nan), ["duration_s", "finite"]),
    (
        "nan-tool-ema",
        {"v": 1, "kind": "tool_stats", "active": 1, "exec_ema_s": {"terminal": math.nan}},
        ["exec_ema_s.terminal", "finite"],
    ),
    (
        "huge-integer-literal",
        '{"v": 1, "kind": "llm_end", "turn": ' + "9" * 5000 + "}",
        ["not valid JSON"],
    ),
    ("deep-nesting", "[" * 100_000 + "]" * 100_000, ["not valid JSON"]),
    # Past a double's exact integers /metrics could not render the value (issue 10).
    (
        "window-past-a-double",
        '{"v":1,"kind":"window_update","window":1' + "0" * 400 + ',"previous":0}',
        ["window", "less than or equal to 9007199254740992"],
    ),
    ("count-past-2-53", llm_end(prompt_tokens=2**53 + 1), ["prompt_tokens", "less than"]),
    ("priority-past-2-53", tool_event("tool_enqueue", priority=-(2**53) - 1), ["priority"]),
    ("exit-status-past-2-53", tool_event("tool_end", exit_status=10**30), ["exit_status"]),
    ("stamp-past-int64", llm_end(mono_ns=2**63), ["mono_ns", "less than"]),
    ("duration-past-max", llm_end(duration_s=1e300), ["duration_s", "less than"]),
    (
        "float-overflow-literal",
        '{"v":1,"kind":"llm_end","session_id":"s","call_id":"c","duration_s":1e400}',
        ["duration_s", "finite"],
    ),
    (
        "too-many-release-reasons",
        {
            "v": 1,
            "kind": "kv_stats",
            "total_blocks": 1,
            "free_blocks": 1,
            "used_blocks": 0,
            "released": {f"reason-{i}": 1 for i in range(33)},
        },
        ["released", "at most 32"],
    ),
]


def test_counts_up_to_a_doubles_exact_integers_are_kept() -> None:
    event = decode_event({**llm_end(), "prompt_tokens": 2**53, "mono_ns": 2**63 - 1})
    assert isinstance(event, LLMEnd)
    assert (event.prompt_tokens, event.mono_ns) == (2**53, 2**63 - 1)


@pytest.mark.parametrize(
    ("data", "expected"), [(d, e) for _, d, e in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
def test_malformed_input_is_rejected_with_a_clear_message(data: Any, expected: list[str]) -> None:
    with pytest.raises(MalformedEvent) as caught:
        decode_event(data)
    assert isinstance(caught.value, EventError)
    assert isinstance(caught.value, ValueError)
    assert not isinstance(caught.value, UnknownEventVersion)
    message = str(caught.value)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_field_errors_name_the_kind_and_every_bad_field() -> None:
    with pytest.raises(MalformedEvent) as caught:
        decode_event(llm_end(prompt_tokens=-1, output_tokens="x", bogus=True))
    message = str(caught.value)
    assert message.startswith("invalid llm_end event: ")
    for name in ("prompt_tokens", "output_tokens", "bogus"):
        assert name in message


def test_ints_are_accepted_where_seconds_are_expected() -> None:
    # Another writer may well print 2.0 as 2.
    decoded = decode_event(llm_end(duration_s=2))
    assert isinstance(decoded, LLMEnd)
    assert decoded.duration_s == 2.0 and isinstance(decoded.duration_s, float)


@pytest.mark.parametrize("version", [2, 0, -1, 99, "1", 1.0, True, [1]], ids=repr)
def test_unknown_version_is_reported_as_such(version: Any) -> None:
    data = {**llm_end(), "v": version}
    for form in (data, json.dumps(data)):
        with pytest.raises(UnknownEventVersion) as caught:
            decode_event(form)
        error = caught.value
        assert isinstance(error, EventError)
        assert not isinstance(error, MalformedEvent)
        assert error.version == version and type(error.version) is type(version)
        assert f"unknown event schema version {version!r}" in str(error)
        assert "1..1" in str(error)


def test_a_newer_version_is_not_judged_by_this_schema() -> None:
    # A v2 event may carry fields and kinds v1 does not know: it is an unknown
    # version, not a malformed event.
    with pytest.raises(UnknownEventVersion, match="version 2"):
        decode_event({"v": 2, "kind": "gpu_preempt", "blocks": 12})


def test_decode_jsonl_reports_bad_lines_without_raising() -> None:
    good_first = SessionStart(session_id=SID, agent="coder")
    good_second = LLMSubmit(session_id=SID, call_id=CALL, turn=0, model="m")
    good_last = SessionEnd(session_id=SID, turns=1)
    lines = [
        good_first.to_json(),  # 1
        "",  # 2: blank, skipped
        '{"v": 1, "kind": "llm_submit", "session_id": ',  # 3: truncated
        json.dumps({**json.loads(good_second.to_json()), "v": 99}),  # 4: newer writer
        good_second.to_json(),  # 5
        "   ",  # 6: whitespace only, skipped
        json.dumps(without(json.loads(good_last.to_json()), "session_id")),  # 7
        json.dumps({**json.loads(good_last.to_json()), "v": "1"}),  # 8: version as a string
        good_last.to_json(),  # 9
    ]
    text = "\n".join(lines) + "\n"

    for form in (text, text.encode(), lines):
        stream = decode_jsonl(form)
        assert stream.events == [good_first, good_second, good_last]
        assert [e.line for e in stream.errors] == [3, 4, 7, 8]
        assert [type(e.error) for e in stream.errors] == [
            MalformedEvent,
            UnknownEventVersion,
            MalformedEvent,
            UnknownEventVersion,
        ]
        assert [e.line for e in stream.unknown_versions] == [4, 8]
        assert [e.error.version for e in stream.unknown_versions] == [99, "1"]  # type: ignore[attr-defined]
        assert str(stream.errors[0]).startswith("line 3: not valid JSON")
        assert str(stream.errors[1]).startswith("line 4: unknown event schema version 99")
        assert "session_id" in str(stream.errors[2]) and "Field required" in str(stream.errors[2])


def test_decode_jsonl_of_an_empty_stream() -> None:
    for form in ("", b"", "\n\n", []):
        stream = decode_jsonl(form)
        assert stream.events == [] and stream.errors == []


# --- property tests -------------------------------------------------------------------

counts = st.integers(min_value=0, max_value=MAX_COUNT)
maybe_counts = st.none() | counts
stamps = st.integers(min_value=0, max_value=MAX_NS)
seconds = st.floats(min_value=0.0, max_value=MAX_SECONDS, allow_nan=False, allow_infinity=False)
# Any character, with those that trip up JSON escaping and line splitting made common.
chars = st.characters(codec="utf-8") | st.sampled_from('\n\r\t\x00\x0b\x0c\x1c\x85\u2028\u2029"\\')
ids = st.text(chars, min_size=1, max_size=256)
texts = st.none() | st.text(chars, max_size=300)
sources = st.sampled_from(["sdk", "sandbox", "gateway", "engine", "sim"])
common = {"event_id": ids, "mono_ns": stamps, "wall_ns": stamps, "source": sources}


@st.composite
def llm_ends(draw: st.DrawFn) -> LLMEnd:
    prompt = draw(maybe_counts)
    cached = draw(st.none() | st.integers(min_value=0, max_value=prompt or 0))
    return LLMEnd(
        **{k: draw(v) for k, v in common.items()},
        session_id=draw(ids),
        call_id=draw(ids),
        turn=draw(maybe_counts),
        status=draw(st.sampled_from(["ok", "error", "cancelled"])),
        error=draw(texts),
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=draw(maybe_counts),
        freed_blocks=draw(maybe_counts),
        finish_reason=draw(texts),
        ended_in_tool_call=draw(st.booleans()),
        duration_s=draw(seconds),
    )


@st.composite
def tool_ends(draw: st.DrawFn) -> ToolEnd:
    return ToolEnd(
        **{k: draw(v) for k, v in common.items()},
        session_id=draw(ids),
        call_id=draw(ids),
        turn=draw(maybe_counts),
        tool=draw(ids),
        status=draw(st.sampled_from(["ok", "error", "timeout", "killed", "cancelled"])),
        exit_status=draw(st.none() | st.integers(min_value=-(2**31), max_value=2**31)),
        error=draw(texts),
        duration_s=draw(seconds),
        cpu_time_s=draw(st.none() | seconds),
    )


@st.composite
def kv_stats(draw: st.DrawFn) -> KVStats:
    total = draw(counts)
    used = draw(st.integers(min_value=0, max_value=total))
    return KVStats(
        **{k: draw(v) for k, v in common.items()},
        total_blocks=total,
        used_blocks=used,
        free_blocks=draw(st.integers(min_value=0, max_value=total - used)),
        pinned_blocks=draw(st.integers(min_value=0, max_value=used)),
    )


@given(st.one_of(llm_ends(), tool_ends(), kv_stats()))
def test_random_valid_events_round_trip_unchanged(event: Event) -> None:
    text = event.to_json()
    decoded = decode_event(text)
    assert type(decoded) is type(event)
    assert decoded == event
    assert decoded.to_json() == text
    # ... and through a JSONL stream, whatever characters the strings hold.
    stream = decode_jsonl(encode_jsonl([event, event]))
    assert stream.errors == []
    assert stream.events == [event, event]


@given(
    field=st.sampled_from(["prompt_tokens", "output_tokens", "freed_blocks", "turn", "wall_ns"]),
    value=st.integers(max_value=-1),
)
def test_any_negative_count_is_rejected_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(MalformedEvent, match=field):
        decode_event(llm_end(**{field: value}))


def test_kv_stats_of_a_pool_derives_used_and_caps_pinned_at_it() -> None:
    stats = KVStats.of_pool(total=64, free=10, pinned=4, pins=2, source="engine")
    assert (stats.used_blocks, stats.pinned_blocks, stats.pins) == (54, 4, 2)
    # Pins that share a prefix count its blocks once each: 70 > 54 held at most.
    assert KVStats.of_pool(total=64, free=10, pinned=70).pinned_blocks == 54


# --- text an event cannot hold (issue 38) -------------------------------------------------

LONE = "a\ud800"
"""A lone surrogate: JSON's "\\ud800" escape reads as one, no UTF-8 text can hold it."""


def _with(event: Event, name: str, value: object) -> dict[str, Any]:
    data = event.model_dump(mode="json")
    data[name] = value
    return data


def _texts_of(event: Event) -> list[tuple[str, object]]:
    """Each field of the event that takes free text, with a lone surrogate in it: a
    string field (not a literal), a mapping's key, a mapping of strings' value."""
    cases: list[tuple[str, object]] = []
    for name, value in event.model_dump(mode="json").items():
        if isinstance(value, dict) and value:
            key, item = next(iter(value.items()))
            cases.append((name, {LONE: item}))
            if isinstance(item, str):
                cases.append((name, {key: LONE}))
        elif name != "v":
            try:
                decode_event(json.dumps(_with(event, name, "plain text")))
            except MalformedEvent:
                continue  # not a text field (a count, a literal...)
            cases.append((name, LONE))
    return cases


@pytest.mark.parametrize("event", realistic_events(), ids=lambda event: event.kind)
def test_a_lone_surrogate_in_any_text_of_any_event_is_refused_naming_the_field(
    event: Event,
) -> None:
    cases = _texts_of(event)
    assert cases  # every kind has some text: its event_id at least
    for name, value in cases:
        data = _with(event, name, value)
        for wire in (json.dumps(data), json.dumps(data).encode(), data):
            with pytest.raises(MalformedEvent, match=name) as refused:
                decode_event(wire)
            assert "surrogate" in str(refused.value) or "unicode" in str(refused.value)
        with pytest.raises(ValidationError, match=name):
            type(event)(**{k: v for k, v in data.items() if k != "v"})


def test_text_beyond_ascii_is_kept() -> None:
    start = SessionStart(session_id="s", agent="编码者 🤖", metadata={"clé": "välue"})
    assert decode_event(start.to_json()) == start
