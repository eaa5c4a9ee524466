"""The sandbox pool: per-session workspaces, slot admission, execution, events.

The pool owns the policy-free mechanics of running tools on the host: a call
is enqueued (``tool_enqueue``), waits for a slot by priority, runs in its
slot's sandbox pinned to the slot's cores (``tool_start``, ``tool_end``), and
every change of the active / queued counts is published as ``tool_stats``.
Which backend runs the command (bubblewrap or docker) does not matter here. Each call
is also a span in its session's trace (``tracing``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self, TypedDict, TypeVar

from opentelemetry.context import Context

from agentmars.sandbox.admission import Admission, check_priority
from agentmars.sandbox.backends.base import Backend, Job, OutputCallback, Slot
from agentmars.sandbox.backends.registry import backend_for
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pressure import ToolPressure
from agentmars.sandbox.spec import (
    ExecResult,
    ExecSpec,
    SandboxError,
    UnknownSession,
    check_session_id,
)
from agentmars.sandbox.threads import in_thread
from agentmars.sandbox.tracing import PoolTracing, ToolSpan
from agentmars.sandbox.workspaces import WorkspaceError, Workspaces, resolve_cwd
from agentmars.sdk.emitter import Emitter, default_emitter
from agentmars.sdk.events import (
    ToolEnd,
    ToolEnqueue,
    ToolStart,
    ToolStats,
    check_id,
    clock,
    new_id,
)
from agentmars.sdk.sinks.otel import parent_context
from agentmars.sdk.tool_stats import ToolDurations

log = logging.getLogger("agentmars.sandbox")

CLOSE_GRACE_S = 10.0
"""How long closing a session waits for its calls to be killed and reaped."""


T = TypeVar("T")
_Execute = Callable[[Slot, asyncio.Event], Awaitable[ExecResult]]
"""Runs an admitted call in its slot until it ends or the event is set."""
IN_PROCESS = ExecSpec(command=["in-process"])
"""What ``run_in_process`` checks its call against in place of a command."""


def _pinned(cores: tuple[int, ...], function: Callable[[], T]) -> T:
    """``function`` run with the calling thread (only it) pinned to ``cores``; the
    thread's affinity is put back after, as the thread returns to a shared pool."""
    thread = threading.get_native_id()
    before = os.sched_getaffinity(thread)
    os.sched_setaffinity(thread, cores)
    try:
        return function()
    finally:
        os.sched_setaffinity(thread, before)


class _CallIds(TypedDict):
    session_id: str
    call_id: str
    turn: int | None
    tool: str


