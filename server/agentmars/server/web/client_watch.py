"""Web helpers every server of agentmars shares (the gateway and the wall-clock twin):
noticing a client that disconnects while the server works on its behalf, and a
streaming response that always closes its body iterator."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class ClientWatch:
    """Notices the client disconnecting while the gateway waits on its behalf: one
    reader of the request's ASGI channel (after the body was read) for the whole
    request, ended by leaving the ``with`` block, before any response is sent (a
    streaming response reads the channel itself)."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._gone: asyncio.Future[None] | None = None

    def __enter__(self) -> ClientWatch:
        self._gone = asyncio.ensure_future(self._disconnected())
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._gone is not None:
            self._gone.cancel()

    async def _disconnected(self) -> None:
        while (await self._request.receive())["type"] != "http.disconnect":
            pass

    async def unless_gone(self, work: Awaitable[T]) -> T:
        """Await ``work`` unless the client disconnects first (then ``ClientGone``,
        with ``work`` cancelled)."""
        assert self._gone is not None, "ClientWatch is used inside its with block"
        task = asyncio.ensure_future(work)
        either: set[asyncio.Future[Any]] = {task, self._gone}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        raise ClientGone()


class ClosingStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that always closes its body iterator, so a client that
    disconnects between chunks still ends the relay (and the engine's request) now;
    ``on_close`` runs after it, whether the iterator ever started or not."""

    def __init__(
        self, content: Any, *, on_close: Callable[[], None] = lambda: None, **options: Any
    ) -> None:
        super().__init__(content, **options)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self._on_close()
