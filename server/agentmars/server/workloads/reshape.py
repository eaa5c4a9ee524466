"""A workload reshaped for a smaller stage: sessions cut to their first turns, tools
scaled in time (a replay on a CPU engine with a tiny model keeps a workload's shape at
a size that runs in minutes)."""

from __future__ import annotations

import math
from collections.abc import Callable

from agentmars.server.workloads.model import SessionSpec, ToolSpec, Workload


def first_turns(workload: Workload, max_turns: int) -> Workload:
    """Each session cut to its first ``max_turns`` calls; the last kept call ends the
    session (its tool call is dropped)."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, not {max_turns}")
    return workload.model_copy(
        update={"sessions": tuple(_cut(session, max_turns) for session in workload.sessions)}
    )


def _cut(session: SessionSpec, max_turns: int) -> SessionSpec:
    if len(session.turns) <= max_turns:
        return session
    *kept, last = session.turns[:max_turns]
    return _changed(session, turns=(*kept, last.model_copy(update={"tool": None})))


def _changed(session: SessionSpec, **changes: object) -> SessionSpec:
    """``session`` with ``changes``, checked again (``model_copy`` does not check)."""
    return SessionSpec.model_validate({**session.model_dump(), **changes})


def scale_tools(workload: Workload, factor: float) -> Workload:
    """Every tool ``factor`` times as long, its CPU time with it (its cores unchanged)."""
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"the tool scale must be a finite number, 0 or more, not {factor}")
    return each_tool(workload, lambda tool: _scaled(tool, factor))


def each_tool(workload: Workload, change: Callable[[ToolSpec], ToolSpec]) -> Workload:
    """``workload`` with every tool call ``change``d."""
    sessions = tuple(
        _changed(
            session,
            turns=tuple(
                turn if turn.tool is None else turn.model_copy(update={"tool": change(turn.tool)})
                for turn in session.turns
            ),
        )
        for session in workload.sessions
    )
    return workload.model_copy(update={"sessions": sessions})


def _scaled(tool: ToolSpec, factor: float) -> ToolSpec:
    return tool.model_copy(update={"wall_s": tool.wall_s * factor, "cpu_s": tool.cpu_s * factor})


def fit_context(workload: Workload, max_context: int) -> Workload:
    """Every call's tokens scaled by one factor, so that the longest session's context
    fits ``max_context`` (a model's limit): the sessions keep their turns, tools and
    proportions, at a smaller size (nothing changes when they fit already). A count
    that must stay positive (turn 0's append, every output) is at least 1; the factor
    leaves room for those."""
    longest = max(session.final_context for session in workload.sessions)
    if longest <= max_context:
        return workload
    # Each positive count can gain less than one token from the floor and the clamp.
    room = max_context - max(len(session.turns) + 1 for session in workload.sessions)
    if room < 1:
        raise ValueError(f"sessions of this many turns cannot fit a context of {max_context}")
    factor = room / longest
    sessions = tuple(
        _changed(
            session,
            shared_prefix_tokens=int(session.shared_prefix_tokens * factor),
            turns=tuple(
                turn.model_copy(
                    update={
                        "append_tokens": _scaled_count(turn.append_tokens, factor, i == 0),
                        "output_tokens": _scaled_count(turn.output_tokens, factor, True),
                    }
                )
                for i, turn in enumerate(session.turns)
            ),
        )
        for session in workload.sessions
    )
    return workload.model_copy(update={"sessions": sessions})


def _scaled_count(tokens: int, factor: float, positive: bool) -> int:
    scaled = int(tokens * factor)
    return max(scaled, 1) if positive else scaled
