"""Agent instances as a policy half learns them from the stream (seed 004's unit: the
sessions of one task-parallel agent, ``CallView.task_id``): which sessions belong to
which instance, and when an instance's last known session ends.

A session joins its instance from its calls or views (``task_id``) or from
``session_start``'s ``task_id`` metadata; a session never seen with a task is its own
instance. NOTE: ours — an instance ends when the last of the sessions seen so far ends,
so a branch that starts only after all its siblings ended begins the instance anew
(seed 004's agents start all their branches at once)."""

from __future__ import annotations

from collections import defaultdict

from agentmars.sdk.events import AnyEvent, SessionEnd, SessionStart


class Instances:
    def __init__(self) -> None:
        self._task_of: dict[str, str] = {}
        self._members: defaultdict[str, set[str]] = defaultdict(set)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._members

    def task_of(self, session_id: str) -> str:
        return self._task_of.get(session_id, session_id)

    def join(self, session_id: str, task_id: str) -> bool:
        """The session belongs to ``task_id``; True if it starts the instance."""
        previous = self._task_of.get(session_id)
        if previous == task_id:
            return False
        if previous is not None:
            self._leave(session_id)
        new = task_id not in self._members
        self._task_of[session_id] = task_id
        self._members[task_id].add(session_id)
        return new

    def follow(self, event: AnyEvent) -> str | None:
        """Follow ``event``; the instance whose last known session it ended, if any."""
        if isinstance(event, SessionStart) and event.metadata.get("task_id"):
            self.join(event.session_id, event.metadata["task_id"])
        elif isinstance(event, SessionEnd) and event.session_id in self._task_of:
            return self._leave(event.session_id)
        return None

    def _leave(self, session_id: str) -> str | None:
        task_id = self._task_of.pop(session_id)
        members = self._members[task_id]
        members.discard(session_id)
        if members:
            return None
        del self._members[task_id]
        return task_id
