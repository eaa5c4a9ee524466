"""Many sessions at once, in threads and asyncio tasks: every event lands in the right one."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from agentmars.sdk import Emitter, MemorySink, Session, current_session, llm_call, session, tool
from agentmars.sdk.events import (
    Event,
    LLMEnd,
    LLMFirstToken,
    LLMSubmit,
    SessionEnd,
    SessionEvent,
    SessionStart,
    ToolEnd,
    ToolEnqueue,
    ToolStart,
)

N_THREADS = 50
N_TASKS = 50
TURNS = 4  # LLM calls per session, each followed by TOOLS_PER_TURN tool calls
TOOLS_PER_TURN = 2
EVENTS_PER_SESSION = 2 + TURNS * 3 + TURNS * TOOLS_PER_TURN * 3
BARRIER_TIMEOUT_S = 60


def run_thread_session(
    index: int, emitter: Emitter, barrier: threading.Barrier, all_open: threading.Barrier
) -> str:
    tag = f"t{index}"
    assert current_session() is None
    with session(agent=f"agent-{tag}", metadata={"tag": tag}, emitter=emitter) as s:
        barrier.wait(BARRIER_TIMEOUT_S)
        all_open.wait(BARRIER_TIMEOUT_S)  # with the 50 asyncio sessions too
        for turn in range(TURNS):
            with llm_call(f"model-{tag}", stream=True, expects_tool=True) as call:
                barrier.wait(BARRIER_TIMEOUT_S)  # every thread is inside a call
                call.first_token()
                barrier.wait(BARRIER_TIMEOUT_S)
                call.record_usage(prompt_tokens=100 * (turn + 1), output_tokens=index)
            for n in range(TOOLS_PER_TURN):
                with tool(f"tool-{tag}-{turn}-{n}") as t:
                    barrier.wait(BARRIER_TIMEOUT_S)
                    t.set_exit_status(0)
            assert current_session() is s
        return s.session_id


async def run_task_session(
    index: int, emitter: Emitter, barrier: asyncio.Barrier, all_open: threading.Barrier
) -> str:
    tag = f"a{index}"
    assert current_session() is None
    async with session(agent=f"agent-{tag}", metadata={"tag": tag}, emitter=emitter) as s:
        await barrier.wait()
        if index == 0:
            # All 50 asyncio sessions are open; meet the 50 thread sessions.
            await asyncio.to_thread(all_open.wait, BARRIER_TIMEOUT_S)
        await barrier.wait()
        for turn in range(TURNS):
            async with llm_call(f"model-{tag}", stream=True, expects_tool=True) as call:
                await asyncio.sleep(0)
                await barrier.wait()  # every task is inside a call
                call.first_token()
                await asyncio.sleep(0)
                call.record_usage(prompt_tokens=100 * (turn + 1), output_tokens=index)
            for n in range(TOOLS_PER_TURN):
                async with tool(f"tool-{tag}-{turn}-{n}") as t:
                    await asyncio.sleep(0)
                    t.set_exit_status(0)
            assert current_session() is s
        return s.session_id


def check_session(events: list[Event], tag: str, index: int) -> None:
    """One session's events, in emission order: well-formed and all its own."""
    assert len(events) == EVENTS_PER_SESSION
    start, end = events[0], events[-1]
    assert isinstance(start, SessionStart) and isinstance(end, SessionEnd)
    assert start.agent == f"agent-{tag}" and start.metadata == {"tag": tag}
    assert end.status == "ok" and end.turns == TURNS
    mono = [e.mono_ns for e in events]
    assert mono == sorted(mono)

    by_call: dict[str, list[Event]] = defaultdict(list)
    for e in events[1:-1]:
        assert not isinstance(e, SessionStart | SessionEnd)
        by_call[e.call_id].append(e)  # type: ignore[attr-defined]
    assert len(by_call) == TURNS * (1 + TOOLS_PER_TURN)

    llm_calls = [c for c in by_call.values() if isinstance(c[0], LLMSubmit)]
    tool_calls = [c for c in by_call.values() if isinstance(c[0], ToolEnqueue)]
    assert len(llm_calls) == TURNS and len(tool_calls) == TURNS * TOOLS_PER_TURN

    for turn, (submit, first, llm_end) in enumerate(llm_calls):
        assert isinstance(submit, LLMSubmit)
        assert isinstance(first, LLMFirstToken)
        assert isinstance(llm_end, LLMEnd)
        assert submit.model == f"model-{tag}"
        assert submit.turn == first.turn == llm_end.turn == turn
        assert submit.mono_ns < first.mono_ns < llm_end.mono_ns
        assert first.ttft_s == (first.mono_ns - submit.mono_ns) / 1e9
        assert submit.follows_tool is (turn > 0)
        assert submit.expects_tool is True
        assert llm_end.status == "ok"
        assert (llm_end.prompt_tokens, llm_end.output_tokens) == (100 * (turn + 1), index)

    for calls_done, (enqueue, tool_start, tool_end) in enumerate(tool_calls):
        turn, n = divmod(calls_done, TOOLS_PER_TURN)
        assert isinstance(enqueue, ToolEnqueue)
        assert isinstance(tool_start, ToolStart)
        assert isinstance(tool_end, ToolEnd)
        assert enqueue.tool == tool_start.tool == tool_end.tool == f"tool-{tag}-{turn}-{n}"
        assert enqueue.turn == tool_start.turn == tool_end.turn == turn
        assert enqueue.mono_ns <= tool_start.mono_ns <= tool_end.mono_ns
        assert (tool_end.status, tool_end.exit_status) == ("ok", 0)


