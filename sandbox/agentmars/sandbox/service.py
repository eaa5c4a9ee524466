"""``agentmars sandbox serve``: the pool over HTTP for agents in other processes.

Binds loopback by default; every endpoint but ``/healthz`` and ``/metrics``
needs the bearer token, checked before a byte of the body is read; bodies are
bounded (``MAX_BODY_BYTES``) and timed (``agentmars.sdk.http_guard``). The pool's
events (tool enqueue / start / end, tool pressure) feed the Prometheus metrics
and, optionally, an event collector. A call's span (``tracing``) is a child of the
W3C trace context its request carries (``traceparent``: the client sends its session's),
exported where the ``OTEL_EXPORTER_OTLP_*`` variables say unless a provider is given.
``serve_sandbox`` serves it; stopping kills the running tools at once rather than
waiting for them. Results go out as JSON in pieces (``_result_json``), so a flood of
output held up to the cap never has to be one JSON string in memory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.trace import TracerProvider
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ConfigDict, Field

from agentmars.sandbox.admission import MAX_PRIORITY, MIN_PRIORITY
from agentmars.sandbox.backends.base import OutputCallback
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import (
    MAX_STDIN_BYTES,
    ExecResult,
    ExecSpec,
    SandboxError,
    UnicodeModel,
    UnknownSession,
)
from agentmars.sandbox.threads import in_thread
from agentmars.sandbox.tracing import SERVICE_NAME, PoolTracing
from agentmars.sandbox.workspaces import WorkspaceError
from agentmars.sdk.auth import bearer_matches, check_token
from agentmars.sdk.events import MAX_COUNT, Event, ToolEnd, ToolStart, new_id
from agentmars.sdk.http_guard import RequestGuard, Scope
from agentmars.sdk.sinks.otel import tracer_provider_from_env
from agentmars.sdk.tool_stats import ToolKinds

INTERRUPT_GRACE_S = 10.0
"""How long an interrupted call may take to be killed and reaped."""
MAX_BODY_BYTES = 2 * MAX_STDIN_BYTES + 1024 * 1024
"""The largest request body: an exec whose stdin is ``MAX_STDIN_BYTES`` of text, as
JSON (where a newline or quote takes two bytes), with its command. Past it: 413."""
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
"""Paths served without the bearer token."""
MAX_ECHOED_CHARS = 200
"""A 422 answer quotes at most this much of an invalid string it names."""
RESULT_PIECE_CHARS = 64 * 1024
"""A result's stdout and stderr are made JSON this many characters at a time (at most
6 bytes each: 384 KiB), each piece sent before the next is made."""
RESULT_WRITE_BYTES = 64 * 1024
"""A result's JSON goes out in writes of about this size (a transport's high-water
mark); a smaller result, in one."""
STOP_CHECK_S = 0.1
"""How often the service looks whether its server is stopping (uvicorn's own tick)."""

log = logging.getLogger("agentmars.sandbox")


class OpenSession(UnicodeModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str


class ExecRequest(ExecSpec):
    """An ``ExecSpec`` plus how the call is scheduled and reported."""

    tool: Annotated[str, Field(min_length=1, max_length=256)] = "tool"
    priority: Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)] = 0
    call_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    turn: Annotated[int, Field(ge=0, le=MAX_COUNT)] | None = None
    stream: bool = False
    """Answer with NDJSON: output chunks as they come, then the result."""

    def spec(self) -> ExecSpec:
        return ExecSpec(**self.model_dump(include=set(ExecSpec.model_fields)))


class MetricsSink:
    """Counts finished tool calls and queue waits from the pool's event stream; tool
    names past ``MAX_TOOL_KINDS`` share one label, so that a client naming each call
    differently cannot grow the series without bound."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.kinds = ToolKinds()
        self.calls = Counter(
            "agentmars_sandbox_tool_calls", "Finished tool calls", ["tool", "status"],
            registry=registry,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "agentmars_sandbox_queue_wait_seconds", "Tool enqueue to start", registry=registry
        )
        self.duration = Histogram(
            "agentmars_sandbox_tool_duration_seconds", "Tool start to end", ["tool"],
            registry=registry,
        )  # fmt: skip

    def emit(self, event: Event) -> None:
        if isinstance(event, ToolStart):
            self.queue_wait.observe(event.queue_wait_s)
        elif isinstance(event, ToolEnd):
            tool = self.kinds.kind(event.tool)
            self.calls.labels(tool, event.status).inc()
            self.duration.labels(tool).observe(event.duration_s)

    def close(self) -> None:
        pass


class PoolCollector(Collector):
    """Gauges read from the pool at scrape time."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pressure = self.pool.pressure
        yield GaugeMetricFamily("agentmars_sandbox_active_tools", "Tools running", pressure.active)
        yield GaugeMetricFamily(
            "agentmars_sandbox_queued_tools", "Tools waiting for a slot", pressure.queued
        )
        yield GaugeMetricFamily("agentmars_sandbox_slots", "Sandbox slots", len(self.pool.slots))
        ema = GaugeMetricFamily(
            "agentmars_sandbox_tool_exec_ema_seconds", "EMA of tool execution time", labels=["tool"]
        )
        for tool, seconds in sorted(pressure.exec_ema_s.items()):
            ema.add_metric([tool], seconds)
        yield ema


