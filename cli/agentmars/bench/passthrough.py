"""A bare pass-through proxy for ``POST /v1/completions``: the gateway's server stack
(uvicorn, FastAPI, an aiohttp session to the engine) and nothing else, as the baseline
of what one more HTTP hop costs on this machine (``agentmars bench gateway``); with
``--client httpx``, the same over httpx's async client (``agentmars bench hop``)::

    python -m agentmars.bench.passthrough --upstream http://127.0.0.1:8000 --port 8081
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from agentmars.sdk.http_guard import COMPLETION_BODY_BYTES, RequestGuard, guarded_server

JSON = {"content-type": "application/json"}
Forward = Callable[[bytes], Awaitable[tuple[int, bytes]]]
"""Post a request body to the engine's /v1/completions: its status and body."""


@contextlib.asynccontextmanager
async def _aiohttp_forward(upstream: str) -> AsyncIterator[Forward]:
    async with aiohttp.ClientSession(upstream) as session:

        async def forward(body: bytes) -> tuple[int, bytes]:
            async with session.post("/v1/completions", data=body, headers=JSON) as answer:
                return answer.status, await answer.read()

        yield forward


@contextlib.asynccontextmanager
async def _httpx_forward(upstream: str) -> AsyncIterator[Forward]:
    async with httpx.AsyncClient(base_url=upstream, timeout=60.0) as client:

        async def forward(body: bytes) -> tuple[int, bytes]:
            answer = await client.post("/v1/completions", content=body, headers=JSON)
            return answer.status_code, answer.content

        yield forward


CLIENTS = {"aiohttp": _aiohttp_forward, "httpx": _httpx_forward}
"""The gateway's client to the engine (aiohttp), and httpx's async client it replaced
(``agentmars bench hop`` compares them)."""


def create_passthrough_app(upstream: str, client: str = "aiohttp") -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with CLIENTS[client](upstream) as forward:
            app.state.forward = forward
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        status, content = await request.app.state.forward(await request.body())
        return Response(content, status, media_type="application/json")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentmars.bench.passthrough")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client", choices=sorted(CLIENTS), default="aiohttp")
    args = parser.parse_args(argv)
    app = create_passthrough_app(args.upstream, args.client)
    # The gateway's server stack: its guard against big bodies and slow clients too.
    app.add_middleware(RequestGuard, max_body_bytes=COMPLETION_BODY_BYTES)
    guarded_server(app, host="127.0.0.1", port=args.port).run()


if __name__ == "__main__":
    main()
