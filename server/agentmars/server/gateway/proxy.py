"""Forwarding to the engine's OpenAI-compatible API with aiohttp, streaming or not.

NOTE: ours, against the issue's "FastAPI + httpx": the upstream client is aiohttp's.
httpx's async client costs 0.7-1.2 ms more per forwarded call than aiohttp's on the
same server stack (``agentmars bench hop``, docs/benchmarks.md; encode/httpx#3215),
too much of the gateway's 2 ms budget. The rest of the project keeps httpx.

Errors the gateway answers itself carry an OpenAI-style body
(``{"error": {"message", "type", "param", "code"}}``): 400 for a body that is not a JSON
object, 404 for a model the engine does not serve (from its ``/v1/models``, cached
for ``models_ttl_s``), 503 when the engine cannot be reached (at once when its host
refuses the connection, after ``CONNECT_TIMEOUT_S`` when nothing answers), 504 when it
stops answering. An engine's 4xx
is passed through as is (status and body: vLLM's own message); an engine's 5xx
becomes 502 with the engine's body in the message, so a 500 never comes from here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import propagate

from agentmars.sdk.wire import SESSION_HEADER
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.gateway.events import CallRecorder, CallStatus
from agentmars.server.gateway.llm_apis import LLMApi
from agentmars.server.web.json_body import BadBody
from agentmars.server.web.json_body import json_object as read_json_object

CONNECT_TIMEOUT_S = 3.0
"""Our choice: long enough to outlast one lost SYN (Linux resends it after 1 s) and a
pause of this process (a garbage collection) between connecting and the timer's check,
short enough that an engine host that stopped answering is reported within seconds. An
engine that is down on a host that is up refuses the connection: a 503 at once."""
INFO_TIMEOUT_S = 2.0
"""For a whole answer to ``GET /v1/models``, ``/version``, ``/health``: instant on a
healthy engine, so a hung one is reported within seconds."""
FORWARDED_HEADERS = ("authorization", "x-request-id", "traceparent", "tracestate")
"""Client headers the engine may need (its API key, request id, the caller's trace
context); others (host, lengths, encodings) belong to the client's own connection."""
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
"""How a pooled keep-alive connection the engine closed shows when it is reused."""
BROKEN_ANSWER = (aiohttp.ClientError, TimeoutError)
"""What reading an answer's body can raise: the engine went away or stopped sending."""


