"""The gateway's FastAPI app: OpenAI-compatible pass-through with the policy's
admission in front of the LLM calls (``llm_apis``), the engine's other routes passed
through (``passthrough``), the event hub, the SSE stream and ``/metrics`` (the
operator's series, ``operator_state``, then the engine's own). Any other
route is a 404, a known route's wrong method a 405, both with an OpenAI-style body
that lists the routes served.

``create_gateway_app(GatewayConfig(...))`` builds it; the lifespan opens the aiohttp
session to the engine, subscribes the admission to the hub and runs a periodic
admission pass (idle expiry, policies that open their window on their own clock),
opens the side channel to the scheduler plugin when one is configured
(``plugin_link``), and closes it all at shutdown. Bind it to 127.0.0.1 (the default
of ``main``): completions are not token-protected, event ingest and the event stream
are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from opentelemetry.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from agentmars.sdk.auth import GATEWAY_TOKEN_ENV
from agentmars.sdk.events import MAX_COUNT, AnyEvent, SessionEnd, SessionMove
from agentmars.sdk.http_guard import COMPLETION_BODY_BYTES, RequestGuard, guarded_server
from agentmars.sdk.sinks.otel import tracer_provider_from_env
from agentmars.sdk.wire import TOOL_PRIORITY_HEADER
from agentmars.server.gateway import tracing
from agentmars.server.gateway.admission import Admission
from agentmars.server.gateway.call_meta import (
    BadRequest,
    CallMeta,
    ResponseSessions,
    call_metadata,
)
from agentmars.server.gateway.dashboard import dashboard_router
from agentmars.server.gateway.events import CallRecorder, CallStatus, stream_router
from agentmars.server.gateway.llm_apis import LLM_APIS, LLMApi
from agentmars.server.gateway.metrics import GatewayMetrics, replicas_exposition
from agentmars.server.gateway.operator_state import OperatorState
from agentmars.server.gateway.passthrough import passthrough_router
from agentmars.server.gateway.plugin_link import PluginLink
from agentmars.server.gateway.proxy import (
    CONNECT_TIMEOUT_S,
    GatewayError,
    Upstream,
    exchange,
    forwarded_body,
    forwarded_headers,
    json_object,
    relay,
    stream_usage_to_ask,
    upstream_error,
)
from agentmars.server.gateway.telemetry import KVSource
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.capabilities import Capability, refuse_unless
from agentmars.server.policies.interface import Policy
from agentmars.server.policies.registry import make_policy
from agentmars.server.web.client_watch import ClientGone, ClientWatch, ClosingStreamingResponse
from agentmars.server.web.ingest import (
    DEFAULT_MAX_BODY_BYTES,
    EVENTS_PATH,
    EventHub,
    ingest_router,
    install_error_handlers,
)
from agentmars.server.web.serving import CannotListen, listening_socket

log = logging.getLogger("agentmars.server")
ADMISSION_PASS_S = 0.1
"""How often admission runs without an event (idle expiry, time-driven windows)."""
MAX_BODY_BYTES = COMPLETION_BODY_BYTES
"""A request body's limit (413 past it, counted as it arrives), but for ``POST
/v1/events`` (``web/ingest.py``'s ``DEFAULT_MAX_BODY_BYTES``)."""


@dataclass
class GatewayConfig:
    """How to run a gateway."""

    upstream_url: str
    """The engine's base URL (``http://127.0.0.1:8000``), without ``/v1``."""
    token: str
    """Bearer token for ``POST /v1/events`` and ``GET /v1/events/stream``."""
    policy: str = "fcfs"
    """Registry name of the policy (``policies/registry.py``)."""
    policy_settings: dict[str, Any] = field(default_factory=dict)
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    read_timeout_s: float = 600.0
    models_ttl_s: float = 5.0
    session_idle_s: float = 300.0
    """A session with no LLM call in flight and no tool queued or running for this
    long is ended (docs/gateway.md "Seats"); its seat goes back well before."""
    block_size: int = 16
    tool_cores: int | None = None
    """Cores for tools (None: all of this host's)."""
    kv_source: KVSource | None = None
    """KV statistics (None: the plugin's, with ``plugin_kv_address``, else the newest
    ``kv_stats`` event of the stream)."""
    plugin_kv_address: str | None = None
    """The plugin's KV figures' ZMQ PUB address (its ``AGENTMARS_KV_STATUS_ADDR``)."""
    plugin_hints_address: str | None = None
    """The plugin's ZMQ PULL address for the stream's events (``AGENTMARS_HINTS_ADDR``)."""
    tracer_provider: TracerProvider | None = None
    """Where the gateway's spans go (``tracing``); None: a provider of its own built
    from the ``OTEL_EXPORTER_OTLP_*`` variables, or no spans without them."""
    model_name: str = ""
    """The served model's name, the ``model_name`` label of ``/metrics`` ("": the
    engine's, from its ``/v1/models`` when the gateway starts or, if the engine does
    not answer then, when it is first scraped)."""
    more_replicas: tuple[EngineReplica, ...] = ()
    """Engine replicas 1, 2, ... (replica 0 is ``upstream_url`` with the ``plugin_*``
    addresses), all serving the same model: the policy's ``place`` puts each session on
    one for its whole life (session affinity), its calls go there and its events to
    that replica's plugin."""

    def replicas(self) -> list[EngineReplica]:
        first = EngineReplica(self.upstream_url, self.plugin_kv_address, self.plugin_hints_address)
        return [first, *self.more_replicas]


@dataclass(frozen=True)
class EngineReplica:
    """One engine behind the gateway: its base URL and its plugin's side channel."""

    url: str
    kv_address: str | None = None
    hints_address: str | None = None


@dataclass
class Gateway:
    """The services behind the routes (``app.state.gateway``)."""

    config: GatewayConfig
    hub: EventHub
    admission: Admission
    operator: OperatorState
    """The operator's view (``/metrics`` and the dashboard read it)."""
    metrics: GatewayMetrics
    upstreams: list[Upstream] = field(default_factory=list)
    """The engine replicas, in ``config.replicas()`` order (made by the lifespan)."""
    links: list[PluginLink | None] = field(default_factory=list)
    """Each replica's side channel to its scheduler plugin, if configured."""
    answers: ResponseSessions = field(default_factory=ResponseSessions)
    """The session of each answer a later call may continue (the Responses API's
    ``previous_response_id``)."""
    stopping: Callable[[], bool] = lambda: False
    """True once the server shuts down: open event streams then end (whoever runs
    the app sets it, e.g. to ``lambda: server.should_exit`` for a uvicorn server)."""

    @property
    def engine(self) -> Upstream:
        """Replica 0: the one that answers what is no LLM call (models, tokenize...)."""
        assert self.upstreams, "the gateway's lifespan has not started"
        return self.upstreams[0]

    def engine_of(self, session_id: str) -> Upstream:
        """The replica the session was placed on."""
        return self.upstreams[self.admission.replica_of(session_id)]

    def forward(self, events: Sequence[AnyEvent]) -> None:
        """Send events to the plugins: a placed session's to its replica's (but its
        end, which every replica that heard of it must learn), the others to all; a
        move, as the session's end, to the replica it left."""
        if len(self.links) == 1:
            if self.links[0] is not None:
                self.links[0].forward(events)
            return
        routed: list[list[AnyEvent]] = [[] for _ in self.links]
        for event in events:
            if isinstance(event, SessionMove):
                routed[event.from_replica].append(_ended_by_move(event))
                continue
            index = self.admission.placed.get(getattr(event, "session_id", ""))
            for i, batch in enumerate(routed):
                if index is None or i == index or isinstance(event, SessionEnd):
                    batch.append(event)
        for link, batch in zip(self.links, routed, strict=True):
            if link is not None and batch:
                link.forward(batch)


def _ended_by_move(move: SessionMove) -> SessionEnd:
    """What the replica a session left hears: that it ended there (its pins, CPU-tier
    copies and the policy's state of it dropped)."""
    error = f"moved to replica {move.to_replica}"
    return SessionEnd(session_id=move.session_id, error=error, source="gateway")


def _build_gateway(config: GatewayConfig, hub: EventHub, policy: Policy | None) -> Gateway:
    """The gateway's services; refuses (``PolicyRefused``) a policy whose admission half
    needs what this gateway cannot give it."""
    replicas = config.replicas()
    _check_replicas(config, replicas)
    policy = policy or make_policy(config.policy, **config.policy_settings)
    half = policy.admission()
    provides = {Capability.TOOL_FIGURES, Capability.AGENT_INSTANCE}
    if config.kv_source is not None or config.plugin_kv_address:
        provides.add(Capability.KV_FIGURES)
    refuse_unless(policy.name, half.needs, provides, "the gateway")
    links = [
        PluginLink(
            kv_address=replica.kv_address,
            hints_address=replica.hints_address,
            on_events=hub.publish,
        )
        if replica.kv_address or replica.hints_address
        else None
        for replica in replicas
    ]
    kv_sources = None
    if config.kv_source is not None:
        kv_sources = [config.kv_source.kv_stats]
    elif config.plugin_kv_address:
        kv_sources = [link.kv_stats for link in links if link is not None]
    half.publish = lambda event: hub.publish([event])
    view = StreamAdmissionView(
        clock=time.monotonic,
        block_size=config.block_size,
        tool_cores=config.tool_cores if config.tool_cores is not None else os.cpu_count() or 1,
        kv_sources=kv_sources,
        replicas=len(replicas),
    )
    admission = Admission(
        half,
        view,
        policy_name=policy.name,
        session_idle_s=config.session_idle_s,
        publish=hub.publish,
    )
    operator = OperatorState(admission, config.model_name)
    return Gateway(config, hub, admission, operator, GatewayMetrics(operator), links=links)


def _check_replicas(config: GatewayConfig, replicas: Sequence[EngineReplica]) -> None:
    """Several replicas: each with its own side channel or none with one, and the KV
    figures from the side channels (one ``kv_source`` cannot speak for them all)."""
    if len(replicas) == 1:
        return
    if config.kv_source is not None:
        raise ValueError("a kv_source gives one engine's KV figures: not for several replicas")
    for name in ("kv_address", "hints_address"):
        given = [getattr(replica, name) is not None for replica in replicas]
        if any(given) and not all(given):
            raise ValueError(f"some replicas have a plugin {name} and some not: give all or none")


def _on_events(gateway: Gateway, events: Sequence[AnyEvent]) -> None:
    for event in events:
        gateway.operator.observe(event)
    # To the plugins first: a session's end in this batch unplaces it at the admission.
    gateway.forward(events)
    gateway.admission.on_events(events)


async def _admission_passes(admission: Admission) -> None:
    while True:
        await asyncio.sleep(ADMISSION_PASS_S)
        try:
            admission.admit()
        except Exception:  # a failing policy must not stop the passes for good
            log.exception("agentmars admission pass failed (policy %s)", admission.policy_name)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    gateway: Gateway = app.state.gateway
    config = gateway.config
    gateway.upstreams = [
        Upstream(
            replica.url,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
            models_ttl_s=config.models_ttl_s,
        )
        for replica in config.replicas()
    ]
    loop = asyncio.get_running_loop()

    # Hub subscribers run on the publishing thread (ingest uses a worker thread): the
    # policy and the admission live on the event loop only.
    def to_loop(events: Sequence[AnyEvent]) -> None:
        loop.call_soon_threadsafe(_on_events, gateway, events)

    for link in gateway.links:
        if link is not None:
            link.start()
    unsubscribe = gateway.hub.subscribe(to_loop)
    passes = asyncio.create_task(_admission_passes(gateway.admission))
    try:
        await _learn_model_name(gateway)
        yield
    finally:
        passes.cancel()
        unsubscribe()
        for upstream in gateway.upstreams:
            await upstream.aclose()
        for link in gateway.links:
            if link is not None:
                link.close()


async def _learn_model_name(gateway: Gateway) -> None:
    """Name the served model after the engine's model list, unless it has a name (the
    first in sorted order if the engine serves several: ``--model-name`` chooses)."""
    if gateway.operator.model_name:
        return
    with contextlib.suppress(GatewayError):  # the engine is not up: ask again next time
        if served := await gateway.engine.model_ids():
            gateway.operator.model_name = min(served)


async def _engine_metrics(engine: Upstream) -> bytes | None:
    """The engine's Prometheus text, None if it gives none now (it is down, or answers
    another format)."""
    try:
        answer = await engine.ask("/metrics")
    except GatewayError:
        return None
    if answer.status != 200 or not (answer.content_type or "").startswith("text/plain"):
        return None
    return answer.content if answer.content.endswith(b"\n") else answer.content + b"\n"


async def _engines_metrics(gateway: Gateway) -> tuple[bytes, bool]:
    """The replicas' series (labelled by replica when there are several), and whether
    every replica gave its own."""
    texts = await asyncio.gather(*(_engine_metrics(engine) for engine in gateway.upstreams))
    all_up = all(text is not None for text in texts)
    if len(texts) == 1:
        return texts[0] or b"", all_up
    try:
        merged = replicas_exposition([None if t is None else t.decode() for t in texts])
    except ValueError:  # an engine's text the parser cannot read: leave theirs out
        log.exception("agentmars: the replicas' /metrics could not be merged")
        return b"", False
    return merged, all_up


async def _json_body(request: Request) -> dict[str, Any]:
    body = json_object(await request.body())
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise GatewayError(400, "'model' must be a string")
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_COUNT:
        raise GatewayError(
            400, f"'priority' must be an integer from -2**53 to 2**53, got {priority!r:.80}"
        )
    return body


async def _complete(gateway: Gateway, request: Request, api: LLMApi) -> Response:
    body = await _json_body(request)
    try:
        meta = call_metadata(request.headers, body, api, gateway.answers)
    except BadRequest as exc:
        raise GatewayError(400, str(exc)) from None
    model = body.get("model") if isinstance(body.get("model"), str) else None
    tracing.call_known(meta, api.operation(body), model)
    if model is not None:
        await gateway.engine.check_model(model)
    with ClientWatch(request) as watch:
        arrived = time.monotonic()
        try:
            turn = await watch.unless_gone(gateway.admission.enter(meta))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client is gone
        tracing.admitted(gateway.admission.policy_name, turn, time.monotonic() - arrived)
        return await _forward(gateway, request, watch, api, body, meta, turn)


async def _forward(
    gateway: Gateway,
    request: Request,
    watch: ClientWatch,
    api: LLMApi,
    body: dict[str, Any],
    meta: CallMeta,
    turn: int,
) -> Response:
    recorder = CallRecorder(gateway.hub, meta, turn, body, api)
    if api.continues_field is not None and not meta.ephemeral:
        recorder.on_response_id = lambda response_id: gateway.answers.remember(
            response_id, meta.session_id
        )

    def done(status: CallStatus, error: str | None, http_status: int | None = None) -> None:
        tracing.call_ended(recorder.end(status, error), http_status)
        gateway.admission.leave(meta.session_id, session_over=status == "cancelled")

    ask_usage = stream_usage_to_ask(api, body)
    call = exchange(
        gateway.engine_of(meta.session_id),
        api.path,
        forwarded_body(body, meta, turn, ask_usage=ask_usage),
        forwarded_headers(request, meta),
        stream=bool(body.get("stream")),
    )
    try:
        response, answer = await watch.unless_gone(call)
    except ClientGone:
        done("cancelled", "the client disconnected")
        return Response(status_code=499)
    except GatewayError as exc:
        done("error", exc.message, exc.status)
        raise
    headers = {TOOL_PRIORITY_HEADER: str(_tool_priority(gateway, meta))}
    if answer is None:
        return ClosingStreamingResponse(
            relay(response, recorder, done, drop_usage=ask_usage),
            status_code=response.status,
            headers=headers,
            media_type=response.headers.get("content-type", "text/event-stream"),
        )
    if answer.status >= 400:
        done("error", answer.content.decode(errors="replace")[:500], answer.status)
        error = upstream_error(answer)
        error.headers.update(headers)
        return error
    # A success body that is not a JSON object still reaches the client as it came.
    with contextlib.suppress(ValueError, AttributeError):
        recorder.observe(json.loads(answer.content), chunk=False)
    done("ok", None)
    return Response(
        answer.content, status_code=answer.status, headers=headers, media_type="application/json"
    )


def _tool_priority(gateway: Gateway, meta: CallMeta) -> int:
    """The admission half's priority for the session's tool calls, for the client to
    pass to the sandbox pool (0, FIFO, when the policy fails: the answer must still
    reach the client, and its call must still end)."""
    try:
        return int(gateway.admission.half.tool_priority(meta.session_id))
    except Exception:
        log.exception("agentmars tool_priority failed (policy %s)", gateway.admission.policy_name)
        return 0


def _body_schema(required: str) -> dict[str, Any]:
    """The request body in the OpenAPI document: the fields the gateway reads; the
    rest of the OpenAI body is the engine's to judge (the routes read raw JSON, so a
    body the engine rejects gets the engine's own message)."""
    message = {
        "type": "object",
        "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
        "required": ["role"],
    }
    name = {"type": "string", "maxLength": 256}
    xargs = {
        "type": "object",
        "properties": {
            "session_id": {"type": "string"},
            "call_id": {"type": "string"},
            "turn": {"type": "integer", "minimum": 0},
            "follows_tool": {"type": "integer", "enum": [0, 1]},
            "expects_tool": {"type": "integer", "enum": [0, 1]},
            "next_tool": {**name, "minLength": 1},
            "expected_tool_s": {"type": "number", "minimum": 0},
            "agent": name,
            "task_id": {"type": "string"},
        },
    }
    schema = {
        "type": "object",
        "properties": {
            "model": {"type": "string"},
            "messages": {"type": "array", "items": message},
            "prompt": {"type": "string"},
            "max_tokens": {"type": "integer", "minimum": 1},
            "stream": {"type": "boolean"},
            "session_id": {"type": "string"},
            "prompt_cache_key": {"type": "string"},
            "program_id": {"type": "string"},
            "priority": {"type": "integer"},
            "vllm_xargs": xargs,
        },
        "required": ["model", required],
    }
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _llm_call(gateway: Gateway, api: LLMApi) -> Callable[[Request], Awaitable[Response]]:
    async def call(request: Request) -> Response:
        return await _complete(gateway, request, api)

    return call


def _routes(app: FastAPI, gateway: Gateway) -> None:
    for api in LLM_APIS:
        app.add_api_route(
            api.path,
            _llm_call(gateway, api),
            methods=["POST"],
            summary=api.summary,
            openapi_extra=_body_schema(api.prompt_field),
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus metrics: the gateway's (``agentmars_*``), then the engine's."""
        await _learn_model_name(gateway)
        engines, all_up = await _engines_metrics(gateway)
        # On the event loop, as the fold it reads: no other code runs in between.
        gateway.metrics.collector.engine_up = all_up
        own = generate_latest(gateway.metrics.registry)
        return Response(own + engines, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        """The gateway is up (says nothing of the engine)."""
        return {"status": "ok", "events": gateway.hub.count}


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    if exc.status >= 500:  # the engine's trouble, not the client's: the operator's to see
        log.warning("%s %s: %d %s", request.method, request.url.path, exc.status, exc.message)
    return exc.response()


def _served(app: FastAPI) -> str:
    """The routes of the app's OpenAPI document (built once, then cached by FastAPI)."""
    paths = app.openapi()["paths"]
    routes = sorted((path, method.upper()) for path, methods in paths.items() for method in methods)
    return ", ".join(f"{method} {path}" for path, method in routes)


def _route_errors(app: FastAPI) -> None:
    """A route the gateway does not serve, or a method a route does not take, gets an
    OpenAI-style error naming the routes served (FastAPI's own is a bare
    ``{"detail": "Not Found"}``, which an OpenAI client reports as an unknown error)."""

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app.router.not_found(scope, receive, send)
            return
        message = f"no route {scope['method']} {scope['path']}; supported routes: {_served(app)}"
        error = GatewayError(404, message, code="route_not_found")
        await error.response()(scope, receive, send)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code != 405:  # the event routes' 401 and 429: FastAPI's own body
            return await http_exception_handler(request, exc)
        message = (
            f"{request.url.path} does not take {request.method}; supported routes: {_served(app)}"
        )
        error = GatewayError(405, message, code="method_not_allowed", headers=exc.headers)
        return error.response()

    # Only a request no route matches reaches the router's default: a route's own 404
    # (an unknown model) keeps its message.
    app.router.default = not_found
    app.add_exception_handler(HTTPException, not_allowed)


def create_gateway_app(
    config: GatewayConfig, *, hub: EventHub | None = None, policy: Policy | None = None
) -> FastAPI:
    """The gateway app (``policy``: an object to use instead of ``config.policy``)."""
    gateway = _build_gateway(config, hub or EventHub(), policy)
    app = FastAPI(title="agentmars gateway", lifespan=_lifespan)
    app.state.gateway = gateway
    _routes(app, gateway)
    app.include_router(passthrough_router(lambda: gateway.engine))
    app.include_router(ingest_router(gateway.hub, config.token))
    app.include_router(stream_router(gateway.hub, config.token, lambda: gateway.stopping()))
    app.include_router(
        dashboard_router(gateway.operator.snapshot, config.token, lambda: gateway.stopping())
    )
    install_error_handlers(app)
    app.add_exception_handler(GatewayError, _gateway_error)
    _route_errors(app)
    _trace_calls(app, config.tracer_provider, gateway.hub)
    app.add_middleware(RequestGuard, max_body_bytes=body_limit)
    return app


def _trace_calls(app: FastAPI, given: TracerProvider | None, hub: EventHub) -> None:
    """Trace the LLM calls and the engine's KV pins (``tracing``) with the given
    provider, else one of the gateway's own from the environment (shut down with the
    app), if it asks for one."""
    routes = [api.path for api in LLM_APIS]
    if given is not None:
        app.add_middleware(tracing.CallTracing, tracer_provider=given, routes=routes, hub=hub)
    elif (own := tracer_provider_from_env(tracing.SERVICE_NAME)) is not None:
        app.add_middleware(
            tracing.CallTracing,
            tracer_provider=own,
            routes=routes,
            hub=hub,
            shutdown=own.shutdown,
        )


def body_limit(path: str) -> int:
    """The body limit of a request to ``path``."""
    return DEFAULT_MAX_BODY_BYTES if path == EVENTS_PATH else MAX_BODY_BYTES


def run_gateway(app: FastAPI, listener: socket.socket) -> None:
    """Serve a gateway app with uvicorn on ``listener`` (``listening_socket``) until
    SIGINT or SIGTERM (a ``guarded_server``: slow clients time out); open event streams
    end when it stops."""
    host, port = listener.getsockname()[:2]
    server = guarded_server(app, host=host, port=port)
    app.state.gateway.stopping = lambda: server.should_exit
    server.run(sockets=[listener])


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentmars.server.gateway.app``: a gateway process. The token comes
    from the environment, not the command line, where ``ps`` shows it."""
    import argparse
    import os

    parser = argparse.ArgumentParser(
        prog="python -m agentmars.server.gateway.app", description=main.__doc__
    )
    parser.add_argument("--upstream", required=True, help="the engine's base URL")
    parser.add_argument("--policy", default="fcfs", help="registry name of the policy")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback default)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--block-size", type=int, default=16, help="the engine's KV block size in tokens"
    )
    parser.add_argument(
        "--plugin-kv-addr", help="the plugin's AGENTMARS_KV_STATUS_ADDR (its KV figures)"
    )
    parser.add_argument(
        "--plugin-hints-addr", help="the plugin's AGENTMARS_HINTS_ADDR (events to it)"
    )
    parser.add_argument(
        "--model-name", default="", help="the served model's name on /metrics (the engine's)"
    )
    args = parser.parse_args(argv)
    token = os.environ.get(GATEWAY_TOKEN_ENV, "")
    if not token:
        parser.error(f"set {GATEWAY_TOKEN_ENV} to the token event senders must present")
    if args.block_size < 1:
        parser.error("--block-size must be positive")
    config = GatewayConfig(
        upstream_url=args.upstream,
        token=token,
        policy=args.policy,
        block_size=args.block_size,
        plugin_kv_address=args.plugin_kv_addr,
        plugin_hints_address=args.plugin_hints_addr,
        model_name=args.model_name,
    )
    try:
        app = create_gateway_app(config)
    except ValueError as exc:  # an unknown policy, a bad token: say which
        parser.error(str(exc))
    try:
        listener = listening_socket(args.host, args.port)
    except CannotListen as exc:
        parser.error(f"cannot listen on {args.host}:{args.port}: {exc}")
    run_gateway(app, listener)


if __name__ == "__main__":
    main()
