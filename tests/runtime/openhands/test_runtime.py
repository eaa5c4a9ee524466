"""A real OpenHands Conversation (the SDK's scripted ``TestLLM``) on AgentmarsRuntime:
its terminal commands run in the sandbox pool, pinned to a slot's cores and in the
sandbox's namespaces (seen from inside the commands), with the terminal's contract
(working directory and variables kept, exit codes, soft timeouts, C-c, reset); the file
editor and the task tracker are admitted by the pool; every tool call is a pool event
of the conversation's session."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openhands.tools.terminal")
from openhands.sdk import Agent, Tool
from openhands.sdk.event import ObservationEvent
from openhands.sdk.testing import TestLLM
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentmars.runtime.openhands import AgentmarsRuntime
from agentmars.sandbox.config import SandboxConfig, allowed_cores
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import SessionEnd, ToolEnd, ToolEnqueue, ToolStart
from agentmars.sdk.sinks.memory import MemorySink
from tests.runtime.openhands.app_conversation import scripted_call

TOOL_CORE = allowed_cores()[-1]
TOOLS = [Tool(name="terminal"), Tool(name="file_editor"), Tool(name="task_tracker")]


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[tuple[SandboxPool, MemorySink]]:
    events = MemorySink()
    config = SandboxConfig(
        workspace_root=tmp_path / "ws", tool_cores=[TOOL_CORE], engine_cores=[], slots=1
    )
    async with SandboxPool(config, emitter=Emitter([events])) as started:
        yield started, events


def _script(*calls: tuple[str, dict[str, Any]]) -> TestLLM:
    steps = [scripted_call(i, tool, arguments) for i, (tool, arguments) in enumerate(calls)]
    return TestLLM.from_messages([*steps, scripted_call(len(calls), "finish", {"message": "done"})])


async def _converse(
    pool: SandboxPool, llm: TestLLM, conversation_id: uuid.UUID, tools: list[Tool] = TOOLS
) -> list[ObservationEvent]:
    """Runs the conversation to its end; its tool observations, in order."""
    runtime = AgentmarsRuntime("http://127.0.0.1:9", pool)
    observations: list[ObservationEvent] = []

    def collect(event: Any) -> None:
        if isinstance(event, ObservationEvent) and event.tool_name != "finish":
            observations.append(event)

    def run() -> None:
        with runtime.conversation(
            Agent(llm=llm, tools=tools),
            conversation_id=conversation_id,
            callbacks=[collect],
            visualizer=None,
        ) as conversation:
            conversation.send_message("work")
            conversation.run()

    await asyncio.to_thread(run)
    return observations


def _texts(observations: list[ObservationEvent]) -> list[str]:
    return [event.observation.text for event in observations]


async def test_terminal_commands_run_pinned_in_the_sandbox_and_keep_their_shell_state(
    pool: tuple[SandboxPool, MemorySink],
) -> None:
    sandbox, events = pool
    conversation_id = uuid.uuid4()
    workspace = sandbox.open_session(str(conversation_id))  # the conversation's, reused
    llm = _script(
        ("terminal", {"command": "grep Cpus_allowed_list /proc/self/status; "
                      "readlink /proc/self/ns/pid /proc/self/ns/mnt; pwd; "
                      "mkdir sub && cd sub && export GREETING=hello"}),
        ("terminal", {"command": "pwd; echo \"$GREETING\"; echo oops >&2; exit 3"}),
        ("file_editor", {"command": "create", "path": str(workspace / "notes.txt"),
                         "file_text": "seen by the sandbox\n"}),
        ("terminal", {"command": "cat ../notes.txt"}),
        ("task_tracker", {"command": "plan", "task_list": [
            {"title": "read", "notes": "", "status": "done"}]}),
    )  # fmt: skip
    observations = await _converse(sandbox, llm, conversation_id)

    first, second, edit, cat, plan = observations
    lines = first.observation.text.split()
    assert lines[0] == "Cpus_allowed_list:" and lines[1] == str(TOOL_CORE)
    host_namespaces = [os.readlink(f"/proc/self/ns/{kind}") for kind in ("pid", "mnt")]
    assert lines[2] != host_namespaces[0] and lines[3] != host_namespaces[1]
    assert lines[4] == str(workspace)
    assert first.observation.exit_code == 0  # type: ignore[attr-defined]
    assert second.observation.text.split() == [str(workspace / "sub"), "hello", "oops"]
    assert second.observation.exit_code == 3  # type: ignore[attr-defined]
    assert "[Command finished with exit code 3]" in second.observation.to_llm_content[0].text  # type: ignore[union-attr]
    assert not edit.observation.is_error, edit.observation.text
    assert cat.observation.text.strip() == "seen by the sandbox"
    assert not plan.observation.is_error, plan.observation.text

    session = str(conversation_id)
    tool_events = [e for e in events.events if isinstance(e, ToolEnqueue | ToolStart | ToolEnd)]
    assert {e.session_id for e in tool_events} == {session}
    ends = [e for e in tool_events if isinstance(e, ToolEnd)]
    assert [(e.tool, e.turn, e.status) for e in ends] == [
        ("terminal", 0, "ok"),
        ("terminal", 1, "error"),
        ("file_editor", 2, "ok"),
        ("terminal", 3, "ok"),
        ("task_tracker", 4, "ok"),
    ]
    assert [type(e) for e in tool_events] == [ToolEnqueue, ToolStart, ToolEnd] * 5
    (end,) = [e for e in events.events if isinstance(e, SessionEnd)]
    assert end.session_id == session and end.status == "ok" and end.turns == 6
    assert sandbox.sessions == []  # closed with the conversation


async def test_a_soft_timeout_leaves_the_command_running_until_c_c(
    pool: tuple[SandboxPool, MemorySink],
) -> None:
    sandbox, events = pool
    llm = _script(
        ("terminal", {"command": "echo started; sleep 60; echo never", "timeout": 0.5}),
        ("terminal", {"command": "echo refused"}),
        ("terminal", {"command": "C-c", "is_input": True}),
        ("terminal", {"command": "echo after"}),
    )
    running, refused, stopped, after = await _converse(sandbox, llm, uuid.uuid4())
    assert running.observation.exit_code == -1  # type: ignore[attr-defined]
    assert running.observation.timeout  # type: ignore[attr-defined]
    assert running.observation.text.strip() == "started"
    assert "NOT executed" in refused.observation.to_llm_content[0].text  # type: ignore[union-attr]
    assert stopped.observation.exit_code == 130  # type: ignore[attr-defined]
    assert "never" not in stopped.observation.text
    assert after.observation.text.strip() == "after"
    assert after.observation.exit_code == 0  # type: ignore[attr-defined]
    cancelled = [e for e in events.events if isinstance(e, ToolEnd) and e.status == "cancelled"]
    assert len(cancelled) == 1


async def test_reset_forgets_the_shell_state(pool: tuple[SandboxPool, MemorySink]) -> None:
    sandbox, _ = pool
    llm = _script(
        ("terminal", {"command": "mkdir d && cd d && export X=1"}),
        ("terminal", {"command": "pwd; echo ${X:-unset}", "reset": True}),
    )
    conversation_id = uuid.uuid4()
    _, reset = await _converse(sandbox, llm, conversation_id)
    text = reset.observation.text
    assert text.startswith("Terminal session has been reset.")
    assert text.split()[-2:] == [str(sandbox.config.workspace_root / str(conversation_id)), "unset"]


async def test_without_a_timeout_the_command_runs_on_while_it_prints(
    pool: tuple[SandboxPool, MemorySink],
) -> None:
    sandbox, _ = pool
    printing = "for i in 1 2 3 4; do echo $i; sleep 0.4; done; sleep 60"
    llm = _script(
        ("terminal", {"command": printing}),
        ("terminal", {"command": "C-c", "is_input": True}),
    )
    # No output for 1 s: a soft timeout. The loop prints for 1.6 s, longer than that.
    terminal = [Tool(name="terminal", params={"no_change_timeout_seconds": 1})]
    started = time.monotonic()
    quiet, stopped = await _converse(sandbox, llm, uuid.uuid4(), terminal)
    assert quiet.observation.text.split() == ["1", "2", "3", "4"]
    assert quiet.observation.exit_code == -1  # type: ignore[attr-defined]
    assert "no new output after 1 seconds" in quiet.observation.to_llm_content[0].text  # type: ignore[union-attr]
    assert stopped.observation.exit_code == 130  # type: ignore[attr-defined]
    assert time.monotonic() - started < 30


async def test_misuse_is_refused_with_a_message(pool: tuple[SandboxPool, MemorySink]) -> None:
    sandbox, _ = pool
    runtime = AgentmarsRuntime("http://127.0.0.1:9", sandbox)
    agent = Agent(llm=_script(), tools=TOOLS)
    with (
        pytest.raises(ValueError, match="give files= to copy a folder"),
        runtime.conversation(agent, workspace="/tmp"),
    ):
        pass
    with pytest.raises(RuntimeError, match="inside the event loop"):
        await asyncio.to_thread(AgentmarsRuntime, "http://127.0.0.1:9", sandbox)


async def test_tool_spans_join_the_trace_of_the_conversation(
    pool: tuple[SandboxPool, MemorySink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenHands runs tools in worker threads with the caller's context copied: the
    runtime's tool spans are children of the span current where the conversation runs
    (OpenHands' own tool span when its tracing is on), and the pool's spans of the
    commands they ran are theirs."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # OpenHands' tracing reads the global provider; set for this test only (the API
    # allows one per process: its own tests reset it the same way), so later tests'
    # servers see none.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    sandbox, _ = pool
    llm = _script(("terminal", {"command": "true"}), ("terminal", {"command": "false"}))
    runtime = AgentmarsRuntime("http://127.0.0.1:9", sandbox)
    conversation_id = uuid.uuid4()

    def run() -> None:
        with (
            trace.get_tracer("test").start_as_current_span("agent run"),
            runtime.conversation(
                Agent(llm=llm, tools=TOOLS), conversation_id=conversation_id, visualizer=None
            ) as conversation,
        ):
            conversation.send_message("work")
            conversation.run()

    await asyncio.to_thread(run)
    spans = exporter.get_finished_spans()
    (root,) = [span for span in spans if span.name == "agent run"]
    runs = {
        scope: [s for s in spans if s.name == "execute_tool terminal" and scope_of(s) == scope]
        for scope in ("agentmars.runtime.openhands", "agentmars.sandbox")
    }
    tools, commands = runs["agentmars.runtime.openhands"], runs["agentmars.sandbox"]
    assert len(tools) == len(commands) == 2
    assert {c.parent.span_id for c in commands if c.parent} == {t.context.span_id for t in tools}
    for span in tools:
        assert span.context.trace_id == root.context.trace_id
        assert span.attributes is not None
        assert span.attributes["gen_ai.conversation.id"] == str(conversation_id)
        assert span.attributes["gen_ai.tool.call.id"] in {"terminal-1", "terminal-2"}


def scope_of(span: ReadableSpan) -> str | None:
    return span.instrumentation_scope.name if span.instrumentation_scope else None


async def test_sixteen_conversations_at_once_on_the_default_executor_all_finish(
    pool: tuple[SandboxPool, MemorySink],
) -> None:
    """Issue 40: conversations run with asyncio.to_thread fill the loop's default
    executor (6 threads on 2 cores) and wait on the pool from there; the pool's own
    work (workspaces, the in-process file editor) must not need that executor. Sized
    here as on 2 cores, whatever this host has."""
    sandbox, events = pool
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=6))
    conversations = [uuid.uuid4() for _ in range(16)]

    async def converse(conversation_id: uuid.UUID) -> list[ObservationEvent]:
        path = sandbox.config.workspace_root / str(conversation_id) / "a.txt"
        llm = _script(
            ("file_editor", {"command": "create", "path": str(path), "file_text": "x\n"}),
            ("terminal", {"command": "echo done"}),
        )  # fmt: skip
        return await _converse(sandbox, llm, conversation_id)

    ran = await asyncio.wait_for(asyncio.gather(*map(converse, conversations)), timeout=240)

    assert [[e.tool_name for e in observations] for observations in ran] == [
        ["file_editor", "terminal"]
    ] * 16
    ends = [e for e in events.events if isinstance(e, SessionEnd)]
    assert sorted(e.session_id for e in ends) == sorted(map(str, conversations))
    assert {e.status for e in ends} == {"ok"}
    assert sandbox.sessions == []


async def test_a_workspace_goes_into_the_sandbox_and_what_the_agent_wrote_comes_back(
    pool: tuple[SandboxPool, MemorySink], tmp_path: Path
) -> None:
    """``runtime.Conversation(agent=..., workspace=...)``, OpenHands' own call: the
    folder's files are copied in, the agent's are copied back when it closes, links
    as links (one made in the sandbox may point anywhere)."""
    sandbox, events = pool
    project = tmp_path / "project"
    project.mkdir()
    (project / "README").write_text("the project\n")
    conversation_id = uuid.uuid4()
    new = sandbox.config.workspace_root / str(conversation_id) / "new.txt"
    llm = _script(
        ("terminal", {"command": "cat README > copy.txt; ln -s /etc/hostname link"}),
        ("file_editor", {"command": "create", "path": str(new), "file_text": "new\n"}),
    )  # fmt: skip
    runtime = AgentmarsRuntime("http://127.0.0.1:9", pool=sandbox)

    def run() -> str:
        conversation = runtime.Conversation(
            Agent(llm=llm, tools=TOOLS),
            workspace=project,
            conversation_id=conversation_id,
            visualizer=None,
        )
        conversation.send_message("work")
        conversation.run()
        conversation.close()
        return conversation.state.execution_status.value

    assert await asyncio.to_thread(run) == "finished"
    assert (project / "copy.txt").read_text() == "the project\n"
    assert (project / "new.txt").read_text() == "new\n"
    assert (project / "link").is_symlink()
    assert sandbox.sessions == []
    (end,) = [e for e in events.events if isinstance(e, SessionEnd)]
    assert end.session_id == str(conversation_id) and end.status == "ok"


def test_without_a_pool_the_runtime_needs_the_gateways_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTMARS_GATEWAY_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"\$AGENTMARS_GATEWAY_TOKEN"):
        AgentmarsRuntime("http://127.0.0.1:9")
