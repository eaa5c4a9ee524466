"""What every agentmars HTTP server bounds about its clients: how long they take to send
a request, how big a body they send, and who may send one at all.

``RequestGuard`` is a pure ASGI middleware: a bearer check before any body byte is
read (401), a body limit on the bytes actually received, chunked bodies included
(413), and time limits on each wait for more of the body and on the whole of it
(408). ``guarded_server``
is a uvicorn server that closes connections whose request headers are not complete
in time (uvicorn 0.54 has no such timeout: a client sending one header byte a second
held a connection forever), and sends on every connection it accepts without Nagle's
delay, whatever socket it listens on (``_send_without_delay``).

The limits are ours, chosen for agents on the same host or LAN, whose requests go out
at once: see each constant. Nothing here imports a web framework at module level, so
``import agentmars.sdk`` stays light; ``guarded_server`` imports uvicorn when called.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from agentmars.sdk.auth import UNAUTHORISED

if TYPE_CHECKING:
    import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HEADER_TIMEOUT_S = 10.0
"""Our choice: a request line and headers (a few hundred bytes from an HTTP client)
must be complete this long after the connection opens or the request's first byte
arrives, else the connection is closed without an answer (a slowloris client holds
nothing longer)."""
BODY_TIMEOUT_S = 30.0
"""Our choice: the longest wait for the next part of a request body; past it the
request gets 408."""
BODY_DEADLINE_S = 120.0
"""Our choice: the longest a whole request body may take (a 32 MiB body at 2.2 Mbit/s),
so a client sending a byte every ``BODY_TIMEOUT_S`` still lets go; past it, 408."""
COMPLETION_BODY_BYTES = 32 * 1024 * 1024
"""Our choice: the body limit of a completion request on every OpenAI-API server here
(the gateway, the twin, the scripted engine): a prompt of a long-context model's whole
window is a few MiB of JSON."""
KEEP_ALIVE_S = 5.0
"""An idle keep-alive connection is closed after this long (uvicorn's default, kept)."""
MAX_HEADER_BYTES = 16 * 1024
"""Request line plus headers still incomplete; past it the server answers 400 and
closes (h11's default, made explicit, and applied to httptools too; h11 judges what it
buffers, so a head that arrives whole in one read may be a read's size)."""


class RequestGuard:
    """ASGI middleware bounding each HTTP request before and while the app reads it.

    ``max_body_bytes`` is the limit, or a function of the request path giving it.
    ``authorise``, when given, decides from the scope (its headers) whether the request
    may go on; one it refuses gets 401 before a byte of its body is read. Every answer
    of the guard is JSON ``{"detail": ...}`` and closes the connection, so the rest of
    a refused body is never read. An app that has started reading a body the guard
    then refuses is handed ``http.disconnect`` (the client is gone, as far as it is
    concerned) and whatever it sends afterwards is dropped: the client gets the
    guard's answer only."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int | Callable[[str], int],
        body_timeout_s: float = BODY_TIMEOUT_S,
        authorise: Callable[[Scope], bool] | None = None,
        body_deadline_s: float = BODY_DEADLINE_S,
    ) -> None:
        if isinstance(max_body_bytes, int) and max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be >= 0, got {max_body_bytes}")
        if not 0 < body_timeout_s <= body_deadline_s:
            raise ValueError(
                f"need 0 < body_timeout_s <= body_deadline_s, got {body_timeout_s} and "
                f"{body_deadline_s}"
            )
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.body_deadline_s = body_deadline_s
        self.authorise = authorise

    def limit_for(self, path: str) -> int:
        """The body limit of a request to ``path``."""
        limit = self.max_body_bytes
        return limit if isinstance(limit, int) else limit(path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.authorise is not None and not self.authorise(scope):
            await answer(send, 401, UNAUTHORISED, [(b"www-authenticate", b"Bearer")])
            return
        limit = self.limit_for(scope["path"])
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            await answer(send, 413, too_large(limit))
            return
        body = _GuardedBody(receive, send, limit, self.body_timeout_s, self.body_deadline_s)
        try:
            await self.app(scope, body.receive, body.send)
        except Exception:
            # An app may raise on the disconnect it was handed; the client has its
            # answer already, and a traceback would only say the guard did its job.
            if not body.answered:
                raise


def too_large(limit: int) -> str:
    return f"request body exceeds {limit} bytes"


async def answer(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole JSON ``{"detail": ...}`` answer that closes the connection."""
    content = json.dumps({"detail": detail}).encode()
    start = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
        (b"connection", b"close"),
    ]
    await send(
        {"type": "http.response.start", "status": status, "headers": start + (headers or [])}
    )
    await send({"type": "http.response.body", "body": content})


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            # The server has checked the syntax (h11 answers 400 to a bad one).
            return int(value) if value.isdigit() else None
    return None


