"""How long an admitted session with nothing open keeps its admission seat: the gap
between two of its calls, judged by the gaps the gateway has measured (docs/gateway.md
"Seats").

A gap is the time from the moment a session had nothing open (no call in flight, no
tool call queued or running) to its next call's arrival, on the gateway's own clock.
Clients that send no tool events (an unmodified OpenHands, the openai client, LiteLLM)
never say goodbye either, so a seat held past the gaps the stream shows is capacity
the gateway strands. The limit is a high quantile of the session's own gaps once it
has a few, else of every session's recent gaps.

NOTE: ours —
- the gaps are measured by the gateway, not reported by clients: a client's
  ``tool_end`` can name any duration, so reported tool durations never extend a seat;
- the quantile is nearest-rank over a bounded window of recent gaps, recomputed at
  most every ``REFRESH_EVERY`` new gaps, so a call's cost stays O(1) amortised;
- ``FIRST_GAP_S`` before any gap is known, and ``MIN_GAP_S`` below any quantile, are
  our values: a seat given back too early costs only a pass through admission, which
  is immediate while the window has room.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

GAP_QUANTILE = 0.95
"""The quantile of observed gaps past which a seat is given back (the issue's P95)."""

POPULATION_GAPS = 512
"""Recent gaps of all sessions kept for the population's quantile."""

OWN_GAPS = 16
"""Recent gaps of one session kept for its own quantile."""

OWN_GAPS_ENOUGH = 4
"""A session's own gaps decide once it has this many; before, the population's do."""

FIRST_GAP_S = 10.0
"""The limit before any gap has been measured."""

MIN_GAP_S = 1.0
"""No limit is shorter than this (a client's think time between a tool's end and its
next call is not measured by anything on the stream)."""

REFRESH_EVERY = 16
"""New gaps between two recomputations of the population's quantile."""


def quantile(samples: Iterable[float], q: float = GAP_QUANTILE) -> float:
    """Nearest-rank quantile of a non-empty sample."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def own_gaps() -> deque[float]:
    """The bounded record of one session's gaps."""
    return deque(maxlen=OWN_GAPS)


class Gaps:
    """The gaps measured so far, and the seat limit they give a session."""

    def __init__(self, cap_s: float) -> None:
        self.cap_s = cap_s
        """No limit is longer than this (the session's final idle expiry)."""
        self._population: deque[float] = deque(maxlen=POPULATION_GAPS)
        self._population_limit: float | None = None
        self._since_refresh = 0

    def record(self, own: deque[float], gap_s: float) -> None:
        own.append(gap_s)
        self._population.append(gap_s)
        self._since_refresh += 1
        if self._population_limit is None or self._since_refresh >= REFRESH_EVERY:
            self._population_limit = quantile(self._population)
            self._since_refresh = 0

    def limit_s(self, own: deque[float]) -> float:
        """How long a session whose gaps so far are ``own`` keeps its seat with nothing
        open."""
        if len(own) >= OWN_GAPS_ENOUGH:
            limit = quantile(own)
        elif self._population_limit is not None:
            limit = self._population_limit
        else:
            limit = FIRST_GAP_S
        return min(max(limit, MIN_GAP_S), self.cap_s)