def _authorised(scope: Scope, expected: bytes) -> bool:
    if scope["path"] in OPEN_PATHS:
        return True
    headers = dict(scope["headers"])
    return bearer_matches(headers.get(b"authorization", b"").decode("latin-1"), expected)


def _status_for(exc: SandboxError) -> int:
    if isinstance(exc, UnknownSession):
        return 404
    return 409 if isinstance(exc, WorkspaceError) else 400


def _renderable(value: Any) -> Any:
    """A validation error's details as JSON can carry them: a non-finite number (NaN,
    Infinity, or 1e400, which parses as infinity) as its name, a long string cut, a
    lone surrogate escaped (``\\ud800``: UTF-8 cannot carry it), and no echo of a whole
    object or list (the error names the field)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        if len(value) > MAX_ECHOED_CHARS:
            value = value[:MAX_ECHOED_CHARS] + "..."
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {k: _renderable(v) for k, v in value.items() if not _is_echoed_container(k, v)}
    if isinstance(value, list):
        return [_renderable(item) for item in value]
    return value


def _is_echoed_container(key: str, value: Any) -> bool:
    return key == "input" and isinstance(value, dict | list)


def create_sandbox_app(
    pool: SandboxPool, token: str, *, tracer_provider: TracerProvider | None = None
) -> FastAPI:
    """The service app; starts the pool on startup and closes it (killing running
    tools) on shutdown. The pool's spans go to ``tracer_provider``, else to a provider
    of the service's own built from the environment (if it gives an endpoint), else
    where the pool's ``tracing`` sends them."""
    expected = check_token(token)
    registry = CollectorRegistry()
    pool.emitter.add(MetricsSink(registry))
    registry.register(PoolCollector(pool))
    own = None if tracer_provider is not None else tracer_provider_from_env(SERVICE_NAME)
    if tracer_provider is not None or own is not None:
        pool.tracing = PoolTracing(tracer_provider or own)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        stopper = asyncio.create_task(_close_when_stopping(pool, lambda: app.state.stopping()))
        try:
            yield
        finally:
            stopper.cancel()
            await pool.close()
            if own is not None:
                own.shutdown()

    app = FastAPI(title="agentmars sandbox", lifespan=lifespan)
    app.state.stopping = lambda: False  # serve_sandbox: whether its server is stopping
    app.add_middleware(
        RequestGuard,
        max_body_bytes=MAX_BODY_BYTES,
        authorise=lambda scope: _authorised(scope, expected),
    )

    @app.exception_handler(SandboxError)
    async def sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
        return JSONResponse(status_code=_status_for(exc), content={"detail": str(exc)})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # NOTE: FastAPI's own handler echoes each invalid input, and a NaN there makes
        # rendering the answer raise (a 500 instead of the 422).
        detail = _renderable(jsonable_encoder(exc.errors()))
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "pid": os.getpid(), **pool.snapshot()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/sessions", status_code=201)
    async def open_session(body: OpenSession) -> dict[str, str]:
        workspace = await in_thread(pool.open_session, body.session_id)
        return {"session_id": body.session_id, "workspace": str(workspace)}

    @app.delete("/v1/sessions/{session_id}", status_code=204)
    async def close_session(session_id: str, keep_workspace: bool = False) -> Response:
        await pool.close_session(session_id, remove_workspace=not keep_workspace)
        return Response(status_code=204)

    @app.post(
        "/v1/sessions/{session_id}/exec",
        response_model=None,
        responses={200: {"model": ExecResult, "description": "How the call ended"}},
    )
    async def execute(session_id: str, body: ExecRequest, request: Request) -> Response:
        pool.check_cwd(session_id, body.cwd)  # 404 / 400 before anything starts
        parent = propagate.extract(request.headers)
        if body.stream:
            return StreamingResponse(
                _stream_exec(pool, session_id, body, parent), media_type="application/x-ndjson"
            )
        result = await _exec_until_disconnect(pool, session_id, body, request, parent)
        return _result_response(result)

    @app.post("/v1/sessions/{session_id}/calls/{call_id}/interrupt")
    async def interrupt(session_id: str, call_id: str) -> dict[str, bool]:
        return {"interrupted": await pool.interrupt(session_id, call_id)}

    return app


def _start_call(
    pool: SandboxPool,
    session_id: str,
    body: ExecRequest,
    call_id: str,
    parent: Context,
    on_output: OutputCallback | None = None,
) -> asyncio.Task[ExecResult]:
    return asyncio.create_task(
        pool.run(
            session_id, body.spec(), tool=body.tool, priority=body.priority, call_id=call_id,
            turn=body.turn, on_output=on_output, trace_parent=parent,
        )
    )  # fmt: skip


