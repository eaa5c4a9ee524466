"""In-memory sink: keeps every event, for tests, demos and in-process consumers."""

from __future__ import annotations

from agentmars.sdk.events import Event, SessionEvent


class MemorySink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)  # list.append is atomic: no lock on the hot path

    def close(self) -> None:
        pass

    def of_session(self, session_id: str) -> list[Event]:
        return [
            e for e in self.events if isinstance(e, SessionEvent) and e.session_id == session_id
        ]

    def kinds(self, session_id: str | None = None) -> list[str]:
        events = self.events if session_id is None else self.of_session(session_id)
        return [e.kind for e in events]

    def clear(self) -> None:
        self.events.clear()
