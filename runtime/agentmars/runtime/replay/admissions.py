"""When the gateway let each session in, read from its event stream while agents run.

The agents cannot tell: their first call's ``llm_submit`` is stamped before the call
waits at the gateway for admission. The gateway publishes its own ``llm_submit``
(``source="gateway"``) as a call leaves admission for the engine, so a session's first
such event is when it was admitted. Events carry ``mono_ns``, the host's monotonic
clock, so the gateway's stamps and the agents' compare directly (one host).
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

import httpx

from agentmars.sdk.events import EventError, LLMSubmit, decode_event
from agentmars.sdk.wire import STREAM_PATH

OPEN_TIMEOUT_S = 10.0


class AdmissionsUnreadable(RuntimeError):
    """The gateway's event stream did not open."""


class GatewayAdmissions:
    """``async with`` it around the agents: from its start (once the stream is open)
    to its end, ``admitted_ns`` holds each session's admission, by session id."""

    def __init__(self, gateway: str, token: str) -> None:
        self._url = gateway + STREAM_PATH
        self._headers = {"Authorization": f"Bearer {token}"}
        self.admitted_ns: dict[str, int] = {}
        self._opened = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GatewayAdmissions:
        self._reader = asyncio.create_task(self._read())
        opened = asyncio.create_task(self._opened.wait())
        done, _ = await asyncio.wait(
            {self._reader, opened}, timeout=OPEN_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
        if opened not in done:
            opened.cancel()
            await self._stop()
            raise AdmissionsUnreadable(f"the gateway's event stream {self._url} did not open")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self._reader

    async def _read(self) -> None:
        timeout = httpx.Timeout(OPEN_TIMEOUT_S, read=None)
        async with (
            httpx.AsyncClient(timeout=timeout) as client,
            client.stream("GET", self._url, headers=self._headers) as response,
        ):
            response.raise_for_status()
            async for line in response.aiter_lines():
                # The stream's first line is a comment sent once the gateway subscribed
                # it: from then on no event is missed.
                self._opened.set()
                if line.startswith("data: "):
                    self._take(line.removeprefix("data: "))

    def _take(self, data: str) -> None:
        try:
            event = decode_event(data)
        except EventError:
            return  # an event of a later version than this reader's: not an admission
        if isinstance(event, LLMSubmit) and event.source == "gateway":
            self.admitted_ns.setdefault(event.session_id, event.mono_ns)
