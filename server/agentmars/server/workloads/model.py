"""What a workload is: sessions that alternate LLM calls and tool calls (DESIGN.md
"Workloads").

A session is a list of turns. Turn ``i`` appends ``append_tokens`` to the session's
context (the user prompt on turn 0, the previous tool's observation after that),
asks the model for ``output_tokens``, and, except on the last turn, the output is a
tool call that runs on the host's CPUs before turn ``i + 1`` starts. The prompt of
turn ``i`` is therefore the whole context so far: every earlier append and output
plus its own append, which is what makes keeping a session's KV across a tool call
worth something.

The models are validated on construction (pydantic), so a workload read from a file
is checked field by field and a bad one is refused with the offending field named.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Tokens = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=256)]
INPUT_TEXT_MAX_CHARS = 65_536
"""Bound on ``SessionSpec.input_text`` (ours: far above the generated inputs, a few
hundred words, so only a malformed file hits it)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolSpec(_Frozen):
    """One tool call on the host.

    ``wall_s`` is how long it takes when it gets all the CPU it asks for; ``cpu_s``
    the CPU time it uses in that time, so it keeps ``cpu_s / wall_s`` cores busy
    (0 for a tool that only waits, e.g. on a remote API; more than 1 for a parallel
    build). When the tools running at once ask for more cores than the host has,
    they share them and take longer (the simulator's processor sharing)."""

    kind: Name
    wall_s: Seconds
    cpu_s: Seconds = 0.0
    command: str | None = None
    """The real command a replaying agent runs (None: a synthetic tool, replayed as a
    CPU-burning stand-in of the same duration)."""

    @property
    def cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class TurnSpec(_Frozen):
    """One LLM call of a session and the tool call its answer asks for."""

    append_tokens: Tokens
    output_tokens: Annotated[int, Field(ge=1)]
    tool: ToolSpec | None = None


class SessionSpec(_Frozen):
    """One agent session (a "request" or "program" in the seed papers)."""

    session_id: Name
    arrival_s: Seconds = 0.0
    agent: Name = "agent"
    """The agent's class or type (fairness is measured per agent; Justitia predicts
    cost per agent type)."""
    shared_prefix_tokens: Tokens = 0
    """Tokens at the start of turn 0's append that every session of ``prefix_group``
    shares (a system prompt), so their KV can be reused across sessions."""
    prefix_group: Name | None = None
    task_id: Name | None = None
    """The agent instance the session belongs to (seed 004: the branches of one
    task-parallel agent share it; None: the session is its own instance)."""
    input_text: Annotated[str, Field(max_length=INPUT_TEXT_MAX_CHARS)] | None = None
    """The agent instance's input as its user gives it (seed 004: Justitia's cost
    predictor reads it); the branches of one instance carry the same text. None: the
    workload has no text."""
    after: tuple[Name, ...] = ()
    """Sessions that must have ended before this one starts (seed 004 §2.1: an agent's
    inferences form a DAG, e.g. MapReduce's reduce waits for every map): it arrives at
    its ``arrival_s`` or when the last of them ends, whichever is later. They come
    before it in the workload's list."""
    turns: Annotated[tuple[TurnSpec, ...], Field(min_length=1)]

    @model_validator(mode="after")
    def _check_turns(self) -> SessionSpec:
        *middle, last = self.turns
        missing = [i for i, turn in enumerate(middle) if turn.tool is None]
        if missing:
            raise ValueError(
                f"turns {missing} have no tool call; only the last turn may end without one"
            )
        if last.tool is not None:
            raise ValueError("the last turn must not end in a tool call")
        if self.turns[0].append_tokens < 1:
            raise ValueError("turn 0 must append at least one token (the first prompt)")
        if self.shared_prefix_tokens > self.turns[0].append_tokens:
            raise ValueError("shared_prefix_tokens exceeds turn 0's append_tokens")
        if self.shared_prefix_tokens and self.prefix_group is None:
            raise ValueError("shared_prefix_tokens needs a prefix_group")
        return self

    def prompt_tokens(self, turn: int) -> int:
        """The prompt of turn ``turn``: the whole context up to its own append."""
        return self._context_before[turn] + self.turns[turn].append_tokens

    @cached_property
    def _context_before(self) -> tuple[int, ...]:
        context, before = 0, []
        for turn in self.turns:
            before.append(context)
            context += turn.append_tokens + turn.output_tokens
        return tuple(before)

    @property
    def prompt_volume(self) -> int:
        """Sum of the prompts of all turns (seed 000 Fig. 6's request-level prompt
        volume)."""
        return sum(self.prompt_tokens(i) for i in range(len(self.turns)))

    @property
    def final_context(self) -> int:
        """Context length at the end of the last turn."""
        return self.prompt_tokens(len(self.turns) - 1) + self.turns[-1].output_tokens

    @property
    def tool_wall_s(self) -> float:
        return sum(turn.tool.wall_s for turn in self.turns if turn.tool is not None)


class Workload(_Frozen):
    """Sessions and how they arrive.

    ``arrival="open"``: each session arrives at its ``arrival_s`` (a Poisson
    process, or a trace's timestamps). ``arrival="closed"``: ``concurrency``
    sessions run at once; the next one (in list order) starts when one ends and
    ``arrival_s`` is ignored."""

    name: Name
    seed: int | None = None
    arrival: Literal["open", "closed"] = "open"
    concurrency: Annotated[int, Field(ge=1)] | None = None
    sessions: Annotated[tuple[SessionSpec, ...], Field(min_length=1)]

    @model_validator(mode="after")
    def _check(self) -> Workload:
        if (self.arrival == "closed") != (self.concurrency is not None):
            raise ValueError("concurrency is required for closed-loop arrival and only for it")
        seen: set[str] = set()
        for session in self.sessions:
            if session.session_id in seen:
                raise ValueError(f"duplicate session_id {session.session_id!r}")
            # Before it in the list: a dependency cycle cannot be written, and a closed
            # loop starts every dependency before the session that waits for it.
            missing = [other for other in session.after if other not in seen]
            if missing:
                raise ValueError(
                    f"session {session.session_id!r} comes after {missing}, which are not "
                    "sessions listed before it"
                )
            seen.add(session.session_id)
        return self

    @property
    def has_dependencies(self) -> bool:
        """Whether some session waits for others (``SessionSpec.after``)."""
        return any(session.after for session in self.sessions)
