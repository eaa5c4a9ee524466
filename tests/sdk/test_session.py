"""Sessions, LLM calls and tool calls: the events they emit and the context they keep."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from agentmars import sdk
from agentmars.sdk import (
    Emitter,
    JsonlSink,
    MemorySink,
    NoActiveSession,
    current_session,
    decode_jsonl,
    llm_call,
    session,
    tool,
)
from agentmars.sdk.calls import current_hints
from agentmars.sdk.events import (
    Event,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
)


def of_kind(events: list[Event], kind: str) -> list[Any]:
    return [e for e in events if e.kind == kind]


def one(events: list[Event], kind: str) -> Any:
    found = of_kind(events, kind)
    assert len(found) == 1, f"expected one {kind}, got {[e.kind for e in events]}"
    return found[0]


# --- session lifecycle ------------------------------------------------------------


def test_session_emits_start_and_end(memory_sink: MemorySink, emitter: Emitter) -> None:
    assert current_session() is None
    with session(agent="coder", metadata={"task": "t-17"}, emitter=emitter) as s:
        assert current_session() is s
        assert not s.ended
        assert memory_sink.kinds() == ["session_start"]
    assert current_session() is None
    assert s.ended

    start, end = memory_sink.events
    assert isinstance(start, SessionStart) and isinstance(end, SessionEnd)
    assert start.session_id == end.session_id == s.session_id
    assert len(s.session_id) == 32
    assert start.agent == "coder"
    assert start.metadata == {"task": "t-17"}
    assert start.source == "sdk"
    assert end.status == "ok" and end.error is None
    assert end.turns == 0
    assert end.mono_ns >= start.mono_ns
    assert 0 <= end.duration_s <= (end.mono_ns - start.mono_ns) / 1e9 + 1e-3


def test_session_with_a_given_id(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session("my-session-1", emitter=emitter) as s:
        pass
    assert s.session_id == "my-session-1"
    assert {e.session_id for e in memory_sink.events} == {"my-session-1"}  # type: ignore[attr-defined]


def test_session_error_status(memory_sink: MemorySink, emitter: Emitter) -> None:
    boom = RuntimeError("disk full")
    with pytest.raises(RuntimeError) as caught, session(emitter=emitter):
        raise boom
    assert caught.value is boom  # the agent's exception passes through untouched
    end = one(memory_sink.events, "session_end")
    assert end.status == "error"
    assert end.error == "RuntimeError: disk full"
    assert current_session() is None


def test_session_error_message_is_bounded(memory_sink: MemorySink, emitter: Emitter) -> None:
    with pytest.raises(ValueError), session(emitter=emitter):
        raise ValueError("x" * 5000)
    end = one(memory_sink.events, "session_end")
    assert end.error.startswith("ValueError: xxx")
    assert len(end.error) == 1000


async def test_cancelled_session(memory_sink: MemorySink, emitter: Emitter) -> None:
    inside = asyncio.Event()
    never = asyncio.Event()

    async def agent() -> None:
        async with session(emitter=emitter):
            inside.set()
            await never.wait()

    task = asyncio.create_task(agent())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    end = one(memory_sink.events, "session_end")
    assert end.status == "cancelled"
    assert end.error == "CancelledError"
    assert current_session() is None


async def test_async_context_manager(memory_sink: MemorySink, emitter: Emitter) -> None:
    async with session(agent="async-agent", emitter=emitter) as s:
        await asyncio.sleep(0)
        assert current_session() is s
        async with llm_call("m") as call:
            await asyncio.sleep(0)
        assert call.session is s
    assert current_session() is None
    assert memory_sink.kinds(s.session_id) == [
        "session_start",
        "llm_submit",
        "llm_end",
        "session_end",
    ]
    assert one(memory_sink.events, "session_end").turns == 1


def test_session_decorator_on_a_sync_function(memory_sink: MemorySink, emitter: Emitter) -> None:
    @session(agent="coder", metadata={"k": "v"}, emitter=emitter)
    def work(x: int) -> tuple[str, int]:
        """Doc of work."""
        s = current_session()
        assert s is not None
        with llm_call("m"):
            pass
        return s.session_id, x * 2

    assert work.__name__ == "work" and work.__doc__ == "Doc of work."
    assert memory_sink.events == []  # decorating opens nothing

    first_id, first = work(3)
    second_id, second = work(4)
    assert (first, second) == (6, 8)
    assert first_id != second_id
    assert current_session() is None

    for sid in (first_id, second_id):
        assert memory_sink.kinds(sid) == ["session_start", "llm_submit", "llm_end", "session_end"]
        events = memory_sink.of_session(sid)
        assert events[0].agent == "coder" and events[0].metadata == {"k": "v"}  # type: ignore[attr-defined]
        # Turn numbering starts afresh in every invocation's session.
        assert events[1].turn == 0  # type: ignore[attr-defined]
        assert events[-1].turns == 1  # type: ignore[attr-defined]


def test_session_decorator_records_errors(memory_sink: MemorySink, emitter: Emitter) -> None:
    @session(emitter=emitter)
    def failing() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        failing()
    end = one(memory_sink.events, "session_end")
    assert end.status == "error" and end.error == "KeyError: 'missing'"


async def test_session_decorator_on_an_async_function(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    both_inside = asyncio.Barrier(2)

    @session(agent="async", emitter=emitter)
    async def work(x: int) -> tuple[str, int]:
        s = current_session()
        assert s is not None
        await both_inside.wait()  # the two invocations really overlap
        async with llm_call(f"m{x}"):
            await asyncio.sleep(0)
        assert current_session() is s
        return s.session_id, x

    assert asyncio.iscoroutinefunction(work)
    (id_a, a), (id_b, b) = await asyncio.gather(work(1), work(2))
    assert (a, b) == (1, 2)
    assert id_a != id_b
    assert current_session() is None
    for sid, model in ((id_a, "m1"), (id_b, "m2")):
        events = memory_sink.of_session(sid)
        assert [e.kind for e in events] == ["session_start", "llm_submit", "llm_end", "session_end"]
        assert events[1].model == model  # type: ignore[attr-defined]
        assert events[1].turn == 0  # type: ignore[attr-defined]


async def test_session_decorator_with_a_given_id(memory_sink: MemorySink, emitter: Emitter) -> None:
    @session("fixed-id", emitter=emitter)
    def sync_work() -> str:
        s = current_session()
        assert s is not None
        return s.session_id

    @session("fixed-async-id", emitter=emitter)
    async def async_work() -> str:
        s = current_session()
        assert s is not None
        return s.session_id

    assert [sync_work(), sync_work()] == ["fixed-id", "fixed-id"]
    assert [await async_work(), await async_work()] == ["fixed-async-id", "fixed-async-id"]
    assert memory_sink.kinds("fixed-id") == ["session_start", "session_end"] * 2
    assert memory_sink.kinds("fixed-async-id") == ["session_start", "session_end"] * 2


def test_default_emitter_is_used_when_none_is_given(default_sink: MemorySink) -> None:
    with session() as s:
        assert s.emitter is sdk.default_emitter()
        with llm_call("m"):
            pass
    assert default_sink.kinds(s.session_id) == [
        "session_start",
        "llm_submit",
        "llm_end",
        "session_end",
    ]


# --- turns and tool transitions -------------------------------------------------------


def test_turns_number_the_llm_calls(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter) as s:
        calls = []
        for _ in range(4):
            with llm_call("m") as call:
                calls.append(call)
    assert [c.turn for c in calls] == [0, 1, 2, 3]
    for kind in ("llm_submit", "llm_end"):
        assert [e.turn for e in of_kind(memory_sink.events, kind)] == [0, 1, 2, 3]
    submits = of_kind(memory_sink.events, "llm_submit")
    ends = of_kind(memory_sink.events, "llm_end")
    assert [e.call_id for e in submits] == [e.call_id for e in ends] == [c.call_id for c in calls]
    assert len({c.call_id for c in calls}) == 4
    assert s.turns == 4
    assert one(memory_sink.events, "session_end").turns == 4


def test_tool_calls_carry_the_turn_of_the_latest_llm_call(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    with session(emitter=emitter) as s:
        with tool("setup") as setup:
            pass
        with llm_call("m"):
            pass
        with tool("read_file") as first:
            pass
        with llm_call("m"), llm_call("m"):
            pass
        with tool("terminal") as second, tool("editor") as third:
            pass
    assert (setup.turn, first.turn, second.turn, third.turn) == (None, 0, 2, 2)
    by_tool: dict[str, set[int | None]] = {}
    for e in memory_sink.of_session(s.session_id):
        if isinstance(e, ToolEnqueue | ToolStart | ToolEnd):
            by_tool.setdefault(e.tool, set()).add(e.turn)
    assert by_tool == {"setup": {None}, "read_file": {0}, "terminal": {2}, "editor": {2}}


def test_follows_tool_is_set_exactly_after_a_tool(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    with session(emitter=emitter):
        with llm_call("m"):  # 0: first call
            pass
        with tool("terminal"):
            pass
        with llm_call("m"):  # 1: after a tool
            pass
        with llm_call("m"):  # 2: after an LLM call
            pass
        with tool("a"), tool("b"):
            pass
        with llm_call("m"):  # 3: after two tools
            pass
        with pytest.raises(OSError), tool("failing"):
            raise OSError("no such file")
        with llm_call("m"):  # 4: after a failed tool (its error is the tool result)
            pass
        with llm_call("m"):  # 5
            pass
    submits = of_kind(memory_sink.events, "llm_submit")
    assert [e.follows_tool for e in submits] == [False, True, False, True, True, False]


def test_a_tool_still_running_at_submit_does_not_count(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    with session(emitter=emitter):
        background = tool("indexer").start()
        with llm_call("m") as during:
            pass
        background.end()
        with llm_call("m") as after:
            pass
    assert (during.follows_tool, after.follows_tool) == (False, True)


def test_expects_tool_passes_through(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter):
        with llm_call("m", expects_tool=True) as offered:
            pass
        with llm_call("m") as plain:
            pass
    assert offered.expects_tool and not plain.expects_tool
    assert [e.expects_tool for e in of_kind(memory_sink.events, "llm_submit")] == [True, False]


def test_explicit_follows_tool_overrides_the_session(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    with session(emitter=emitter):
        with llm_call("m", follows_tool=True) as forced_on:  # no tool ran, caller knows better
            pass
        with tool("terminal"):
            pass
        with llm_call("m", follows_tool=False) as forced_off:
            pass
    assert forced_on.follows_tool is True and forced_off.follows_tool is False
    assert [e.follows_tool for e in of_kind(memory_sink.events, "llm_submit")] == [True, False]


def test_llm_submit_fields(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter):
        with llm_call(
            "Qwen/Qwen2.5-7B",
            operation="text_completion",
            stream=True,
            projected_prompt_tokens=33,
            max_tokens=256,
        ):
            pass
        with llm_call() as bare:
            pass
    projected, unknown = of_kind(memory_sink.events, "llm_submit")
    assert isinstance(projected, LLMSubmit)
    assert projected.model == "Qwen/Qwen2.5-7B"
    assert projected.operation == "text_completion"
    assert projected.stream is True
    assert projected.projected_prompt_tokens == 33
    assert projected.projected_kv_blocks == 3  # ceil(33 / 16)
    assert projected.max_tokens == 256
    assert unknown.model is None and unknown.projected_kv_blocks is None
    assert unknown.call_id == bare.call_id


# --- errors of use -------------------------------------------------------------------


def test_llm_call_outside_a_session(default_sink: MemorySink) -> None:
    assert current_session() is None
    with pytest.raises(NoActiveSession) as caught, llm_call("m"):
        pass
    message = str(caught.value)
    assert isinstance(caught.value, RuntimeError)
    assert message.startswith("an LLM call needs an active agentmars session")
    assert "with agentmars.sdk.session()" in message
    assert "@session()" in message and "attach()" in message

    with pytest.raises(NoActiveSession, match=r"^a tool call needs an active"):
        tool("terminal").start()
    with pytest.raises(NoActiveSession):
        llm_call("m").submit()
    assert default_sink.events == []


def test_calls_outside_a_session_via_decorators() -> None:
    @llm_call("m")
    def ask() -> None:
        pass

    @tool("terminal")
    async def run() -> None:
        pass

    with pytest.raises(NoActiveSession):
        ask()
    with pytest.raises(NoActiveSession):
        asyncio.run(run())


def test_a_session_cannot_be_entered_twice(memory_sink: MemorySink, emitter: Emitter) -> None:
    s = session(emitter=emitter)
    with s:
        with pytest.raises(RuntimeError, match="already started"), s:
            pass
        assert current_session() is s
    with pytest.raises(RuntimeError, match=f"session {s.session_id} was already started"), s:
        pass
    assert current_session() is None
    assert memory_sink.kinds() == ["session_start", "session_end"]


async def test_a_finished_session_cannot_be_reentered_async(emitter: Emitter) -> None:
    s = session(emitter=emitter)
    async with s:
        pass
    with pytest.raises(RuntimeError, match="already started"):
        async with s:
            pass


@pytest.mark.parametrize(
    "kwargs",
    [
        {"session_id": ""},
        {"session_id": "s" * 257},
        {"session_id": 42},
        {"metadata": {"attempt": 1}},
        {"metadata": {1: "one"}},
        {"metadata": {"k": None}},
        {"metadata": ["ab"]},
        {"metadata": "ab"},
    ],
    ids=repr,
)
def test_invalid_session_arguments(kwargs: dict[str, Any], emitter: Emitter) -> None:
    with pytest.raises(ValueError, match=r"session_id|metadata"):
        session(emitter=emitter, **kwargs)


def test_session_id_limits(emitter: Emitter) -> None:
    assert session("s" * 256, emitter=emitter).session_id == "s" * 256
    assert session("x", emitter=emitter).session_id == "x"


@pytest.mark.parametrize("name", ["", "t" * 257, 7, None], ids=repr)
def test_invalid_tool_name(name: Any) -> None:
    with pytest.raises(ValueError, match="tool must be a non-empty name"):
        tool(name)


def test_invalid_call_arguments() -> None:
    with pytest.raises(ValueError, match="call_id"):
        tool("terminal", call_id="")
    with pytest.raises(ValueError, match="projected_prompt_tokens"):
        llm_call("m", projected_prompt_tokens=-1)
    with pytest.raises(ValueError, match="max_tokens"):
        llm_call("m", max_tokens=-1)
    # past what an event (a JSON double) carries: refused here, not when the event builds
    with pytest.raises(ValueError, match="max_tokens must be an integer from 0 to"):
        llm_call("m", max_tokens=2**60)


# --- context across threads and nesting ------------------------------------------------


def test_attach_in_another_thread(memory_sink: MemorySink, emitter: Emitter) -> None:
    seen: dict[str, Any] = {}

    def worker(s: sdk.Session) -> None:
        seen["before"] = current_session()  # a new thread starts without a session
        try:
            llm_call("m").submit()
        except NoActiveSession as exc:
            seen["unattached_error"] = exc
        with s.attach() as attached:
            seen["attached"] = attached
            seen["during"] = current_session()
            with llm_call("thread-model"), tool("thread-tool"):
                pass
        seen["after"] = current_session()

    with session(emitter=emitter) as s:
        with llm_call("main-model"):
            pass
        thread = threading.Thread(target=worker, args=(s,))
        thread.start()
        thread.join()
        assert current_session() is s
        with llm_call("main-model"):
            pass

    assert seen["before"] is None and seen["after"] is None
    assert isinstance(seen["unattached_error"], NoActiveSession)
    assert seen["attached"] is s and seen["during"] is s
    events = memory_sink.events
    assert all(e.session_id == s.session_id for e in events)  # type: ignore[attr-defined]
    submits = of_kind(events, "llm_submit")
    assert [(e.model, e.turn) for e in submits] == [
        ("main-model", 0),
        ("thread-model", 1),
        ("main-model", 2),
    ]
    tool_end = one(events, "tool_end")
    assert tool_end.tool == "thread-tool" and tool_end.turn == 1
    assert one(events, "session_end").turns == 3
    assert submits[2].follows_tool is True  # the thread's tool counts for the session


def test_pool_threads_do_not_keep_a_session(memory_sink: MemorySink, emitter: Emitter) -> None:
    def in_session() -> str:
        with session(emitter=emitter) as s:
            return s.session_id

    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(current_session).result() is None
        sid = pool.submit(in_session).result()
        assert pool.submit(current_session).result() is None  # same worker thread
        with session(emitter=emitter):
            # A thread started inside a session does not inherit it.
            assert pool.submit(current_session).result() is None
    assert memory_sink.kinds(sid) == ["session_start", "session_end"]


def test_nested_sessions_restore_the_outer_one(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session("outer", emitter=emitter) as outer:
        with llm_call("m"):
            pass
        with session("inner", emitter=emitter) as inner:
            assert current_session() is inner
            with llm_call("m") as inner_call:
                pass
            with session("innermost", emitter=emitter):
                pass
            assert current_session() is inner
        assert current_session() is outer
        with llm_call("m") as outer_call:
            pass
    assert current_session() is None
    assert inner_call.session is inner and inner_call.turn == 0
    assert outer_call.session is outer and outer_call.turn == 1
    assert memory_sink.kinds("inner") == ["session_start", "llm_submit", "llm_end", "session_end"]
    assert memory_sink.kinds("outer") == ["session_start"] + ["llm_submit", "llm_end"] * 2 + [
        "session_end"
    ]
    assert memory_sink.kinds("innermost") == ["session_start", "session_end"]


def test_nested_session_restores_after_an_error(emitter: Emitter) -> None:
    with session(emitter=emitter) as outer:
        with pytest.raises(ZeroDivisionError), session(emitter=emitter):
            _ = 1 / 0
        assert current_session() is outer


def test_calls_bound_to_an_explicit_session(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session("other", emitter=emitter) as other, session("current", emitter=emitter):
        with llm_call("m", session=other) as bound_llm:
            pass
        with tool("t", session=other) as bound_tool:
            pass
        with llm_call("m") as unbound:
            pass
    assert bound_llm.session is other and bound_llm.turn == 0
    assert bound_tool.session is other and bound_tool.turn == 0
    assert unbound.session is not other and unbound.turn == 0
    assert memory_sink.kinds("other") == [
        "session_start",
        "llm_submit",
        "llm_end",
        "tool_enqueue",
        "tool_start",
        "tool_end",
        "session_end",
    ]
    assert memory_sink.kinds("current") == ["session_start", "llm_submit", "llm_end", "session_end"]


# --- LLM call details -----------------------------------------------------------------


def test_first_token_is_recorded_once(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter):
        early = llm_call("m")
        early.first_token()  # before submit: nothing to measure against
        with llm_call("m", stream=True) as call:
            call.first_token()
            call.first_token()
        call.first_token()  # after the end: ignored
    assert memory_sink.kinds().count("llm_first_token") == 1
    submit = one(memory_sink.events, "llm_submit")
    first = one(memory_sink.events, "llm_first_token")
    end = one(memory_sink.events, "llm_end")
    assert isinstance(first, LLMFirstToken)
    assert first.call_id == submit.call_id == end.call_id == call.call_id
    assert first.turn == 0
    assert submit.mono_ns <= first.mono_ns <= end.mono_ns
    assert first.ttft_s == (first.mono_ns - submit.mono_ns) / 1e9
    assert end.duration_s == (end.mono_ns - submit.mono_ns) / 1e9
    assert memory_sink.kinds() == [
        "session_start",
        "llm_submit",
        "llm_first_token",
        "llm_end",
        "session_end",
    ]


def test_ttft_measures_the_time_to_first_token(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter), llm_call("m", stream=True) as call:
        # Real work between submit and first token: spawn and reap a process.
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        call.first_token()
    submit = one(memory_sink.events, "llm_submit")
    first = one(memory_sink.events, "llm_first_token")
    assert first.ttft_s > 0
    assert first.ttft_s == (first.mono_ns - submit.mono_ns) / 1e9


def test_explicit_boundaries_are_idempotent(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter):
        call = llm_call("m").submit()
        assert call.submit() is call
        call.end()
        call.end("error", "late")
        assert call.ended
        queued = tool("terminal").enqueue()
        queued.enqueue()
        queued.start()
        queued.start()
        queued.end()
        queued.end("error")
        never_started = tool("unused")
        never_started.end()  # no session bound: nothing to end
    assert memory_sink.kinds() == [
        "session_start",
        "llm_submit",
        "llm_end",
        "tool_enqueue",
        "tool_start",
        "tool_end",
        "session_end",
    ]
    assert one(memory_sink.events, "llm_end").status == "ok"
    assert one(memory_sink.events, "tool_end").status == "ok"


def test_queued_tool_records_its_queue_wait(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter):
        call = tool("terminal", call_id="call_abc", priority=3).enqueue()
        subprocess.run([sys.executable, "-c", "pass"], check=True)  # the queue
        call.start()
        call.end(cpu_time_s=0.25)
    enqueue = one(memory_sink.events, "tool_enqueue")
    start = one(memory_sink.events, "tool_start")
    end = one(memory_sink.events, "tool_end")
    assert enqueue.priority == 3
    assert enqueue.call_id == start.call_id == end.call_id == "call_abc"
    assert start.queue_wait_s == (start.mono_ns - enqueue.mono_ns) / 1e9 > 0
    assert end.duration_s == (end.mono_ns - start.mono_ns) / 1e9
    assert end.cpu_time_s == 0.25


def test_a_tool_call_without_priority_takes_the_sessions_newest(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    with session(emitter=emitter) as s:
        before = tool("terminal").enqueue()
        s.tool_priority = 4
        decorated = tool("terminal")(lambda: None)
        decorated()
        s.tool_priority = 9
        taken = tool("terminal").enqueue()
        given = tool("terminal", priority=-1).enqueue()
    assert (before.priority, taken.priority, given.priority) == (None, 9, -1)
    enqueued = [e.priority for e in of_kind(memory_sink.events, "tool_enqueue")]
    assert enqueued == [None, 4, 9, -1]


TOOL_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
}


def tool_call_response() -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1718000000,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                "finish_reason": "tool_calls",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": 1200,
            "completion_tokens": 35,
            "total_tokens": 1235,
            "prompt_tokens_details": {"cached_tokens": 1024},
        },
    }


def stop_response() -> dict[str, Any]:
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 1718000001,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "All tests pass."},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 1300, "completion_tokens": 6, "total_tokens": 1306},
    }


def stream_chunks(*, tool_calls: bool) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-3",
            "object": "chat.completion.chunk",
            "created": 1718000002,
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    if tool_calls:
        chunks += [
            chunk({"tool_calls": [{"index": 0, **TOOL_CALL, "function": {"name": "terminal"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command"'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "ls"}'}}]}),
            chunk({}, "tool_calls"),
        ]
    else:
        chunks += [chunk({"content": "Hello"}), chunk({"content": " world"}), chunk({}, "stop")]
    usage = {
        "prompt_tokens": 900,
        "completion_tokens": 12,
        "total_tokens": 912,
        "prompt_tokens_details": {"cached_tokens": 512},
    }
    chunks.append({**chunk({}), "choices": [], "usage": usage})  # stream_options.include_usage
    return chunks


def recorded_end(emitter: Emitter, sink: MemorySink, *responses: Any) -> LLMEnd:
    with session(emitter=emitter), llm_call("gpt-4o-mini") as call:
        for response in responses:
            call.record_response(response)
    return one(sink.events, "llm_end")  # type: ignore[no-any-return]


@pytest.mark.parametrize("as_object", [False, True], ids=["dict", "openai-object"])
def test_record_response_with_tool_calls(
    as_object: bool, memory_sink: MemorySink, emitter: Emitter
) -> None:
    response: Any = tool_call_response()
    if as_object:
        response = ChatCompletion.model_validate(response)
    end = recorded_end(emitter, memory_sink, response)
    assert end.prompt_tokens == 1200
    assert end.cached_tokens == 1024
    assert end.output_tokens == 35
    assert end.finish_reason == "tool_calls"
    assert end.ended_in_tool_call is True
    assert end.status == "ok"


@pytest.mark.parametrize("as_object", [False, True], ids=["dict", "openai-object"])
def test_record_response_plain_answer(
    as_object: bool, memory_sink: MemorySink, emitter: Emitter
) -> None:
    response: Any = stop_response()
    if as_object:
        response = ChatCompletion.model_validate(response)
    end = recorded_end(emitter, memory_sink, response)
    assert (end.prompt_tokens, end.cached_tokens, end.output_tokens) == (1300, None, 6)
    assert end.finish_reason == "stop"
    assert end.ended_in_tool_call is False


@pytest.mark.parametrize("as_object", [False, True], ids=["dict", "openai-object"])
@pytest.mark.parametrize("with_tools", [True, False], ids=["tool-calls", "text"])
def test_record_response_from_stream_chunks(
    as_object: bool, with_tools: bool, memory_sink: MemorySink, emitter: Emitter
) -> None:
    chunks: list[Any] = stream_chunks(tool_calls=with_tools)
    if as_object:
        chunks = [ChatCompletionChunk.model_validate(c) for c in chunks]
    with session(emitter=emitter), llm_call("gpt-4o-mini", stream=True) as call:
        for chunk in chunks:
            call.first_token()
            call.record_response(chunk)
    end = one(memory_sink.events, "llm_end")
    assert (end.prompt_tokens, end.cached_tokens, end.output_tokens) == (900, 512, 12)
    assert end.finish_reason == ("tool_calls" if with_tools else "stop")
    assert end.ended_in_tool_call is with_tools
    assert memory_sink.kinds().count("llm_first_token") == 1


def test_delta_tool_calls_alone_mark_the_call(memory_sink: MemorySink, emitter: Emitter) -> None:
    # Some servers end a tool-calling stream with finish_reason "stop".
    chunks = stream_chunks(tool_calls=True)
    chunks[-2]["choices"][0]["finish_reason"] = "stop"
    end = recorded_end(emitter, memory_sink, *chunks)
    assert end.finish_reason == "stop"
    assert end.ended_in_tool_call is True


def test_decorated_llm_call_records_its_return_value(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    @llm_call("gpt-4o-mini", expects_tool=True)
    def ask(prompt: str) -> dict[str, Any]:
        assert prompt == "fix the bug"
        return tool_call_response()

    @llm_call("gpt-4o-mini")
    async def ask_async() -> ChatCompletion:
        return ChatCompletion.model_validate(stop_response())

    with session(emitter=emitter):
        assert ask("fix the bug")["id"] == "chatcmpl-1"
        assert asyncio.run(ask_async()).id == "chatcmpl-2"
    first, second = of_kind(memory_sink.events, "llm_end")
    assert (first.prompt_tokens, first.ended_in_tool_call, first.turn) == (1200, True, 0)
    assert (second.prompt_tokens, second.finish_reason, second.turn) == (1300, "stop", 1)


def test_inconsistent_usage_never_breaks_the_call(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    # A provider reporting more cached than prompt tokens must not make the
    # agent's call fail, nor lose its llm_end.
    response = tool_call_response()
    response["usage"]["prompt_tokens_details"]["cached_tokens"] = 5000
    with session(emitter=emitter) as s, llm_call("m") as call:
        call.record_response(response)
    end = one(memory_sink.events, "llm_end")
    assert end.status == "ok"
    assert end.prompt_tokens == 1200 and end.cached_tokens is None
    assert end.output_tokens == 35
    assert one(memory_sink.events, "session_end").status == "ok"
    assert memory_sink.kinds(s.session_id)[-2:] == ["llm_end", "session_end"]


def test_unusable_usage_values_are_ignored(memory_sink: MemorySink, emitter: Emitter) -> None:
    garbage = {
        "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": 7}],
        "usage": {
            "prompt_tokens": "12",
            "completion_tokens": -3,
            "prompt_tokens_details": {"cached_tokens": True},
        },
    }
    end = recorded_end(emitter, memory_sink, stop_response(), garbage)
    # The earlier, valid report is kept.
    assert (end.prompt_tokens, end.output_tokens, end.cached_tokens) == (1300, 6, None)
    assert end.finish_reason == "stop"


def test_record_usage_rejects_values_llm_end_cannot_carry(emitter: Emitter) -> None:
    with session(emitter=emitter), llm_call("m") as call:
        with pytest.raises(ValueError, match="prompt_tokens must be an integer >= 0"):
            call.record_usage(prompt_tokens=-1)
        with pytest.raises(ValueError, match="output_tokens"):
            call.record_usage(output_tokens=1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="finish_reason"):
            call.record_usage(finish_reason=3)  # type: ignore[arg-type]
        call.record_usage(prompt_tokens=10, output_tokens=2)
        call.record_usage(cached_tokens=4, finish_reason="length")
        assert call.usage == {
            "prompt_tokens": 10,
            "output_tokens": 2,
            "cached_tokens": 4,
            "finish_reason": "length",
        }


def test_record_response_ignores_what_is_missing(memory_sink: MemorySink, emitter: Emitter) -> None:
    end = recorded_end(emitter, memory_sink, tool_call_response(), {"choices": []}, None, {})
    assert (end.prompt_tokens, end.cached_tokens, end.finish_reason) == (1200, 1024, "tool_calls")


def test_exception_inside_llm_call(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter):
        with pytest.raises(TimeoutError), llm_call("m") as failed:
            raise TimeoutError("upstream timed out")
        with llm_call("m"):
            pass
    failed_end, ok_end = of_kind(memory_sink.events, "llm_end")
    assert failed.ended
    assert failed_end.status == "error"
    assert failed_end.error == "TimeoutError: upstream timed out"
    assert ok_end.status == "ok" and ok_end.error is None and ok_end.turn == 1
    assert one(memory_sink.events, "session_end").status == "ok"


async def test_cancelled_llm_call(memory_sink: MemorySink, emitter: Emitter) -> None:
    started = asyncio.Event()

    async def agent() -> None:
        async with session(emitter=emitter), llm_call("m"):
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(agent())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert one(memory_sink.events, "llm_end").status == "cancelled"
    assert one(memory_sink.events, "session_end").status == "cancelled"


# --- tools ----------------------------------------------------------------------------


def test_tool_context_manager(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter) as s, tool("terminal") as call:
        assert memory_sink.kinds()[-2:] == ["tool_enqueue", "tool_start"]
    enqueue, start, end = (
        one(memory_sink.events, k) for k in ("tool_enqueue", "tool_start", "tool_end")
    )
    assert enqueue.call_id == start.call_id == end.call_id == call.call_id
    assert enqueue.session_id == s.session_id
    assert end.status == "ok" and end.exit_status is None and end.error is None
    assert enqueue.mono_ns <= start.mono_ns <= end.mono_ns


def test_tool_exception_is_recorded(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter), pytest.raises(FileNotFoundError), tool("editor"):
        raise FileNotFoundError("src/app.py")
    end = one(memory_sink.events, "tool_end")
    assert end.status == "error"
    assert end.error == "FileNotFoundError: src/app.py"


@pytest.mark.parametrize(
    ("argv", "code", "status"),
    [
        (["true"], 0, "ok"),
        (["false"], 1, "error"),
        (["sh", "-c", "exit 3"], 3, "error"),
    ],
    ids=["true", "false", "exit-3"],
)
def test_tool_decorator_records_a_process_exit_status(
    argv: list[str], code: int, status: str, memory_sink: MemorySink, emitter: Emitter
) -> None:
    assert shutil.which(argv[0]) is not None

    @tool("shell")
    def run(command: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(command, check=False)

    with session(emitter=emitter):
        result = run(argv)
    assert result.returncode == code
    end = one(memory_sink.events, "tool_end")
    assert isinstance(end, ToolEnd)
    assert end.tool == "shell"
    assert end.exit_status == code
    assert end.status == status


async def test_async_tool_decorator_records_a_process_exit_status(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    @tool("shell")
    async def run(*argv: str) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(*argv)
        await process.wait()
        return process

    async with session(emitter=emitter):
        await run("true")
        await run("false")
    ok, failed = of_kind(memory_sink.events, "tool_end")
    assert (ok.exit_status, ok.status) == (0, "ok")
    assert (failed.exit_status, failed.status) == (1, "error")


def test_tool_decorator_reads_an_exit_code_attribute(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    @dataclass
    class Observation:  # the shape of an OpenHands command observation
        content: str
        exit_code: int

    @tool("execute_bash")
    def bash() -> Observation:
        return Observation("command not found", 127)

    @tool("think")
    def think() -> str:
        return "plan"

    with session(emitter=emitter):
        bash()
        think()
    failed, ok = of_kind(memory_sink.events, "tool_end")
    assert (failed.tool, failed.exit_status, failed.status) == ("execute_bash", 127, "error")
    assert (ok.tool, ok.exit_status, ok.status) == ("think", None, "ok")


def test_explicit_exit_status_and_status(memory_sink: MemorySink, emitter: Emitter) -> None:
    with session(emitter=emitter):
        with tool("terminal") as killed:
            killed.set_exit_status(-9)
            killed.end("killed", "OOM")
        with tool("terminal") as ok:
            ok.set_exit_status(0)
    first, second = of_kind(memory_sink.events, "tool_end")
    assert (first.status, first.exit_status, first.error) == ("killed", -9, "OOM")
    assert (second.status, second.exit_status) == ("ok", 0)


# --- sinks ------------------------------------------------------------------------------


class ExplodingSink:
    def __init__(self) -> None:
        self.closed = False

    def emit(self, event: Event) -> None:
        raise RuntimeError(f"collector down ({event.kind})")

    def close(self) -> None:
        self.closed = True
        raise OSError("cannot flush")


def test_a_failing_sink_does_not_break_the_agent(
    memory_sink: MemorySink, caplog: pytest.LogCaptureFixture
) -> None:
    bad = ExplodingSink()
    emitter = Emitter([bad, memory_sink])
    with caplog.at_level(logging.WARNING, logger="agentmars.sdk"):
        with session(emitter=emitter):
            with llm_call("m", stream=True) as call:
                call.first_token()
            with tool("terminal"):
                pass
        emitter.close()
    # Every event still reached the healthy sink, in order.
    assert memory_sink.kinds() == [
        "session_start",
        "llm_submit",
        "llm_first_token",
        "llm_end",
        "tool_enqueue",
        "tool_start",
        "tool_end",
        "session_end",
    ]
    assert emitter.sink_errors == {"ExplodingSink": 9}  # 8 emits + 1 close
    assert bad.closed
    assert emitter.sinks == ()
    warnings = [r for r in caplog.records if r.name == "agentmars.sdk"]
    assert len(warnings) == 1  # logged once, counted after
    assert "ExplodingSink" in warnings[0].getMessage()
    assert "collector down (session_start)" in warnings[0].getMessage()


def test_sink_errors_are_counted_exactly_under_concurrency() -> None:
    emitter = Emitter([ExplodingSink()])
    event = SessionStart(session_id="s")
    threads, per_thread = 8, 4000
    barrier = threading.Barrier(threads)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible

    def hammer() -> None:
        barrier.wait(timeout=30)
        for _ in range(per_thread):
            emitter.emit(event)

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for future in [pool.submit(hammer) for _ in range(threads)]:
                future.result()
    finally:
        sys.setswitchinterval(old_interval)
    assert emitter.sink_errors["ExplodingSink"] == threads * per_thread


def test_add_and_remove_sinks(memory_sink: MemorySink) -> None:
    emitter = Emitter()
    with session(emitter=emitter):
        emitter.add(memory_sink)
    assert memory_sink.kinds() == ["session_end"]
    emitter.remove(memory_sink)
    with session(emitter=emitter):
        pass
    assert memory_sink.kinds() == ["session_end"]


def test_memory_sink_helpers(memory_sink: MemorySink, emitter: Emitter) -> None:
    from agentmars.sdk.events import KVStats

    with session("a", emitter=emitter):
        emitter.emit(KVStats(total_blocks=8, free_blocks=8, used_blocks=0))
        with session("b", emitter=emitter):
            pass
    assert memory_sink.kinds() == [
        "session_start",
        "kv_stats",
        "session_start",
        "session_end",
        "session_end",
    ]
    assert memory_sink.kinds("a") == ["session_start", "session_end"]
    assert [e.session_id for e in memory_sink.of_session("b")] == ["b", "b"]  # type: ignore[attr-defined]
    memory_sink.clear()
    assert memory_sink.events == []


def run_recorded_session(emitter: Emitter) -> None:
    with session(agent="coder", metadata={"task": "t"}, emitter=emitter):
        with llm_call("m", stream=True, projected_prompt_tokens=100) as call:
            call.first_token()
            call.record_response(tool_call_response())
        with tool("terminal") as t:
            t.set_exit_status(2)
        with pytest.raises(ValueError), tool("editor"):
            raise ValueError("bad patch\u2028second line")  # unescaped in JSON


def test_jsonl_sink_writes_decodable_lines(tmp_path: Path, memory_sink: MemorySink) -> None:
    path = tmp_path / "runs" / "nested" / "events.jsonl"  # parent directories are created
    jsonl = JsonlSink(path)
    emitter = Emitter([jsonl, memory_sink])
    run_recorded_session(emitter)
    run_recorded_session(emitter)
    emitter.close()
    assert jsonl.path == path

    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    assert raw.count(b"\n") == len(memory_sink.events) == 2 * 11
    for line in raw.splitlines():
        assert json.loads(line)["v"] == 1
    for data in (raw, path.read_text(encoding="utf-8")):
        stream = decode_jsonl(data)
        assert stream.errors == []
        assert stream.events == memory_sink.events  # every field survives the file
    with path.open(encoding="utf-8") as handle:
        assert decode_jsonl(handle).events == memory_sink.events


def test_jsonl_sink_appends_and_flushes(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = JsonlSink(path)
    first.emit(SessionStart(session_id="one"))
    # flush_every=1: the line is on disk before close.
    assert decode_jsonl(path.read_bytes()).events[0].session_id == "one"  # type: ignore[union-attr]
    first.close()
    first.close()  # closing twice is harmless

    second = JsonlSink(path, flush_every=100)
    second.emit(SessionStart(session_id="two"))
    second.close()  # close flushes what was buffered
    assert [e.session_id for e in decode_jsonl(path.read_bytes()).events] == ["one", "two"]  # type: ignore[union-attr]


def test_jsonl_sink_after_close(tmp_path: Path) -> None:
    jsonl = JsonlSink(tmp_path / "events.jsonl")
    jsonl.close()
    with pytest.raises(ValueError, match="is closed"):
        jsonl.emit(SessionStart(session_id="late"))
    emitter = Emitter([jsonl])
    with session(emitter=emitter):  # through an emitter it is only counted
        pass
    assert emitter.sink_errors == {"JsonlSink": 2}


def test_jsonl_sink_on_a_directory_path(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=f"JSONL sink path {tmp_path} is a directory"):
        JsonlSink(tmp_path)
    with pytest.raises(ValueError, match="flush_every must be >= 1"):
        JsonlSink(tmp_path / "x.jsonl", flush_every=0)


@pytest.mark.parametrize("shared", [True, False], ids=["one-sink", "sink-per-thread"])
def test_jsonl_sink_concurrent_writers_never_interleave(tmp_path: Path, shared: bool) -> None:
    path = tmp_path / "events.jsonl"
    threads, sessions_each, calls_each = 8, 5, 10
    common = JsonlSink(path) if shared else None
    sinks: list[JsonlSink] = []
    barrier = threading.Barrier(threads)

    def writer(index: int) -> None:
        sink = common or JsonlSink(path)
        sinks.append(sink)
        emitter = Emitter([sink])
        barrier.wait(timeout=30)
        for n in range(sessions_each):
            # Long lines (beyond the 8 KiB I/O buffer) are where partial writes would show.
            padding = f"w{index}-" * (1000 + 700 * index)
            with session(f"w{index}-s{n}", metadata={"pad": padding}, emitter=emitter):
                for _ in range(calls_each):
                    with tool(f"tool-w{index}"):
                        pass
        assert emitter.sink_errors == {}

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(writer, i) for i in range(threads)]:
            future.result()
    for sink in sinks:
        sink.close()

    stream = decode_jsonl(path.read_bytes())
    assert stream.errors == []
    per_session = 2 + 3 * calls_each
    assert len(stream.events) == threads * sessions_each * per_session
    for index in range(threads):
        for n in range(sessions_each):
            mine = [e for e in stream.events if getattr(e, "session_id", None) == f"w{index}-s{n}"]
            assert len(mine) == per_session
            assert mine[0].kind == "session_start" and mine[-1].kind == "session_end"
            assert mine[0].metadata["pad"].startswith(f"w{index}-")  # type: ignore[attr-defined]
            tools = {e.tool for e in mine if isinstance(e, ToolEnqueue | ToolStart | ToolEnd)}
            assert tools == {f"tool-w{index}"}


def test_attach_needs_a_running_session(emitter: sdk.Emitter) -> None:
    never_started = sdk.session(emitter=emitter)
    with pytest.raises(RuntimeError, match="has not started"):
        never_started.attach().__enter__()
    with sdk.session(emitter=emitter) as finished:
        pass
    with pytest.raises(RuntimeError, match="has ended"):
        finished.attach().__enter__()


# --- the agent instance and the hints -------------------------------------------------


def test_a_task_id_is_carried_in_session_starts_metadata(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    with session(agent="coder", task_id="issue-42", metadata={"k": "v"}, emitter=emitter) as s:
        assert s.task_id == "issue-42"
    start = one(memory_sink.events, "session_start")
    assert start.agent == "coder"
    assert start.metadata == {"k": "v", "task_id": "issue-42"}


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"task_id": ""}, "task_id"),
        ({"task_id": "x" * 257}, "task_id"),
        ({"task_id": 7}, "task_id"),
        ({"agent": ""}, "agent"),
        ({"agent": "x" * 257}, "agent"),
    ],
)
def test_a_bad_task_id_or_agent_is_refused_at_the_call_site(
    given: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        session(**given)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"next_tool": ""}, "next_tool"),
        ({"next_tool": "x" * 257}, "next_tool"),
        ({"expected_tool_s": -1}, "expected_tool_s"),
        ({"expected_tool_s": float("inf")}, "expected_tool_s"),
        ({"expected_tool_s": float("nan")}, "expected_tool_s"),
        ({"expected_tool_s": True}, "expected_tool_s"),
        ({"expected_tool_s": "3"}, "expected_tool_s"),
    ],
)
def test_bad_hints_are_refused_at_the_call_site(given: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        sdk.hints(**given)


def test_hints_in_use_cannot_be_opened_again() -> None:
    hints = sdk.hints(next_tool="pytest")
    with hints, pytest.raises(RuntimeError, match="in use"):
        hints.__enter__()
    with hints:  # closed again: it may be reused
        assert current_hints() is hints
    assert current_hints() is None