class _GuardedBody:
    """One request's ``receive`` and ``send`` as the app sees them: the body counted
    and timed while it arrives, the guard's answer instead of the app's once it
    refused the body."""

    def __init__(
        self, receive: Receive, send: Send, limit: int, timeout_s: float, deadline_s: float
    ) -> None:
        self._receive = receive
        self._send = send
        self._limit = limit
        self._timeout_s = timeout_s
        self._deadline_s = deadline_s
        self._deadline = time.monotonic() + deadline_s
        self._received = 0
        self._complete = False
        self._started = False
        self.answered = False

    async def receive(self) -> Message:
        if self.answered:
            return {"type": "http.disconnect"}
        if self._complete:  # past the body a receive waits for the disconnect: no limit
            return await self._receive()
        left_s = self._deadline - time.monotonic()
        try:
            message = await asyncio.wait_for(self._receive(), min(self._timeout_s, left_s))
        except TimeoutError:
            if left_s <= self._timeout_s:
                late = f"request body not complete within {self._deadline_s:g} s"
            else:
                late = f"no request body data for {self._timeout_s:g} s"
            return await self._refuse(408, late)
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limit:
                return await self._refuse(413, too_large(self._limit))
            self._complete = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self.answered:
            return
        self._started = self._started or message["type"] == "http.response.start"
        await self._send(message)

    async def _refuse(self, status: int, detail: str) -> Message:
        # An app that answered before reading its whole body keeps its answer; the
        # connection closes when it is done, as the body was not read to its end.
        if not self._started:
            await answer(self._send, status, detail)
            self.answered = True
        return {"type": "http.disconnect"}


def guarded_server(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    http: str = "auto",
    **config: Any,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` that times out slow clients: request headers
    within ``header_timeout_s`` (``HEADER_TIMEOUT_S``) and of at most
    ``MAX_HEADER_BYTES``, idle keep-alive connections after ``KEEP_ALIVE_S``; every
    connection it accepts has TCP_NODELAY, also on a socket handed to its ``run``
    (``sockets=``, ``_send_without_delay``). ``http``
    is uvicorn's choice of parser (``"auto"``: httptools if installed, else h11), each
    with the header deadline added. ``config`` goes to ``uvicorn.Config`` (and may
    override ``timeout_keep_alive`` and ``log_level="warning"``)."""
    import uvicorn

    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be positive, got {header_timeout_s}")
    settings: dict[str, Any] = {
        "log_level": "warning",
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        **config,
    }
    protocol = _protocol_with_header_deadline(_parser(http), header_timeout_s)
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, http=protocol, **settings))


def _parser(http: str) -> str:
    if http not in ("auto", "h11", "httptools"):
        raise ValueError(f"http must be 'auto', 'h11' or 'httptools', got {http!r}")
    if http != "auto":
        return http
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


class _HeaderDeadline:
    """A deadline on each request's headers, for a uvicorn HTTP protocol.

    uvicorn arms a timer only between requests (keep-alive), and any byte cancels it,
    so a client sending one header byte a second held a connection forever. This one
    is armed when the connection opens and when a new request's first bytes arrive,
    and cancelled as soon as the headers are complete (the app's time and the body's
    are not the header deadline's); when it fires the connection is closed, as uvicorn
    closes an idle keep-alive one."""

    header_timeout_s: float
    loop: asyncio.AbstractEventLoop
    _header_timer: asyncio.TimerHandle | None = None

    if TYPE_CHECKING:  # the protocol's own, which this must not shadow

        def timeout_keep_alive_handler(self) -> None: ...

    def _expect_headers(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _headers_done(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        self.timeout_keep_alive_handler()


def _send_without_delay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle's algorithm off on an accepted TCP connection (TCP_NODELAY).

    asyncio does this itself only for sockets whose ``proto`` is ``IPPROTO_TCP``: a
    listener uvicorn binds from a host and port has it, but an accepted socket takes
    its listener's, and one made with ``socket.socket(family, SOCK_STREAM)`` (ours,
    ``web.serving.listening_socket``, handed to ``run(sockets=...)``) has 0. uvicorn
    writes a response's head and its body separately, so with Nagle on the body waits
    for the client to acknowledge the head; on a keep-alive connection (the openai
    client's default) the client delays that ACK, and each call took ~40 ms more."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@functools.cache
def _protocol_with_header_deadline(parser: str, timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's protocol for ``parser`` with ``_HeaderDeadline`` hooked in, and
    ``_send_without_delay`` on each connection it is made for."""
    if parser == "httptools":
        return _httptools_protocol(timeout_s)
    return _h11_protocol(timeout_s)


def _h11_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(_HeaderDeadline, H11Protocol):
        header_timeout_s = timeout_s

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            _send_without_delay(transport)
            super().connection_made(transport)
            self._expect_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # h11 parses as bytes come: IDLE means no request's headers are complete yet.
            if self.conn.their_state is h11.IDLE:
                self._expect_headers()
            else:
                self._headers_done()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_done()
            super().connection_lost(exc)

    return GuardedH11Protocol


def _httptools_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(_HeaderDeadline, HttpToolsProtocol):
        header_timeout_s = timeout_s
        _head_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            _send_without_delay(transport)
            super().connection_made(transport)
            self._expect_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # httptools buffers a header until the next one starts and uvicorn sets no
            # limit: every byte that arrives while a head is incomplete is the head's.
            if self._header_timer is not None and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEADER_BYTES:
                    self.send_400_response(f"request headers exceed {MAX_HEADER_BYTES} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._expect_headers()

        def on_headers_complete(self) -> None:
            self._headers_done()
            self._head_bytes = 0
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_done()
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol
