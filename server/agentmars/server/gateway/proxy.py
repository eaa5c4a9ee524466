"""Forwarding to the engine's OpenAI-compatible API with httpx, streaming or not.

Errors the gateway answers itself carry an OpenAI-style body
(``{"error": {"message", "type", "code"}}``): 400 for a body that is not a JSON
object, 404 for a model the engine does not serve (from its ``/v1/models``, cached
for ``models_ttl_s``), 503 when the engine cannot be reached (the connect timeout is
short, so this comes within a second), 504 when it stops answering. An engine's 4xx
is passed through as is (status and body: vLLM's own message); an engine's 5xx
becomes 502 with the engine's body in the message, so a 500 never comes from here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from agentmars.sdk.integrations.request import SESSION_HEADER
from agentmars.server.gateway.events import CallRecorder, CallStatus
from agentmars.server.gateway.sessions import CallMeta

T = TypeVar("T")
MODELS_TIMEOUT_S = 2.0
FORWARDED_HEADERS = ("authorization", "x-request-id")
"""Client headers the engine may need (its API key, request id); others (host,
lengths, encodings) belong to the client's own connection."""


class GatewayError(Exception):
    """An error the gateway answers itself with ``status`` and ``message``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "code": self.status}}
        return JSONResponse(body, status_code=self.status)


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


def engine_down(base_url: str, exc: Exception) -> GatewayError:
    return GatewayError(
        503, f"the engine at {base_url} is not reachable ({exc!r}); retry later", "unavailable"
    )


class Upstream:
    """The engine behind the gateway: one pooled httpx client and its model list."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 0.5,
        read_timeout_s: float = 600.0,
        models_ttl_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=connect_timeout_s)
        # Every session may hold a stream open: no cap on connections, only on idle ones.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, limits=limits)
        self.models_ttl_s = models_ttl_s
        self._models: tuple[float, httpx.Response] | None = None
        self._ids: set[str] | None = None

    async def aclose(self) -> None:
        await self.client.aclose()

    async def models(self) -> httpx.Response:
        """The engine's ``GET /v1/models`` answer, asked now (a client listing models
        learns whether the engine is up); it refreshes the cache ``model_ids`` reads."""
        try:
            # A short read timeout too: listing models is instant on a healthy engine.
            response = await self.client.get("/v1/models", timeout=MODELS_TIMEOUT_S)
        except httpx.TransportError as exc:
            raise engine_down(self.base_url, exc) from None
        if response.status_code == 200:
            self._models = (time.monotonic(), response)
            self._ids = None
        return response

    async def _cached_models(self) -> httpx.Response:
        if self._models is not None and time.monotonic() - self._models[0] < self.models_ttl_s:
            return self._models[1]
        return await self.models()

    async def model_ids(self) -> set[str]:
        """The ids of the models the engine serves, from an answer at most
        ``models_ttl_s`` old (checked on every completion: no round trip each time)."""
        response = await self._cached_models()
        if self._ids is not None and response.status_code == 200:
            return self._ids  # parsed from the cached answer already
        try:
            ids = {str(m["id"]) for m in response.json()["data"]}
        except (ValueError, KeyError, TypeError):
            raise GatewayError(
                502, f"the engine's /v1/models answer is not a model list: {response.text[:200]}"
            ) from None
        if response.status_code == 200:
            self._ids = ids
        return ids

    async def check_model(self, model: str) -> None:
        """404 unless the engine serves ``model`` (a miss refreshes a stale list once)."""
        if model in await self.model_ids():
            return
        self._models = None
        served = await self.model_ids()
        if model not in served:
            raise GatewayError(
                404,
                f"model {model!r} not found; the engine serves {sorted(served)}",
                "not_found_error",
            )

    async def open(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> httpx.Response:
        """Send a request and return the response with its body still unread."""
        request = self.client.build_request("POST", path, json=body, headers=headers)
        try:
            try:
                return await self.client.send(request, stream=True)
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
                # NOTE: the usual cause is a pooled keep-alive connection the engine closed
                # as we reused it (uvicorn closes one after an app error or when idle):
                # one retry on a fresh connection. At worst the engine computes twice.
                return await self.client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
                raise engine_down(self.base_url, exc) from None
            raise GatewayError(
                504, f"the engine did not answer in time: {exc!r}", "timeout"
            ) from None
        except httpx.TransportError as exc:
            raise engine_down(self.base_url, exc) from None


def forwarded_body(body: Mapping[str, Any], meta: CallMeta, turn: int) -> dict[str, Any]:
    """The request as the engine gets it: session metadata in ``session_id`` and
    ``vllm_xargs`` (0/1 ints: vLLM's extra_args take str / int / float), and an
    explicit ``priority``: the client's, else 0 (vLLM 0.32 orders by it only under
    ``--scheduling-policy priority``; the plugin orders calls by the policy itself).

    A call that named no session goes on naming none: its one-call session ends with
    it, and a session id would let the plugin pin KV that no next call will use."""
    xargs = {
        **(body.get("vllm_xargs") or {}),
        "turn": turn,
        "follows_tool": int(meta.follows_tool),
        "expects_tool": int(meta.expects_tool),
    }
    forwarded = {**body, "vllm_xargs": xargs, "priority": body.get("priority", 0)}
    if not meta.ephemeral:
        xargs["session_id"] = forwarded["session_id"] = meta.session_id
    return forwarded


def forwarded_headers(request: Request, meta: CallMeta) -> dict[str, str]:
    headers = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k)) is not None}
    # identity: the relay parses the SSE bytes it passes on.
    headers["accept-encoding"] = "identity"
    if not meta.ephemeral:  # see forwarded_body
        headers[SESSION_HEADER] = meta.session_id
    return headers


