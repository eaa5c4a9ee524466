"""The engine's routes that are no LLM call, passed through without admission: its
model list, version, health, and tokenizer (``/tokenize``, ``/detokenize``, and
Anthropic's ``/v1/messages/count_tokens``). The engine's status and body come back as
they came (a 5xx as 502, as for every answer of the engine); an engine that cannot be
reached is a 503 (``proxy.engine_down``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from agentmars.server.gateway.proxy import Upstream, forwarded_headers, json_object, passed_back

ASKED: dict[str, str] = {
    "/version": "The engine's version.",
    "/health": "The engine's health (the gateway's own: GET /healthz).",
}
"""GET routes the engine answers at once (``Upstream.ask``: 503 past 2 s)."""
POSTED: dict[str, str] = {
    "/tokenize": "The engine's tokenizer: text or messages to token ids.",
    "/detokenize": "The engine's tokenizer: token ids to text.",
    "/v1/messages/count_tokens": "Anthropic's token count of a Messages request.",
}
"""POST routes with a JSON body, sent on as the client wrote it."""


def _asking(engine: Callable[[], Upstream], path: str) -> Callable[[], Awaitable[Response]]:
    async def ask() -> Response:
        return passed_back(await engine().ask(path))

    return ask


def _posting(engine: Callable[[], Upstream], path: str) -> Callable[[Request], Awaitable[Response]]:
    async def post(request: Request) -> Response:
        raw = await request.body()
        json_object(raw)  # a malformed body is the gateway's 400, like an LLM call's
        return passed_back(await engine().fetch(path, raw, forwarded_headers(request)))

    return post


def passthrough_router(engine: Callable[[], Upstream]) -> APIRouter:
    """The pass-through routes; ``engine()`` is the upstream of the running app."""
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> Response:
        """The engine's model list, asked afresh (it refreshes the list each LLM call's
        model check reads)."""
        return passed_back(await engine().models())

    for path, summary in ASKED.items():
        router.add_api_route(path, _asking(engine, path), methods=["GET"], summary=summary)
    for path, summary in POSTED.items():
        router.add_api_route(path, _posting(engine, path), methods=["POST"], summary=summary)
    return router