class GatewayError(Exception):
    """An error the gateway answers itself with ``status`` and ``message``."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code  # None: the status, as vLLM's own errors give it
        self.headers = headers

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": None}
        body = {"error": {**error, "code": self.code or self.status}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def engine_down(base_url: str, exc: BaseException) -> GatewayError:
    return GatewayError(
        503, f"the engine at {base_url} is not reachable ({exc!r}); retry later", "unavailable"
    )


@dataclass(frozen=True)
class Answer:
    """A whole answer of the engine: its status, body and content type."""

    status: int
    content: bytes
    content_type: str | None = None


class Upstream:
    """The engine behind the gateway: one pooled aiohttp session and its model list.
    Made inside the running event loop (aiohttp binds its session to it)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = 600.0,
        models_ttl_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # Every session may hold a stream open: no cap on connections.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=read_timeout_s
        )
        # auto_decompress off: the relay passes the engine's bytes on as they came.
        self.session = aiohttp.ClientSession(
            self.base_url, connector=connector, timeout=self._timeout, auto_decompress=False
        )
        self.models_ttl_s = models_ttl_s
        self._models: tuple[float, Answer] | None = None
        self._ids: set[str] | None = None

    async def aclose(self) -> None:
        await self.session.close()

    async def ask(self, path: str) -> Answer:
        """The engine's answer to ``GET path``, a route it answers at once (503 unless
        it does within ``INFO_TIMEOUT_S``)."""
        timeout = aiohttp.ClientTimeout(total=INFO_TIMEOUT_S)
        # identity: the answer goes on without the engine's content-encoding header (a
        # Prometheus /metrics gzips for a client that accepts it, as aiohttp's does).
        headers = {"accept-encoding": "identity"}
        try:
            async with self.session.get(path, timeout=timeout, headers=headers) as response:
                return Answer(
                    response.status, await response.read(), response.headers.get("content-type")
                )
        except BROKEN_ANSWER as exc:
            raise engine_down(self.base_url, exc) from None

    async def models(self) -> Answer:
        """The engine's ``GET /v1/models`` answer, asked now (a client listing models
        learns whether the engine is up); it refreshes the cache ``model_ids`` reads."""
        answer = await self.ask("/v1/models")
        if answer.status == 200:
            self._models = (time.monotonic(), answer)
            self._ids = None
        return answer

    async def _cached_models(self) -> Answer:
        if self._models is not None and time.monotonic() - self._models[0] < self.models_ttl_s:
            return self._models[1]
        return await self.models()

    async def model_ids(self) -> set[str]:
        """The ids of the models the engine serves, from an answer at most
        ``models_ttl_s`` old (checked on every completion: no round trip each time)."""
        answer = await self._cached_models()
        if self._ids is not None and answer.status == 200:
            return self._ids  # parsed from the cached answer already
        try:
            ids = {str(m["id"]) for m in json.loads(answer.content)["data"]}
        except (ValueError, KeyError, TypeError):
            text = answer.content.decode(errors="replace")[:200]
            raise GatewayError(
                502, f"the engine's /v1/models answer is not a model list: {text}"
            ) from None
        if answer.status == 200:
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
        self, path: str, body: dict[str, Any] | bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """POST ``body`` (bytes: JSON sent on as the client wrote it) and return the
        response with its body still unread."""
        send: dict[str, Any]
        if isinstance(body, bytes):
            send = {"data": body, "headers": {**headers, "content-type": "application/json"}}
        else:
            send = {"json": body, "headers": headers}
        try:
            try:
                return await self.session.post(path, **send)
            except aiohttp.ClientConnectorError:
                raise  # nothing listens: no retry
            except STALE_CONNECTION:
                # NOTE: the usual cause is a pooled keep-alive connection the engine closed
                # as we reused it (uvicorn closes one after an app error or when idle):
                # one retry on a fresh connection. At worst the engine computes twice.
                return await self.session.post(path, **send)
        except aiohttp.ConnectionTimeoutError as exc:  # before TimeoutError: a subclass
            raise engine_down(self.base_url, exc) from None
        except TimeoutError:  # aiohttp.SocketTimeoutError: no answer within sock_read
            raise GatewayError(
                504,
                f"the engine did not answer in {self._timeout.sock_read:g} s",
                "timeout",
            ) from None
        except aiohttp.ClientError as exc:  # refused, no such host, dropped twice
            raise engine_down(self.base_url, exc) from None

    async def fetch(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        """The engine's whole answer to a POST that is no LLM call (``/tokenize``...)."""
        return await read_whole(await self.open(path, body, headers))


async def exchange(
    upstream: Upstream, path: str, body: dict[str, Any], headers: dict[str, str], *, stream: bool
) -> tuple[aiohttp.ClientResponse, Answer | None]:
    """Send a call: the engine's response and, unless it is a stream to relay, its whole
    answer (the connection then back to the pool; closed if this is cancelled, which
    aborts the request in the engine)."""
    response = await upstream.open(path, body, headers)
    if stream and response.status < 400:
        return response, None
    return response, await read_whole(response)


async def read_whole(response: aiohttp.ClientResponse) -> Answer:
    """``response``'s whole answer; its connection back to the pool, or closed if
    reading breaks off or is cancelled (which aborts the request in the engine)."""
    complete = False
    try:
        content = await response.read()
        complete = True
    except BROKEN_ANSWER as exc:
        raise GatewayError(
            502, f"the engine's answer broke off: {exc!r}", "upstream_error"
        ) from None
    finally:
        finish(response, complete=complete)
    return Answer(response.status, content, response.headers.get("content-type"))


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (400 otherwise; 413 past
    ``json_body``'s bounds)."""
    try:
        return read_json_object(raw)
    except BadBody as exc:
        raise GatewayError(exc.status, str(exc)) from None


def forwarded_body(
    body: Mapping[str, Any], meta: CallMeta, turn: int, *, ask_usage: bool = False
) -> dict[str, Any]:
    """The request as the engine gets it: session metadata in ``session_id`` and
    ``vllm_xargs`` (the call id always, the hints the client gave, 0/1 ints: vLLM's
    extra_args take str / int / float), an explicit ``priority``: the client's,
    else 0 (vLLM 0.32 orders by it only under ``--scheduling-policy priority``; the
    plugin orders calls by the policy itself), and (``ask_usage``) the stream's usage
    asked for, which the client did not (``stream_usage_to_ask``).

    A call that named no session goes on naming none: its one-call session ends with
    it, and a session id would let the plugin pin KV that no next call will use.
    ``program_id`` is dropped: it is not an OpenAI field (an engine may refuse it) and
    the session it named travels as ``session_id``."""
    xargs = {
        **(body.get("vllm_xargs") or {}),
        **meta.hints(),
        "call_id": meta.call_id,
        "turn": turn,
        "follows_tool": int(meta.follows_tool),
        "expects_tool": int(meta.expects_tool),
    }
    forwarded = {k: v for k, v in body.items() if k != "program_id"}
    forwarded.update(vllm_xargs=xargs, priority=body.get("priority", 0))
    if ask_usage:
        forwarded["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    if not meta.ephemeral:
        xargs["session_id"] = forwarded["session_id"] = meta.session_id
    return forwarded


def stream_usage_to_ask(api: LLMApi, body: Mapping[str, Any]) -> bool:
    """Whether the gateway asks the engine for a streamed call's usage the client did
    not ask for: every policy that reads a call's tokens from its ``llm_end`` (MARS's
    working set and prefill rate, Justitia's and VTC's costs, Continuum's miss test)
    needs them, and an OpenAI stream reports them only when asked. The client's stream
    is relayed without the usage chunk (``SSEScanner``), as it asked. A
    ``stream_options`` that is not an object is the engine's to refuse."""
    options = body.get("stream_options")
    return (
        body.get("stream") is True
        and (options is None or isinstance(options, dict))
        and api.asks_stream_usage(body) is False
    )


def forwarded_headers(request: Request, meta: CallMeta | None = None) -> dict[str, str]:
    """The client's headers the engine gets, and the session of an LLM call's ``meta``.
    When the gateway traces the call (``tracing``), the trace context is its span's,
    so the engine's spans are the gateway's children; else the caller's goes on."""
    headers = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k)) is not None}
    propagate.inject(headers)
    # identity: the relay parses the SSE bytes it passes on, and the client gets the
    # engine's bytes without its content-encoding header.
    headers["accept-encoding"] = "identity"
    if meta is not None and not meta.ephemeral:  # see forwarded_body
        headers[SESSION_HEADER] = meta.session_id
    return headers


