"""A bare pass-through proxy for ``POST /v1/completions``: the gateway's server stack
(uvicorn, FastAPI, an aiohttp session to the engine) and nothing else, as the baseline
of what one more HTTP hop costs on this machine (``agentmars bench gateway``)::

    python -m agentmars.bench.passthrough --upstream http://127.0.0.1:8000 --port 8081
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Sequence

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response


def create_passthrough_app(upstream: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(upstream) as session:
            app.state.session = session
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        async with request.app.state.session.post(
            "/v1/completions",
            data=await request.body(),
            headers={"content-type": "application/json"},
        ) as answer:
            return Response(await answer.read(), answer.status, media_type="application/json")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentmars.bench.passthrough")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    app = create_passthrough_app(args.upstream)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
