"""vLLM's waiting queue kept in the policy's order, rather than sorted at every step.

vLLM takes calls off the queue's head and puts the ones it skipped back in their
order, so a sorted queue stays sorted until a call joins it (a new one, a preempted
one, a resumed one) or a call's kept sort key goes (its session's pin changed, or the
policy's refresh came). Only those calls are put back in their place; the whole queue
is sorted when it was never sorted, when keys are not kept (the policy's priority may
change at any step), or when many calls moved at once. Sorting all of it at every
step cost a MARS step about 5% of stock vLLM's ``schedule()`` (bench_schedule's queue).

A key is ``(session id, sort key)``: the session tells which keys a pin change
invalidates. Imports no vLLM: requests are read by attribute.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

KeyOf = Callable[[Any], tuple[str, Any]]
"""A request's session id and sort key (smaller first)."""

_length = deque.__len__
"""A deque's length, read in C: vLLM's waiting queue, a deque, overrides ``__len__``
and ``__bool__`` in Python (three calls for each ``if queue``, and one for each
negative index)."""

RESORT_SHARE = 4
"""Sort the whole queue once more than a quarter of it moved (ours: a placement costs
a few comparisons and two passes over the queue in C; a sort, one key per call)."""


class WaitingOrder:
    def __init__(self, key_of: KeyOf, *, kept: bool, is_waiting: Callable[[Any], bool]) -> None:
        self._key_of = key_of
        self._kept = kept
        self._is_waiting = is_waiting
        self._keys: dict[str, tuple[str, Any]] = {}
        """Request id -> (session id, sort key), for the calls whose key is known."""
        self._ids_of: dict[str, set[str]] = {}
        """Session id -> request ids with a known key."""
        self._moved: dict[str, Any] = {}
        """Request id -> request, for the calls that may be out of place."""
        self._sorted = False
        self.settled = False
        """The queue is in order, and stays so until a call joins or a key goes: the
        scheduler need not call ``order`` meanwhile (never, when keys are not kept)."""

    def joined(self, request: Any) -> None:
        """A call was added to the queue: its key is made anew when it is placed."""
        self.left(request.request_id)
        self._moved[request.request_id] = request
        self.settled = False

    def left(self, request_id: str) -> None:
        """A call is gone for good (finished): forget its key."""
        self._moved.pop(request_id, None)
        entry = self._keys.pop(request_id, None)
        if entry is not None:
            ids = self._ids_of.get(entry[0])
            if ids is not None:
                ids.discard(request_id)
                if not ids:
                    del self._ids_of[entry[0]]

    def forget_sessions(self, sessions: Iterable[str], requests: Mapping[str, Any]) -> None:
        """These sessions' keys may have changed (``requests``: vLLM's, by id)."""
        for session_id in sessions:
            for request_id in self._ids_of.pop(session_id, ()):
                del self._keys[request_id]
                request = requests.get(request_id)
                if request is not None and self._is_waiting(request):
                    self._moved[request_id] = request
                    self.settled = False

    def forget_all(self) -> None:
        self._keys.clear()
        self._ids_of.clear()
        self._sorted = self.settled = False

    def order(self, queue: deque[Any]) -> None:
        """Put ``queue`` (vLLM's waiting queue) in the policy's order, in place."""
        size = _length(queue)
        if size < 2:
            pass
        elif not self._kept:
            self.forget_all()
            self._sort(queue)
        elif not self._sorted or len(self._moved) * RESORT_SHARE > size:
            self._sort(queue)
        elif self._moved:
            self._place(self._moved, queue)
        self._moved.clear()
        self._sorted = self.settled = self._kept

    def _key(self, request: Any) -> Any:
        entry = self._keys.get(request.request_id)
        if entry is None:
            entry = self._keys[request.request_id] = self._key_of(request)
            self._ids_of.setdefault(entry[0], set()).add(request.request_id)
        return entry[1]

    def _sort(self, queue: deque[Any]) -> None:
        ordered = sorted(queue, key=self._key)
        queue.clear()
        queue.extend(ordered)

    def _place(self, moved: dict[str, Any], queue: deque[Any]) -> None:
        """Take the moved calls out (the rest is in order), then put each in its
        place. vLLM adds a call at the tail and a preempted one at the head: those are
        taken off the ends, only the others looked for (a removal compares every
        call before it); one whose key is last goes back at the tail."""
        back = self._take_ends(moved, queue)
        for request in moved.values():
            try:
                queue.remove(request)
            except ValueError:
                continue  # no longer waiting (scheduled, finished or held)
            back.append(request)
        key_of = self._key
        for request in back:
            key = key_of(request)
            size = _length(queue)
            if not size or key_of(queue[size - 1]) <= key:
                queue.append(request)
            else:
                queue.insert(bisect.bisect_right(queue, key, 0, size, key=key_of), request)

    @staticmethod
    def _take_ends(moved: dict[str, Any], queue: deque[Any]) -> list[Any]:
        """The moved calls at the queue's tail and head, taken off it (and out of
        ``moved``). Indexes count from the head: a negative one makes the deque ask
        vLLM's queue for its length, in Python."""
        taken = []
        size = _length(queue)
        for take, at_tail in ((queue.pop, True), (queue.popleft, False)):
            while size:
                request = queue[size - 1 if at_tail else 0]
                request_id = request.request_id
                if moved.get(request_id) is not request:
                    break
                take()
                del moved[request_id]
                taken.append(request)
                size -= 1
        return taken
