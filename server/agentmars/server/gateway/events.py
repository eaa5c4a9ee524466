"""The gateway's own events (LLM submit, first token, end) and the SSE event stream.

``CallRecorder`` publishes one call's events into the ``EventHub``, source
``"gateway"``, reading the answer as its API writes it (``llm_apis``). The first token
is the first stream chunk that carries generated text or a tool call (a bare role
chunk does not count), as in the SDK; a whole (non-streamed) response records no
first token, also as in the SDK. ``GET /v1/events/stream`` serves every event the hub
receives from then on as Server-Sent Events (``data: <event JSON>``),
token-protected like ingestion since events name sessions and tools.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse

from agentmars.sdk.auth import UNAUTHORISED, bearer_matches, check_token
from agentmars.sdk.events import AnyEvent, LLMEnd, LLMFirstToken, LLMSubmit, clock
from agentmars.sdk.wire import STREAM_PATH
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.gateway.llm_apis import CHAT, Identity, LLMApi, Usage
from agentmars.server.web.client_watch import ClosingStreamingResponse
from agentmars.server.web.ingest import EventHub

CallStatus = Literal["ok", "error", "cancelled"]
STREAM_QUEUE = 10_000
"""Events buffered per stream subscriber; a reader that falls further behind loses
events (counted in a ``: dropped N`` SSE comment) instead of growing memory."""
STREAM_BUFFER_BYTES = 4 * 1024 * 1024
"""Bytes of event JSON buffered per stream subscriber, likewise (our choice: four of the
largest events ingest takes, thousands of ordinary ones)."""
MAX_STREAMS = 16
"""Event streams open at once (our choice: a dashboard, a benchmark, a few operators);
one more gets 429 until one closes."""
KEEPALIVE_S = 15.0
STOP_CHECK_S = 0.25


class CallRecorder:
    """Records one forwarded call to ``api``; ``end`` is idempotent (first outcome
    wins)."""

    def __init__(
        self, hub: EventHub, meta: CallMeta, turn: int, body: dict[str, Any], api: LLMApi = CHAT
    ) -> None:
        self.hub = hub
        self.api = api
        self.ids: dict[str, Any] = {
            "session_id": meta.session_id,
            "call_id": meta.call_id,  # the SDK's when sent: its events and ours name one call
            "turn": turn,
            "source": "gateway",
        }
        self._start_ns = time.monotonic_ns()
        self._first_token = False
        self._ended = False
        self._usage = Usage()
        self._identity = Identity()
        self.on_response_id: Callable[[str], None] = lambda response_id: None
        """Told the answer's id as soon as it is read: a client that has read the
        answer may continue it before the relay gets back to record its end."""
        self._finish_reason: str | None = None
        self._tool_call = False
        self._publish(
            LLMSubmit(
                model=body.get("model") if isinstance(body.get("model"), str) else None,
                operation=api.operation(body),
                stream=bool(body.get("stream")),
                projected_prompt_tokens=meta.prompt_tokens,
                max_tokens=api.max_tokens(body),
                follows_tool=meta.follows_tool,
                expects_tool=meta.expects_tool,
                **self.ids,
            )
        )

    def _publish(self, event: AnyEvent) -> None:
        self.hub.publish([event])

    def _elapsed_s(self, now_ns: int) -> float:
        return max(0.0, (now_ns - self._start_ns) / 1e9)

    def observe(self, response: dict[str, Any], *, chunk: bool) -> None:
        """Read a whole response or (``chunk``) one stream chunk: first token, usage,
        finish reason."""
        if chunk and not self._first_token and self.api.carries_output(response):
            self._first_token = True
            stamp = clock()
            ttft = self._elapsed_s(stamp["mono_ns"])
            self._publish(LLMFirstToken(ttft_s=ttft, **self.ids, **stamp))
        if (usage := self.api.usage(response)) is not None:
            self._usage = self._usage.updated(usage)
        identity = self._identity.updated(self.api.identity(response))
        if (answer_id := identity.response_id) and answer_id != self._identity.response_id:
            self.on_response_id(answer_id)
        self._identity = identity
        if (finish := self.api.finish(response)) is not None:
            self._finish_reason, self._tool_call = finish

    def end(self, status: CallStatus = "ok", error: str | None = None) -> LLMEnd | None:
        """Record the call's end; returns its ``llm_end`` (None: it was recorded)."""
        if self._ended:
            return None
        self._ended = True
        stamp = clock()
        prompt, cached = self._usage.prompt, self._usage.cached
        if prompt is None or (cached is not None and cached > prompt):
            cached = None  # an engine's inconsistent figure is dropped, not an event error
        ended = LLMEnd(
            status=status,
            error=error,
            prompt_tokens=prompt,
            cached_tokens=cached,
            output_tokens=self._usage.output,
            finish_reason=self._finish_reason,
            ended_in_tool_call=self._tool_call,
            duration_s=self._elapsed_s(stamp["mono_ns"]),
            response_id=self._identity.response_id,
            response_model=self._identity.model,
            **self.ids,
            **stamp,
        )
        self._publish(ended)
        return ended


