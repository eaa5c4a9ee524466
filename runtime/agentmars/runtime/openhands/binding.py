"""A conversation's session of the sandbox pool, as OpenHands' tool threads use it.

OpenHands runs a conversation synchronously (``conversation.run()`` in the caller's
thread, tools in its worker threads); the pool is asyncio's, on the event loop it was
started on. Each call crosses over with ``run_coroutine_threadsafe`` and waits there,
so the loop must not be the thread that runs the conversation (run it with
``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry import trace

from agentmars.runtime.openhands.markers import SessionMarkers
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk import semconv as sc
from agentmars.sdk.sinks.otel import parent_context, tool_span_name

T = TypeVar("T")
_TRACER = trace.get_tracer("agentmars.runtime.openhands")


@dataclass
class SandboxSession:
    pool: SandboxPool
    loop: asyncio.AbstractEventLoop
    session_id: str
    """The conversation's id: the gateway's session of its LLM calls too."""
    workspace: Path
    markers: SessionMarkers

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(work, self.loop)

    def interrupt(self, call_id: str) -> None:
        self.submit(self.pool.interrupt(self.session_id, call_id)).result()

    def run_in_process(self, function: Callable[[], T], *, tool: str, call_id: str) -> T:
        work = self.pool.run_in_process(
            self.session_id,
            function,
            tool=tool,
            priority=self.tool_priority(),
            call_id=call_id,
            turn=self.turn(),
        )
        try:
            return self.submit(work).result()
        finally:
            self.pool.emitter.flush()

    def turn(self) -> int | None:
        """The LLM call whose answer asked for the tool."""
        return self.markers.answered_turn

    def tool_priority(self) -> int:
        """Ours: 0, the pool's default. The gateway's per-session priority comes back
        in a response header that OpenHands' LLM does not hand on."""
        return 0

    @contextlib.contextmanager
    def span(self, tool: str, call_id: str | None = None) -> Iterator[trace.Span]:
        """A span of the tool action under the current one (OpenHands' tool span, when
        its tracing is on), else under the session's span in the trace of the pool
        emitter's ``OTelSink``: the pool's spans of its commands are its children."""
        attributes = {
            sc.OPERATION: "execute_tool",
            sc.TOOL_NAME: tool,
            sc.TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
            sc.CONVERSATION_ID: self.session_id,
            sc.SESSION_ID: self.session_id,
        }
        if call_id is not None:
            attributes[sc.TOOL_CALL_ID] = call_id
        parent = parent_context(self.pool.emitter, self.session_id, call_id)
        with _TRACER.start_as_current_span(
            tool_span_name(tool), context=parent, attributes=attributes
        ) as span:
            yield span
