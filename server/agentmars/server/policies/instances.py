"""Agent instances as a policy half learns them from the stream (seed 004's unit: the
sessions of one task-parallel agent, ``CallView.task_id``): which sessions belong to
which instance, when an instance's last session ends, and when to forget it.

A session joins its instance from its calls or views (``task_id``) or from
``session_start``'s ``task_id`` metadata; a session never seen with a task is its own
instance. An instance ends when the last of the sessions seen so far ends, but is
remembered for a while (the ``remember`` most recently ended): a session that starts
later, as an aggregation step that waits for the branches it reads
(``SessionSpec.after``), rejoins it rather than starting a new instance. A half keeps
what it holds for an instance until the instance is forgotten. NOTE: ours — nothing
on the stream says that an agent will start no more sessions."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass

from agentmars.sdk.events import AnyEvent, SessionEnd, SessionStart

REMEMBER = 4096
"""Ended instances remembered (ours: a few minutes of seed 004's densest load, 300
agents in 6 minutes, many times over; bounded so the halves' state is)."""


@dataclass(frozen=True, slots=True)
class Change:
    ended: str | None = None
    """The instance whose last session just ended."""
    forgotten: tuple[str, ...] = ()
    """Ended instances no longer remembered: drop what is kept for them."""


class Instances:
    def __init__(self, remember: int = REMEMBER) -> None:
        self.remember = remember
        self._task_of: dict[str, str] = {}
        self._members: defaultdict[str, set[str]] = defaultdict(set)
        self._ended: OrderedDict[str, None] = OrderedDict()

    def task_of(self, session_id: str) -> str:
        return self._task_of.get(session_id, session_id)

    def join(self, session_id: str, task_id: str) -> bool:
        """The session belongs to ``task_id``; True if that starts a new instance
        (neither live nor remembered)."""
        previous = self._task_of.get(session_id)
        if previous == task_id:
            return False
        if previous is not None:
            self._leave(session_id)
        new = task_id not in self._members and task_id not in self._ended
        self._ended.pop(task_id, None)
        self._task_of[session_id] = task_id
        self._members[task_id].add(session_id)
        return new

    def follow(self, event: AnyEvent) -> Change:
        """Follow ``event``: what it ended, and what is forgotten because of it."""
        if isinstance(event, SessionStart) and event.metadata.get("task_id"):
            self.join(event.session_id, event.metadata["task_id"])
        elif isinstance(event, SessionEnd) and event.session_id in self._task_of:
            ended = self._leave(event.session_id)
            if ended is not None:
                self._ended[ended] = None
                forgotten = []
                while len(self._ended) > self.remember:
                    forgotten.append(self._ended.popitem(last=False)[0])
                return Change(ended, tuple(forgotten))
        return Change()

    def _leave(self, session_id: str) -> str | None:
        task_id = self._task_of.pop(session_id)
        members = self._members[task_id]
        members.discard(session_id)
        if members:
            return None
        del self._members[task_id]
        return task_id
