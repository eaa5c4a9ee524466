"""Reading workloads from JSON-lines files: our own format, TraceLab round traces and
Mooncake request traces (formats and assumptions in docs/workloads.md).

Every reader checks each line and fails with a ``WorkloadError`` that names the
file, the line and the field.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from agentmars.server.workloads.errors import WorkloadError, error_at, invalid_at
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload
from agentmars.server.workloads.tool_kinds import tool_call

Row = tuple[int, dict[str, Any]]
"""A line number (from 1) and the JSON object on it."""


def extend_context(context: int, prompt: int, output: int) -> tuple[int, int]:
    """(append, context after the call) for a recorded call of ``prompt`` tokens
    that generated ``output``, our session's context being ``context`` before it.

    NOTE: a recorded prompt can be shorter than our context (an earlier output, e.g.
    reasoning, was not sent back): the call then appends nothing rather than shrink
    the context, so our prompts exceed the recorded ones by at most that output."""
    return max(prompt - context, 0), max(context, prompt) + output


def read_rows(path: Path) -> Iterator[Row]:
    """The JSON objects of a JSON-lines file (gzip-compressed if it ends in .gz), read
    as they are consumed (a trace can be larger than memory as dicts); blank lines
    are skipped, a file without any object is an error."""
    empty = True
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, text in enumerate(lines, 1):
                if text.strip():
                    empty = False
                    yield parse_line(path, number, text)
    except (OSError, UnicodeDecodeError, EOFError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise WorkloadError(f"{path}: cannot read ({reason})") from None
    if empty:
        raise error_at(path, 1, "the file is empty")


def parse_line(path: Path, number: int, text: str) -> Row:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise error_at(path, number, f"not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(value, dict):
        raise error_at(path, number, f"expected a JSON object, got {type(value).__name__}")
    return number, value


Model = TypeVar("Model", bound=BaseModel)


def validate(path: Path, row: Row, model: type[Model]) -> Model:
    number, value = row
    try:
        return model.model_validate(value)
    except ValidationError as error:
        raise invalid_at(path, number, error) from None


# --- our format -------------------------------------------------------------


def from_agentmars(path: Path, rows: Iterable[Row]) -> Workload:
    """Line 1: the ``Workload`` fields but ``sessions``; then one ``SessionSpec`` a
    line."""
    rows = iter(rows)
    header_line, header = next(rows)
    if "sessions" in header or "turns" in header:
        raise error_at(
            path,
            header_line,
            "the first line must be the header (the workload's "
            "name, seed, arrival, concurrency), not a session",
        )
    sessions: list[SessionSpec] = []
    first_seen: dict[str, int] = {}
    for row in rows:
        session = validate(path, row, SessionSpec)
        if session.session_id in first_seen:
            raise error_at(
                path,
                row[0],
                f"duplicate session_id {session.session_id!r} "
                f"(first on line {first_seen[session.session_id]})",
            )
        first_seen[session.session_id] = row[0]
        sessions.append(session)
    if not sessions:
        raise error_at(path, header_line, "no sessions after the header")
    return validate(path, (header_line, {**header, "sessions": sessions}), Workload)


# --- TraceLab (uw-syfi/TraceLab round_trace.jsonl) ---------------------------


def as_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


Timestamp = Annotated[datetime, AfterValidator(as_utc)]
Milliseconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
MODEL_OUTPUT_EVENTS = {"reasoning", "text", "tool_call"}
INPUT_EVENTS = {"user_message", "tool_result"}
MAJOR_REDUCTION_TOKENS = 1024
"""TraceLab's growth buckets: a prompt shrinking by less than this is a
micro-reduction; by more, the history was compacted or rewritten."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TraceLabEvent(_Lenient):
    event_type: str
    timestamp: Timestamp | None = None


class TraceLabTool(_Lenient):
    tool_name: str
    emitted_at: Timestamp | None = None
    result_at: Timestamp | None = None
    tool_wall_latency_ms: Milliseconds | None = None
    tool_internal_latency_ms: Milliseconds | None = None

    @property
    def effective_s(self) -> float:
        """TraceLab's "effective tool latency": internal when known, else wall."""
        ms = self.tool_internal_latency_ms
        if ms is None:
            ms = self.tool_wall_latency_ms
        return (ms or 0.0) / 1000


class TraceLabRow(_Lenient):
    """One LLM round; the fields we read (the rest is ignored)."""

    session_id: Annotated[str, Field(min_length=1, max_length=240)]
    round_index: Annotated[int, Field(ge=0)]
    input_tokens_total: Annotated[int, Field(ge=1)]
    output_tokens: Annotated[int, Field(ge=0)]
    provider: str | None = None
    timing_events: list[TraceLabEvent] = []
    tools: list[TraceLabTool] = []

    def times(self, kinds: set[str] | None = None) -> list[datetime]:
        """Timestamps of the round's events (of these kinds)."""
        return [
            event.timestamp
            for event in self.timing_events
            if event.timestamp is not None and (kinds is None or event.event_type in kinds)
        ]

    def started(self) -> datetime | None:
        return min(self.times(), default=None)

    def last_output(self) -> datetime | None:
        return max(self.times(MODEL_OUTPUT_EVENTS), default=None)

    def first_input(self) -> datetime | None:
        return min(self.times(INPUT_EVENTS), default=None)