async def unless_disconnected(request: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` unless the client disconnects first (then ``ClientGone``,
    with ``awaitable`` cancelled). Only after the request body has been read."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    if work.done() and not work.cancelled():
        return work.result()
    raise ClientGone()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def upstream_error(response: httpx.Response, content: bytes) -> JSONResponse:
    """The engine's error answer: 4xx as is, 5xx as 502 with the engine's text."""
    if response.status_code < 500:
        try:
            return JSONResponse(json.loads(content), status_code=response.status_code)
        except ValueError:
            message = content.decode(errors="replace")[:2000]
            return GatewayError(response.status_code, message).response()
    text = content.decode(errors="replace")[:2000]
    return GatewayError(
        502, f"the engine failed with HTTP {response.status_code}: {text}", "upstream_error"
    ).response()


class SSEScanner:
    """Reads ``data:`` lines out of relayed SSE bytes for the recorder."""

    def __init__(self, recorder: CallRecorder) -> None:
        self.recorder = recorder
        self._rest = b""

    def feed(self, piece: bytes) -> None:
        *lines, self._rest = (self._rest + piece).split(b"\n")
        for line in lines:
            data = line.strip()
            if not data.startswith(b"data:") or data == b"data: [DONE]":
                continue
            try:
                chunk = json.loads(data[5:])
            except ValueError:
                continue  # not ours to judge: the client gets the bytes as they came
            if isinstance(chunk, dict):
                self.recorder.observe(chunk, chunk=True)


async def relay(
    response: httpx.Response, recorder: CallRecorder, done: Callable[[CallStatus, str | None], None]
) -> AsyncIterator[bytes]:
    """Pass the engine's stream on; ``done(status, error)`` runs at the end whatever
    happens (the client leaving cancels this generator and closes the engine's
    stream, which aborts the request in vLLM)."""
    scanner = SSEScanner(recorder)
    status: CallStatus = "ok"
    error: str | None = None
    try:
        async for piece in response.aiter_raw():
            yield piece
            scanner.feed(piece)
    except (asyncio.CancelledError, GeneratorExit):
        status, error = "cancelled", "the client disconnected"
        raise
    except httpx.HTTPError as exc:
        # The status line went out already: say so in the stream, as vLLM does for
        # its own stream errors (the OpenAI client raises on an "error" chunk). The
        # blank lines first end whatever partial event the engine left behind.
        status, error = "error", f"the engine's stream broke off: {exc!r}"
        payload = {"error": {"message": error, "type": "upstream_error", "code": 502}}
        yield f"\n\ndata: {json.dumps(payload)}\n\n".encode()
    finally:
        done(status, error)
        # Starlette cancels through an anyio scope, which would cancel this await too
        # and leave the engine's request running: shield the close.
        with anyio.CancelScope(shield=True):
            await response.aclose()


class ClosingStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that always closes its body iterator, so a client that
    disconnects between chunks still ends the relay (and the engine's request) now."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