def upstream_error(answer: Answer) -> JSONResponse:
    """The engine's error answer: 4xx as is, 5xx as 502 with the engine's text."""
    if answer.status < 500:
        try:
            return JSONResponse(json.loads(answer.content), status_code=answer.status)
        except ValueError:
            message = answer.content.decode(errors="replace")[:2000]
            return GatewayError(answer.status, message).response()
    text = answer.content.decode(errors="replace")[:2000]
    return GatewayError(
        502, f"the engine failed with HTTP {answer.status}: {text}", "upstream_error"
    ).response()


def passed_back(answer: Answer) -> Response:
    """The engine's answer to a request that is no LLM call: as it came, but a 5xx as
    502 (``upstream_error``)."""
    if answer.status >= 500:
        return upstream_error(answer)
    return Response(answer.content, status_code=answer.status, media_type=answer.content_type)


class SSEScanner:
    """Reads ``data:`` lines out of relayed SSE bytes for the recorder, and says what
    to pass on: the bytes as they came, or (``drop_usage``: the gateway asked for the
    usage, the client did not) the complete lines without the usage-only event."""

    def __init__(self, recorder: CallRecorder, *, drop_usage: bool = False) -> None:
        self.recorder = recorder
        self._rest = b""
        self._drop_usage = drop_usage
        self._dropping = False
        """The usage-only event's data line was dropped: drop its blank line too."""
        self.answered = False
        """The stream's ``data: [DONE]`` went by: the answer is whole."""

    def feed(self, piece: bytes) -> bytes:
        """Read ``piece``; the bytes to pass on now."""
        *lines, self._rest = (self._rest + piece).split(b"\n")
        if not self._drop_usage:
            for line in lines:
                self._read(line)
            return piece
        kept = [line for line in lines if self._keep(line, self._read(line))]
        return b"".join(line + b"\n" for line in kept)

    def flush(self) -> bytes:
        """What is left to pass on at the stream's end (a last line without ``\n``)."""
        rest, self._rest = self._rest, b""
        return rest if self._drop_usage else b""

    def _keep(self, line: bytes, chunk: dict[str, Any] | None) -> bool:
        if self._dropping and not line.strip():
            self._dropping = False
            return False
        self._dropping = chunk is not None and self.recorder.api.usage_only(chunk)
        return not self._dropping

    def _read(self, line: bytes) -> dict[str, Any] | None:
        """The chunk a ``data:`` line carries, observed by the recorder (None: none)."""
        data = line.strip()
        if data == b"data: [DONE]":
            self.answered = True
        if not data.startswith(b"data:") or self.answered:
            return None
        try:
            chunk = json.loads(data[5:])
        except ValueError:
            return None  # not ours to judge: the client gets the bytes as they came
        if not isinstance(chunk, dict):
            return None
        self.recorder.observe(chunk, chunk=True)
        return chunk


