"""Sessions a policy's ``tick`` paused inside vLLM, and the requests held for them
(the ``pause`` capability; ``SessionAction`` "pause" / "resume").

A paused session's requests are out of vLLM's queues: its running ones are preempted
(at the top of ``schedule()``, where vLLM preempts too), its waiting ones and any that
arrive while it is paused are held here; on resume they go back to the waiting queue,
where the policy orders them again. They stay in vLLM's request table meanwhile, so an
abort still finds them. Imports no vLLM: requests are read by attribute.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class PausedSessions:
    def __init__(self) -> None:
        self._held: dict[str, list[Any]] = {}
        """Paused session id -> its held requests, in arrival order."""
        self.requests = 0
        """Requests held, over all paused sessions (counted as they come and go: read
        at every step)."""

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._held

    def __len__(self) -> int:
        return len(self._held)

    def pause(self, session_id: str) -> None:
        self._held.setdefault(session_id, [])

    def hold(self, session_id: str, requests: Iterable[Any]) -> None:
        held = self._held[session_id]
        before = len(held)
        held.extend(requests)
        self.requests += len(held) - before

    def resume(self, session_id: str) -> list[Any]:
        """The session's held requests (none if it was not paused)."""
        held = self._held.pop(session_id, [])
        self.requests -= len(held)
        return held

    def forget(self, request_ids: set[str]) -> None:
        """Requests that finished (an abort) while held."""
        for session_id, held in self._held.items():
            kept = [r for r in held if r.request_id not in request_ids]
            self.requests -= len(held) - len(kept)
            self._held[session_id] = kept
