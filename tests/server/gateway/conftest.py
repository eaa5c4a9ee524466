"""Real servers on loopback: the scripted OpenAI-compatible engine and a gateway."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from agentmars.server.engines.scripted.app import ScriptedLatency, create_scripted_llm_app
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.web.ingest import EventHub
from agentmars.server.web.serving import serve_in_thread

TOKEN = "gateway-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
MODEL = "scripted"


@dataclass
class ResponseLog:
    """What the engine did with each response: ``started`` counts response starts,
    ``finished`` the ones whose last body part went out (a stream the client
    abandoned starts but never finishes)."""

    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)


class ResponseTracker:
    """ASGI wrapper around the scripted engine recording how its responses ended."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state
        self.log = ResponseLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.log.started.append(path)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.log.finished.append(path)
            await send(message)

        await self.app(scope, receive, tracked)


@dataclass
class Engine:
    url: str
    tracker: ResponseTracker

    @property
    def requests(self) -> list[Any]:
        return list(self.tracker.state.requests)


@pytest.fixture
def engine() -> Iterator[Engine]:
    """The scripted engine; 10 ms per token, so a 64-token stream lasts ~0.65 s."""
    latency = ScriptedLatency(first_token_s=0.02, per_token_s=0.01)
    tracker = ResponseTracker(create_scripted_llm_app(latency, model=MODEL))
    with serve_in_thread(tracker) as url:
        yield Engine(url, tracker)


@dataclass
class Gateway:
    url: str
    app: FastAPI

    @property
    def hub(self) -> EventHub:
        hub: EventHub = self.app.state.gateway.hub
        return hub

    def kinds(self) -> list[str]:
        return [e.kind for e in self.hub.events()]


GatewayFactory = Callable[..., contextlib.AbstractContextManager[Gateway]]


@pytest.fixture
def make_gateway() -> GatewayFactory:
    """``with make_gateway(upstream_url, **GatewayConfig fields) as gw``."""

    @contextlib.contextmanager
    def make(upstream_url: str, **config: Any) -> Iterator[Gateway]:
        app = create_gateway_app(GatewayConfig(upstream_url=upstream_url, token=TOKEN, **config))
        with serve_in_thread(app) as url:
            yield Gateway(url, app)

    return make


@pytest.fixture
def gateway(engine: Engine, make_gateway: GatewayFactory) -> Iterator[Gateway]:
    with make_gateway(engine.url) as gw:
        yield gw