async def relay(
    response: aiohttp.ClientResponse,
    recorder: CallRecorder,
    done: Callable[[CallStatus, str | None], None],
    *,
    drop_usage: bool = False,
) -> AsyncIterator[bytes]:
    """Pass the engine's stream on (``drop_usage``: without the usage-only event,
    ``SSEScanner``); ``done(status, error)`` runs at the end whatever happens (the
    client leaving cancels this generator and closes the engine's connection, which
    aborts the request in vLLM)."""
    scanner = SSEScanner(recorder, drop_usage=drop_usage)
    status: CallStatus = "ok"
    error: str | None = None
    try:
        async for piece in response.content.iter_any():
            # Read before it goes out: a client may close as soon as it has [DONE]
            # (the OpenAI client does, without reading the response's end), which
            # then arrives while this generator waits at the yield.
            if out := scanner.feed(piece):
                yield out
        if rest := scanner.flush():
            yield rest
    except (asyncio.CancelledError, GeneratorExit):
        if not scanner.answered:
            status, error = "cancelled", "the client disconnected"
        raise
    except BROKEN_ANSWER as exc:
        # The status line went out already: say so in the stream, as vLLM does for
        # its own stream errors (the OpenAI client raises on an "error" chunk). The
        # blank lines first end whatever partial event the engine left behind.
        status, error = "error", f"the engine's stream broke off: {exc!r}"
        payload = {"error": {"message": error, "type": "upstream_error", "code": 502}}
        yield f"\n\ndata: {json.dumps(payload)}\n\n".encode()
    finally:
        done(status, error)
        finish(response, complete=status == "ok")


def finish(response: aiohttp.ClientResponse, *, complete: bool) -> None:
    """Done with ``response``: its connection back to the pool when the answer was
    read whole, else closed (so the engine aborts the request)."""
    if complete:
        response.release()
    else:
        response.close()