async def test_hundred_concurrent_sessions_in_threads_and_tasks() -> None:
    sink = MemorySink()
    emitter = Emitter([sink])
    thread_barrier = threading.Barrier(N_THREADS)
    task_barrier = asyncio.Barrier(N_TASKS)
    all_open = threading.Barrier(N_THREADS + 1)  # the threads plus the asyncio side

    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=N_THREADS) as pool:
        thread_futures = [
            loop.run_in_executor(pool, run_thread_session, i, emitter, thread_barrier, all_open)
            for i in range(N_THREADS)
        ]
        task_ids = await asyncio.gather(
            *(run_task_session(i, emitter, task_barrier, all_open) for i in range(N_TASKS))
        )
        thread_ids = await asyncio.gather(*thread_futures)
    assert current_session() is None
    assert emitter.sink_errors == {}

    events = list(sink.events)
    assert len(events) == (N_THREADS + N_TASKS) * EVENTS_PER_SESSION
    assert all(isinstance(e, SessionEvent) for e in events)
    assert len({e.event_id for e in events}) == len(events)
    call_ids = {e.call_id for e in events if not isinstance(e, SessionStart | SessionEnd)}  # type: ignore[attr-defined]
    assert len(call_ids) == (N_THREADS + N_TASKS) * TURNS * (1 + TOOLS_PER_TURN)

    expected = {sid: f"t{i}" for i, sid in enumerate(thread_ids)}
    expected.update({sid: f"a{i}" for i, sid in enumerate(task_ids)})
    assert len(expected) == N_THREADS + N_TASKS  # every session had its own id

    by_session: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_session[e.session_id].append(e)  # type: ignore[attr-defined]
    assert set(by_session) == set(expected)
    for sid, tag in expected.items():
        check_session(by_session[sid], tag, int(tag[1:]))

    # The sessions really overlapped: every one had started before any ended.
    first_end = min(i for i, e in enumerate(events) if isinstance(e, SessionEnd))
    assert sum(isinstance(e, SessionStart) for e in events[:first_end]) == N_THREADS + N_TASKS


async def test_a_task_inherits_the_session_it_was_created_in(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    async def child(n: int) -> Session | None:
        await asyncio.sleep(0)
        async with llm_call(f"child-{n}"):
            await asyncio.sleep(0)
        return current_session()

    async with session(emitter=emitter) as s:
        seen = await asyncio.gather(*(asyncio.create_task(child(n)) for n in range(3)))
        assert seen == [s, s, s]
        assert s.turns == 3
    submits = [e for e in memory_sink.events if isinstance(e, LLMSubmit)]
    assert {e.session_id for e in submits} == {s.session_id}
    assert sorted(e.turn for e in submits) == [0, 1, 2]  # type: ignore[type-var]
    assert sorted(e.model for e in submits) == ["child-0", "child-1", "child-2"]  # type: ignore[type-var]


async def test_a_tasks_session_does_not_leak_into_its_parent(
    memory_sink: MemorySink, emitter: Emitter
) -> None:
    opened = asyncio.Event()
    release = asyncio.Event()

    async def child() -> Session:
        async with session("child", emitter=emitter) as mine:
            opened.set()
            await release.wait()
            with llm_call("child-model"):
                pass
            return mine

    # Without a session in the parent.
    task = asyncio.create_task(child())
    await opened.wait()
    assert current_session() is None  # the child's session is open right now
    release.set()
    inner = await task
    assert inner.session_id == "child"
    assert current_session() is None

    # Inside a session in the parent.
    opened.clear()
    release.clear()
    async with session("parent", emitter=emitter) as outer:
        task = asyncio.create_task(child())
        await opened.wait()
        assert current_session() is outer
        with llm_call("parent-model"):  # attributed to the parent while the child is open
            pass
        release.set()
        await task
        assert current_session() is outer
        assert outer.turns == 1
    assert memory_sink.kinds("parent") == ["session_start", "llm_submit", "llm_end", "session_end"]
    child_submits = [e for e in memory_sink.of_session("child") if isinstance(e, LLMSubmit)]
    assert [e.model for e in child_submits] == ["child-model", "child-model"]


def test_threads_started_in_a_session_do_not_inherit_it(emitter: Emitter) -> None:
    seen: list[Session | None] = []
    with session(emitter=emitter):
        thread = threading.Thread(target=lambda: seen.append(current_session()))
        thread.start()
        thread.join()
    assert seen == [None]