# --- the SSE stream ---------------------------------------------------------------------


class _StreamSubscriber:
    """Carries hub batches (from any thread) into one stream's asyncio queue of event
    JSON, at most ``STREAM_QUEUE`` events and ``STREAM_BUFFER_BYTES``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[str] = asyncio.Queue(STREAM_QUEUE)
        self.buffered_bytes = 0
        self.dropped = 0

    def __call__(self, events: Sequence[AnyEvent]) -> None:
        self.loop.call_soon_threadsafe(self._put, events)

    def _put(self, events: Sequence[AnyEvent]) -> None:
        for event in events:
            data = event.to_json()
            if self.buffered_bytes + len(data) > STREAM_BUFFER_BYTES or self.queue.full():
                self.dropped += 1
                continue
            self.buffered_bytes += len(data)
            self.queue.put_nowait(data)

    async def next(self, timeout_s: float) -> str:
        """The next event's JSON (``TimeoutError`` if none comes within ``timeout_s``)."""
        data = await asyncio.wait_for(self.queue.get(), timeout_s)
        self.buffered_bytes -= len(data)
        return data


async def _sse(
    hub: EventHub, subscriber: _StreamSubscriber, stopping: Callable[[], bool]
) -> AsyncIterator[str]:
    unsubscribe = hub.subscribe(subscriber)
    try:
        yield ": agentmars event stream\n\n"
        reported = 0
        quiet_s = 0.0
        # An endless response would hold up the server's graceful shutdown: look at
        # ``stopping`` every STOP_CHECK_S and end the stream when it says so.
        while not stopping():
            try:
                data = await subscriber.next(STOP_CHECK_S)
            except TimeoutError:
                quiet_s += STOP_CHECK_S
                if quiet_s >= KEEPALIVE_S:
                    quiet_s = 0.0
                    yield ": keepalive\n\n"
                continue
            if subscriber.dropped > reported:
                reported = subscriber.dropped
                yield f": dropped {reported}\n\n"
            yield f"data: {data}\n\n"
    finally:
        unsubscribe()


class OpenStreams:
    """How many streams of one route are open, at most ``limit`` (on the event loop
    only: no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def open(self) -> bool:
        """Count one more stream, unless ``limit`` are open already."""
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def close(self) -> None:
        self.count -= 1


def stream_router(
    hub: EventHub, token: str, stopping: Callable[[], bool] = lambda: False
) -> APIRouter:
    """``GET /v1/events/stream``: every event from now on, as SSE (bearer token), at
    most ``MAX_STREAMS`` at once. Open streams end once ``stopping()`` is true (the
    server is shutting down)."""
    expected = check_token(token)
    router = APIRouter()
    streams = OpenStreams(MAX_STREAMS)

    @router.get(STREAM_PATH)
    async def event_stream(request: Request) -> StreamingResponse:
        if not bearer_matches(request.headers.get("authorization", ""), expected):
            raise HTTPException(401, UNAUTHORISED, headers={"WWW-Authenticate": "Bearer"})
        if not streams.open():
            raise HTTPException(429, f"{MAX_STREAMS} event streams are open; retry when one ends")
        subscriber = _StreamSubscriber(asyncio.get_running_loop())
        return ClosingStreamingResponse(
            _sse(hub, subscriber, stopping),
            media_type="text/event-stream",
            on_close=streams.close,
        )

    return router