def tracelab_tool(round_: TraceLabRow, next_round: TraceLabRow) -> ToolSpec:
    """What happens between a round and the next: the round's tool calls, which may
    run in parallel -- from the first call's emission to the last one's end, each
    lasting its effective latency (the largest latency when emission times are
    missing) -- or, for a round that calls no tool, the user's reply (from the
    round's last output to the next round's first input). Named after the slowest
    tool."""
    if not round_.tools:
        done, back = round_.last_output(), next_round.first_input()
        wait = (back - done).total_seconds() if done and back else 0.0
        return tool_call("human", wait)
    slowest = max(round_.tools, key=lambda tool: tool.effective_s)
    starts = [tool.emitted_at for tool in round_.tools if tool.emitted_at is not None]
    if len(starts) < len(round_.tools):
        return tool_call(slowest.tool_name, slowest.effective_s)
    first = min(starts)
    ends = [
        (start - first).total_seconds() + tool.effective_s
        for start, tool in zip(starts, round_.tools, strict=True)
    ]
    return tool_call(slowest.tool_name, max(ends))


@dataclass
class Segment:
    """Consecutive rounds of one session whose prompts extend each other."""

    rounds: list[TraceLabRow] = field(default_factory=list)
    appends: list[int] = field(default_factory=list)
    context: int = 0
    """Tokens in our model's context after the last round."""

    def add(self, round_: TraceLabRow) -> None:
        output = max(round_.output_tokens, 1)
        append, self.context = extend_context(self.context, round_.input_tokens_total, output)
        self.appends.append(append)
        self.rounds.append(round_)


def segments_of(rounds: list[TraceLabRow]) -> list[Segment]:
    """Split a session where its prompt shrinks by MAJOR_REDUCTION_TOKENS or more:
    our sessions only grow, so a compacted history starts a new one."""
    segments = [Segment()]
    segments[0].add(rounds[0])
    for previous, round_ in pairwise(rounds):
        if previous.input_tokens_total - round_.input_tokens_total >= MAJOR_REDUCTION_TOKENS:
            segments.append(Segment())
        segments[-1].add(round_)
    return segments


def from_tracelab(path: Path, rows: Iterable[Row]) -> Workload:
    """Sessions from TraceLab rows (one LLM round a row), grouped by ``session_id``
    and ordered by ``round_index``; arrival: the first timestamp of a session's first
    round, relative to the earliest in the file. Sessions are listed by arrival."""
    by_session: dict[str, list[tuple[int, TraceLabRow]]] = defaultdict(list)
    for row in rows:
        parsed = validate(path, row, TraceLabRow)
        by_session[parsed.session_id].append((row[0], parsed))
    drafts: list[tuple[str, datetime | None, Segment]] = []
    for session_id, numbered in by_session.items():
        numbered.sort(key=lambda item: item[1].round_index)
        for (line_a, a), (line_b, b) in pairwise(numbered):
            if a.round_index == b.round_index:
                raise error_at(
                    path,
                    line_b,
                    f"session {session_id!r} has round_index "
                    f"{b.round_index} twice (also line {line_a})",
                )
        segments = segments_of([round_ for _, round_ in numbered])
        for i, segment in enumerate(segments):
            name = session_id if i == 0 else f"{session_id}#{i}"
            drafts.append((name, segment.rounds[0].started(), segment))
    known = [start for _, start, _ in drafts if start is not None]
    origin = min(known, default=None)
    drafts.sort(key=lambda draft: (draft[1] is None, draft[1] or origin))
    sessions = [
        tracelab_session(
            name, (start - origin).total_seconds() if start and origin else 0.0, segment
        )
        for name, start, segment in drafts
    ]
    return Workload(name=trace_name(path), sessions=tuple(sessions))


def tracelab_session(name: str, arrival_s: float, segment: Segment) -> SessionSpec:
    rounds = segment.rounds
    tools = [tracelab_tool(a, b) for a, b in pairwise(rounds)]
    turns = [
        TurnSpec(
            append_tokens=append,
            output_tokens=max(round_.output_tokens, 1),
            tool=tools[i] if i < len(tools) else None,
        )
        for i, (append, round_) in enumerate(zip(segment.appends, rounds, strict=True))
    ]
    return SessionSpec(
        session_id=name,
        arrival_s=arrival_s,
        agent=rounds[0].provider or "tracelab",
        turns=tuple(turns),
    )


# --- Mooncake (kvcache-ai/Mooncake FAST25-release/traces/*.jsonl) ------------