@dataclass
class _Call:
    """A running or queued call: set ``cancel`` to interrupt it; ``done`` is set when
    it has ended (its processes are gone)."""

    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SandboxPool:
    """Runs tool commands for sessions in isolated, CPU-pinned slots.

    Use as ``async with SandboxPool(config) as pool``; ``pool.warnings`` lists the
    isolation the backend could not provide on this host. ``tracing``: where the
    calls' spans go (default: the global OpenTelemetry providers).
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        emitter: Emitter | None = None,
        backend: Backend | None = None,
        tracing: PoolTracing | None = None,
    ) -> None:
        self.config = config or SandboxConfig()
        self.emitter = emitter or default_emitter()
        self.tracing = tracing or PoolTracing()
        self.backend = backend or backend_for(self.config.backend)
        self.slots = [
            Slot(i, tuple(self.config.slot_cores(i))) for i in range(self.config.resolved_slots())
        ]
        self.pressure = ToolPressure(ToolDurations(weight=self.config.exec_ema_alpha))
        self.tool_cores = len(self.config.resolved_tool_cores())
        self.warnings: list[str] = []
        self._admission = Admission(len(self.slots))
        self._workspaces = Workspaces(self.config.workspace_root, self.config.workspace_quota_mb)
        self._sessions: dict[str, Path] = {}
        self._closing_sessions: set[str] = set()
        self._running: dict[tuple[str, str], _Call] = {}
        self._started = False
        self._closed = False
        self._closing: asyncio.Future[None] | None = None

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> Self:
        if self._started:
            return self
        self.warnings = await in_thread(self._workspaces.start)
        try:
            self.warnings += await self.backend.start(self.config, self.slots)
        except BaseException:
            await in_thread(self._workspaces.close)
            raise
        for warning in self.warnings:
            log.warning("sandbox: %s", warning)
        self._started = True
        return self

    async def close(self) -> None:
        """Interrupt running calls, stop the backend. Workspaces stay on disk (with a
        quota, unmounted: their files stay in their images). A close while one is under
        way waits for that one; cancelling a waiter does not stop it."""
        if self._closing is None:
            self._closed = True
            # The backend's close starts first, so that its running jobs end as closed.
            self._closing = asyncio.ensure_future(self._stop_backend())
            for call in self._running.values():
                call.cancel.set()
        elif self._closing.done():
            return
        await asyncio.shield(self._closing)

    async def _stop_backend(self) -> None:
        await self.backend.close()
        await in_thread(self._workspaces.close)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- sessions -------------------------------------------------------------------

    def open_session(self, session_id: str) -> Path:
        """Create (or reuse) the session's workspace and return its path. With a disk
        quota this makes and mounts a file system (some ms): call it from a thread
        where the event loop must not wait."""
        check_session_id(session_id)
        if session_id in self._closing_sessions:
            raise SandboxError(f"session {session_id!r} is being closed; open it after that")
        workspace = self._workspaces.open(session_id)
        self._sessions[session_id] = workspace
        return workspace

    def workspace(self, session_id: str) -> Path:
        check_session_id(session_id)
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession(
                f"unknown session {session_id!r}: open it first (open_session)"
            ) from None

    async def close_session(self, session_id: str, *, remove_workspace: bool = True) -> None:
        """Kill the session's calls, then remove its workspace (or, kept, unmount it),
        and only then forget the session: if the workspace cannot be removed, this
        raises ``WorkspaceError`` and the session stays open, so closing it again
        retries."""
        self.workspace(session_id)
        if session_id in self._closing_sessions:
            raise SandboxError(f"session {session_id!r} is being closed already")
        self._closing_sessions.add(session_id)
        try:
            await self._end_calls(session_id)
            await self.backend.release_session(session_id)
            remove = self._workspaces.remove if remove_workspace else self._workspaces.release
            await in_thread(remove, session_id)
            del self._sessions[session_id]
        finally:
            self._closing_sessions.discard(session_id)

    async def _end_calls(self, session_id: str) -> None:
        calls = [call for (owner, _), call in self._running.items() if owner == session_id]
        for call in calls:
            call.cancel.set()
        ended = [asyncio.ensure_future(call.done.wait()) for call in calls]
        if ended:
            _, pending = await asyncio.wait(ended, timeout=CLOSE_GRACE_S)
            for waiter in pending:
                waiter.cancel()
            if pending:
                raise WorkspaceError(
                    f"{len(pending)} call(s) of session {session_id!r} did not end within "
                    f"{CLOSE_GRACE_S:g} s; the session stays open"
                )

    def check_cwd(self, session_id: str, cwd: str) -> None:
        """Raise ``SandboxError`` if ``cwd`` is not a directory inside the session's
        workspace now (the backend checks again when the call starts)."""
        resolve_cwd(self.workspace(session_id), cwd)

    @property
    def sessions(self) -> list[str]:
        return sorted(self._sessions)

    # --- execution ------------------------------------------------------------------

    async def run(
        self,
        session_id: str,
        spec: ExecSpec,
        *,
        tool: str = "tool",
        priority: int = 0,
        call_id: str | None = None,
        turn: int | None = None,
        on_output: OutputCallback | None = None,
        trace_parent: Context | None = None,
    ) -> ExecResult:
        """Run ``spec`` in the session's sandbox once a slot is free; the result says
        how it ended (a timeout or a kill is a result, not an exception). Raises
        ``SandboxError`` for bad input, an unknown session or a closed pool.
        ``trace_parent``: the context the call's span is a child of (``tracing``)."""
        job, call_id = self._prepare(session_id, spec, tool, priority, call_id)

        async def execute(slot: Slot, cancel: asyncio.Event) -> ExecResult:
            return await self.backend.execute(slot, job, cancel=cancel, on_output=on_output)

        ids = _CallIds(session_id=session_id, call_id=call_id, turn=turn, tool=tool)
        return await self._run_registered(ids, priority, execute, trace_parent)

    async def run_in_process(
        self,
        session_id: str,
        function: Callable[[], T],
        *,
        tool: str = "tool",
        priority: int = 0,
        call_id: str | None = None,
        turn: int | None = None,
        trace_parent: Context | None = None,
    ) -> T:
        """Run ``function`` in a worker thread of this process under the pool's
        admission, as a sandboxed call is run: enqueued by priority, started when a
        slot is free, the thread pinned to the slot's cores meanwhile, the same tool
        events. For a tool that must run in the agent's process (OpenHands' file
        editor keeps its undo history in memory). Returns or raises what ``function``
        does; ``SandboxError`` if the call is interrupted while queued (a running
        thread cannot be stopped)."""
        job, call_id = self._prepare(session_id, IN_PROCESS, tool, priority, call_id)
        returned: list[T] = []
        raised: list[BaseException] = []

        async def execute(slot: Slot, cancel: asyncio.Event) -> ExecResult:
            started = time.monotonic()
            try:
                returned.append(await in_thread(_pinned, slot.cores, function))
            except Exception as exc:
                raised.append(exc)
            await self.backend.adopt(job.workspace)
            return ExecResult(
                status="error" if raised else "ok",
                exit_status=None,
                stdout="",
                stderr="",
                wall_s=time.monotonic() - started,
                slot=slot.index,
                cores=list(slot.cores),
                backend="in-process",
                detail=f"{type(raised[0]).__name__}: {raised[0]}" if raised else None,
            )

        ids = _CallIds(session_id=session_id, call_id=call_id, turn=turn, tool=tool)
        result = await self._run_registered(ids, priority, execute, trace_parent)
        if raised:
            raise raised[0]
        if not returned:
            raise SandboxError(f"{tool} call {call_id!r}: {result.detail}")
        return returned[0]

    async def _run_registered(
        self, ids: _CallIds, priority: int, execute: _Execute, trace_parent: Context | None
    ) -> ExecResult:
        """Run a prepared call, known to ``interrupt`` and ``close_session`` meanwhile."""
        key = (ids["session_id"], ids["call_id"])
        if key in self._running:
            raise SandboxError(
                f"call {ids['call_id']!r} of session {ids['session_id']!r} is already running"
            )
        call = self._running[key] = _Call()
        if trace_parent is None:
            trace_parent = parent_context(self.emitter, ids["session_id"], ids["call_id"])
        try:
            return await self._run_admitted(ids, priority, call.cancel, execute, trace_parent)
        finally:
            del self._running[key]
            call.done.set()

    def _prepare(
        self, session_id: str, spec: ExecSpec, tool: str, priority: int, call_id: str | None
    ) -> tuple[Job, str]:
        if not self._started or self._closed:
            raise SandboxError("the sandbox pool is not running (start it, or it was closed)")
        if session_id in self._closing_sessions:
            raise SandboxError(f"session {session_id!r} is being closed")
        try:
            check_id(tool, "tool")
            check_priority(priority)
            if call_id is not None:
                check_id(call_id, "call_id")
        except ValueError as exc:
            raise SandboxError(str(exc)) from None
        job = Job(
            session_id=session_id,
            workspace=self.workspace(session_id),
            spec=spec,
            timeout_s=spec.timeout_s or self.config.default_timeout_s,
            output_cap_bytes=(
                spec.output_cap_bytes
                if spec.output_cap_bytes is not None
                else self.config.output_cap_bytes
            ),
        )
        return job, call_id or new_id()[:16]

    async def _run_admitted(
        self,
        ids: _CallIds,
        priority: int,
        cancel: asyncio.Event,
        execute: _Execute,
        trace_parent: Context,
    ) -> ExecResult:
        enqueued = clock()
        self._emit(ToolEnqueue(**ids, **enqueued, priority=priority, source="sandbox"))
        span = self.tracing.enqueued(
            **ids, priority=priority, parent=trace_parent, start_ns=enqueued["wall_ns"]
        )
        self.pressure.queued += 1
        self._publish_pressure()
        try:
            slot_index = await self._acquire_unless_cancelled(priority, cancel)
        finally:
            self.pressure.queued -= 1
        if slot_index is None:
            return self._cancelled_in_queue(ids, enqueued["mono_ns"], span)
        started = clock()
        queue_wait_s = (started["mono_ns"] - enqueued["mono_ns"]) / 1e9
        self._emit(ToolStart(**ids, **started, queue_wait_s=queue_wait_s, source="sandbox"))
        span.started(self.slots[slot_index], self.backend.name, queue_wait_s)
        self.pressure.active += 1
        self._publish_pressure()
        result: ExecResult | None = None
        try:
            result = await execute(self.slots[slot_index], cancel)
            result = result.model_copy(update={"queue_wait_s": queue_wait_s})
            return result
        finally:
            self._admission.release(slot_index)
            self.pressure.active -= 1
            self._finish(ids, started["mono_ns"], result, span)

    async def _acquire_unless_cancelled(self, priority: int, cancel: asyncio.Event) -> int | None:
        free = None if cancel.is_set() else self._admission.try_acquire()
        if free is not None:  # the common case, without two tasks to wait for it
            return free
        acquire = asyncio.ensure_future(self._admission.acquire(priority))
        interrupted = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({acquire, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            interrupted.cancel()
            if not acquire.done():
                acquire.cancel()  # Admission hands a just-granted slot on
                await asyncio.wait({acquire})
        if acquire.cancelled():
            return None
        slot = acquire.result()
        if cancel.is_set():
            self._admission.release(slot)
            return None
        return slot

    def _cancelled_in_queue(self, ids: _CallIds, enqueued_ns: int, span: ToolSpan) -> ExecResult:
        ended = clock()
        waited_s = (ended["mono_ns"] - enqueued_ns) / 1e9
        detail = "interrupted while waiting for a slot"
        self._emit(
            ToolEnd(
                **ids,
                **ended,
                status="cancelled",
                error=detail,
                source="sandbox",
            )
        )
        self._publish_pressure()
        result = ExecResult(
            status="cancelled",
            exit_status=None,
            stdout="",
            stderr="",
            wall_s=0.0,
            queue_wait_s=waited_s,
            backend=self.backend.name,
            detail=detail,
        )
        span.ended(result, ended["wall_ns"])
        return result

    def _finish(
        self, ids: _CallIds, started_ns: int, result: ExecResult | None, span: ToolSpan
    ) -> None:
        ended = clock()
        duration_s = (ended["mono_ns"] - started_ns) / 1e9
        # No result: the backend raised (the caller gets that exception).
        status = result.status if result else "error"
        error = result.detail if result else "sandbox failure"
        self.pressure.record_exec(ids["tool"], duration_s)
        self._emit(
            ToolEnd(
                **ids,
                **ended,
                status=status,
                exit_status=result.exit_status if result else None,
                error=error,
                duration_s=duration_s,
                cpu_time_s=result.cpu_s if result else None,
                source="sandbox",
            )
        )
        span.ended(result, ended["wall_ns"])
        self._publish_pressure()

    async def interrupt(self, session_id: str, call_id: str) -> bool:
        """Kill a running or queued call (its result: ``cancelled``); False if unknown."""
        call = self._running.get((session_id, call_id))
        if call is None:
            return False
        call.cancel.set()
        return True

    # --- telemetry ------------------------------------------------------------------

    def _publish_pressure(self) -> None:
        self._emit(
            ToolStats(
                active=self.pressure.active,
                queued=self.pressure.queued,
                exec_ema_s=dict(self.pressure.exec_ema_s),
                cores=self.tool_cores,
                source="sandbox",
            )
        )

    def _emit(self, event: ToolEnqueue | ToolStart | ToolEnd | ToolStats) -> None:
        self.emitter.emit(event)

    def snapshot(self) -> dict[str, object]:
        """Current pressure, slots and sessions (for health and metrics endpoints)."""
        return {
            "backend": self.backend.name,
            "slots": [{"index": s.index, "cores": list(s.cores)} for s in self.slots],
            "active": self.pressure.active,
            "queued": self.pressure.queued,
            "completed": self.pressure.completed,
            "exec_ema_s": dict(self.pressure.exec_ema_s),
            "sessions": len(self._sessions),
            "warnings": list(self.warnings),
            "at": time.time(),
        }