async def _exec_until_disconnect(
    pool: SandboxPool, session_id: str, body: ExecRequest, request: Request, parent: Context
) -> ExecResult:
    """Run the call; if the client goes away first, kill it (nobody reads the result)."""
    call_id = body.call_id or new_id()[:16]
    run = _start_call(pool, session_id, body, call_id, parent)
    watch = asyncio.create_task(_wait_disconnect(request))
    try:
        await asyncio.wait({run, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not run.done():
        await pool.interrupt(session_id, call_id)
    return await run


async def _wait_disconnect(request: Request, poll_s: float = 0.25) -> None:
    # Starlette reports a disconnect only when asked; polling is its documented use.
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)


async def _stream_exec(
    pool: SandboxPool, session_id: str, body: ExecRequest, parent: Context
) -> AsyncIterator[str | bytes]:
    """NDJSON: ``{"stream": "stdout", "data": ...}`` per chunk, then ``{"result": ...}``
    (``_result_json``). A client that disconnects closes this generator, which
    interrupts the call."""
    call_id = body.call_id or new_id()[:16]
    chunks: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
    run = _start_call(
        pool, session_id, body, call_id, parent,
        lambda stream, data: chunks.put_nowait((stream, data)),
    )  # fmt: skip
    run.add_done_callback(lambda _: chunks.put_nowait(None))
    try:
        while (item := await chunks.get()) is not None:
            stream, data = item
            yield json.dumps({"stream": stream, "data": data.decode(errors="replace")}) + "\n"
        result = await run
        yield b'{"result": '
        for write in _result_json(result):
            yield write
        yield b"}\n"
    except SandboxError as exc:
        yield json.dumps({"error": str(exc)}) + "\n"
    finally:
        if not run.done():
            await pool.interrupt(session_id, call_id)
            await asyncio.wait({run}, timeout=INTERRUPT_GRACE_S)


def _result_json(result: ExecResult) -> Iterator[bytes]:
    """``result`` as JSON, in writes of ``RESULT_WRITE_BYTES`` or so (one, for most
    results), made a piece of at most ``RESULT_PIECE_CHARS`` characters of its output
    at a time: answering costs a bounded amount of memory beyond the result itself,
    whatever the output. As one string, 16 MiB of NUL bytes would be 96 MiB of JSON
    (``\\u0000`` each), and its bytes as much again."""
    pending = bytearray()
    for part in _result_parts(result):
        pending += part
        if len(pending) >= RESULT_WRITE_BYTES:
            yield bytes(pending)
            pending.clear()
    if pending:
        yield bytes(pending)


def _result_parts(result: ExecResult) -> Iterator[bytes]:
    fields = result.model_dump(mode="json", exclude={"stdout", "stderr"})
    yield json.dumps(fields, separators=(",", ":"))[:-1].encode()  # the output follows
    for name in ("stdout", "stderr"):
        text: str = getattr(result, name)
        yield f',"{name}":"'.encode()
        for start in range(0, len(text), RESULT_PIECE_CHARS):
            piece = json.dumps(text[start : start + RESULT_PIECE_CHARS], ensure_ascii=False)
            yield piece[1:-1].encode()
        yield b'"'
    yield b"}"


def _result_response(result: ExecResult) -> Response:
    """The answer to a call: a plain JSON response when ``result`` fits one write,
    else streamed in writes (``_result_json``)."""
    writes = _result_json(result)
    first = next(writes)
    second = next(writes, None)
    if second is None:
        return Response(first, media_type="application/json")
    return StreamingResponse(
        itertools.chain((first, second), writes), media_type="application/json"
    )


async def _close_when_stopping(pool: SandboxPool, stopping: Callable[[], bool]) -> None:
    """Close the pool (killing its running tools) as soon as ``stopping()`` says the
    server is stopping: a server waits for its requests to end before it shuts the app
    down, and a call ends only when its tool does."""
    while not stopping():
        await asyncio.sleep(STOP_CHECK_S)
    log.info("sandbox service stopping: killing the running tools")
    await pool.close()


def serve_sandbox(app: FastAPI, listener: socket.socket) -> None:
    """Serve ``app`` (``create_sandbox_app``) on ``listener`` (bound and listening:
    ``listening_socket``) under ``guarded_server`` until SIGINT or SIGTERM. Stopping
    closes the pool at once: running tools are killed, queued calls withdrawn, and
    each caller answered ``cancelled``; then the server exits."""
    from agentmars.sdk.http_guard import guarded_server

    host, port = listener.getsockname()[:2]
    server = guarded_server(app, host=host, port=port)
    app.state.stopping = lambda: server.should_exit
    server.run(sockets=[listener])