MOONCAKE_BLOCK_TOKENS = 512
DECODE_S_PER_TOKEN = 0.02
"""Ours: the time a request spent generating, taken off the gap to the next request
of its session (~50 tokens/s); the trace has no completion times."""


class MooncakeRow(_Lenient):
    timestamp: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    """Arrival, milliseconds from the start of the trace."""
    input_length: Annotated[int, Field(ge=1)]
    output_length: Annotated[int, Field(ge=0)]
    hash_ids: list[Annotated[int, Field(ge=0)]]
    """One hash per 512-token block of the input (the last one maybe partial)."""

    @property
    def full_blocks(self) -> tuple[int, ...]:
        return tuple(self.hash_ids[: self.input_length // MOONCAKE_BLOCK_TOKENS])


def chain_requests(requests: list[MooncakeRow]) -> list[list[MooncakeRow]]:
    """Sessions as chains of requests (in arrival order): a request continues the
    session whose latest request's full blocks are the longest prefix of its own
    ``hash_ids``, provided that prefix ends in a block first seen in that session (a
    block that many sessions share, like a system prompt, links nothing). Otherwise
    it starts a session."""
    owner: dict[int, int] = {}
    """Block hash -> the session it was first seen in."""
    tips: dict[tuple[int, ...], int] = {}
    """Full blocks of a session's latest request -> that session."""
    sessions: list[list[MooncakeRow]] = []
    for request in requests:
        session = continued_session(request.hash_ids, tips, owner)
        if session is None:
            session = len(sessions)
            sessions.append([])
        sessions[session].append(request)
        for block in request.hash_ids:
            owner.setdefault(block, session)
        tips[request.full_blocks] = session
    return sessions


def continued_session(
    hashes: list[int], tips: dict[tuple[int, ...], int], owner: dict[int, int]
) -> int | None:
    for length in range(len(hashes), 0, -1):
        session = tips.get(tuple(hashes[:length]))
        if session is not None and owner.get(hashes[length - 1]) == session:
            del tips[tuple(hashes[:length])]
            return session
    return None


def shared_prefixes(chains: list[list[MooncakeRow]]) -> list[tuple[int, str | None]]:
    """(shared prefix tokens, group) per session: sessions whose first requests start
    with the same block form a group sharing their longest common prefix of blocks;
    a session alone in its group shares nothing."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, chain in enumerate(chains):
        if chain[0].hash_ids:
            groups[chain[0].hash_ids[0]].append(i)
    result: list[tuple[int, str | None]] = [(0, None)] * len(chains)
    for first_block, members in groups.items():
        if len(members) < 2:
            continue
        firsts = [chains[i][0] for i in members]
        common = 0
        while all(
            len(r.hash_ids) > common and r.hash_ids[common] == firsts[0].hash_ids[common]
            for r in firsts
        ):
            common += 1
        tokens = min(common * MOONCAKE_BLOCK_TOKENS, *(r.input_length for r in firsts))
        for i in members:
            result[i] = (tokens, f"mooncake-{first_block}")
    return result


def from_mooncake(
    path: Path, rows: Iterable[Row], decode_s_per_token: float = DECODE_S_PER_TOKEN
) -> Workload:
    """Sessions rebuilt from Mooncake requests (``chain_requests``). Turn k appends
    what its input adds to the context so far; the "tool" after a request is the gap
    to the session's next request less ``decode_s_per_token`` per output token: the
    trace records arrivals only, so the gap also holds the request's own service
    time, which we can only estimate."""
    requests = sorted(
        (validate(path, row, MooncakeRow) for row in rows), key=lambda request: request.timestamp
    )
    chains = chain_requests(requests)
    origin = requests[0].timestamp
    name = trace_name(path)
    sessions = [
        mooncake_session(f"{name}-{i:05d}", chain, origin, decode_s_per_token, shared, group)
        for i, (chain, (shared, group)) in enumerate(
            zip(chains, shared_prefixes(chains), strict=True)
        )
    ]
    return Workload(name=name, sessions=tuple(sessions))


def mooncake_session(
    session_id: str,
    chain: list[MooncakeRow],
    origin_ms: float,
    decode_s_per_token: float,
    shared: int,
    group: str | None,
) -> SessionSpec:
    turns, context = [], 0
    for request, following in zip(chain, [*chain[1:], None], strict=True):
        output = max(request.output_length, 1)
        append, context = extend_context(context, request.input_length, output)
        gap_s = (following.timestamp - request.timestamp) / 1000 if following else None
        tool = None if gap_s is None else tool_call("gap", gap_s - output * decode_s_per_token)
        turns.append(TurnSpec(append_tokens=append, output_tokens=output, tool=tool))
    return SessionSpec(
        session_id=session_id,
        arrival_s=(chain[0].timestamp - origin_ms) / 1000,
        agent="mooncake",
        shared_prefix_tokens=shared,
        prefix_group=group,
        turns=tuple(turns),
    )


def trace_name(path: Path) -> str:
    """The file's name without its .jsonl / .jsonl.gz ending."""
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name or "trace"
