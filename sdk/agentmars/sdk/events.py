"""The unified information stream: one typed event per execution boundary.

Seed 000 §4.1 (Table 1) names the boundaries the schedulers consume:
``gpu_submit`` (projected KV), ``gpu_1st_token`` (launch delay), ``gpu_end``
(freed blocks), ``tool_num`` (active tools), ``tool_start/end`` (execution
duration) and ``window_update``. DESIGN.md adds session start/end, tool enqueue
and KV statistics. Every part of agentmars (SDK, sandbox, gateway, engine
plugin, simulator) produces and consumes these models.

Each event carries stable ids (``session_id``, ``turn``, ``call_id``), a
monotonic timestamp (``mono_ns``, comparable between processes of one host)
and a wall-clock timestamp (``wall_ns``, for export). The wire form is JSON,
one object per event, and JSONL for streams; ``v`` is the schema version and
``kind`` the discriminator.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

SCHEMA_VERSION: Final = 1
"""Version of the event schema written by this code; readers accept 1..SCHEMA_VERSION."""

MAX_COUNT: Final = 2**53
"""The largest count (tokens, blocks, a window, a turn) an event carries: the largest
integer a JSON double holds exactly, so every JSON reader (and Prometheus, whose
values are doubles) reads it as written. A larger one is a decoding error."""
MAX_SECONDS: Final = 1e9
"""The longest duration an event carries (about 31 years: no boundary of a serving host
lasts that long), so sums and products of durations stay finite."""
MAX_TOOL_S: Final = 24 * 3600.0
"""The longest a tool call runs: the sandbox's largest timeout. A tool's reported
duration or CPU time past it is taken as this (a client's ``tool_end`` must not feed
the policies' tool figures a duration no tool can have)."""
MAX_NS: Final = 2**63 - 1
"""Timestamps are int64 nanoseconds, as every tracing format stores them (the wall
clock reaches the limit in 2262)."""
MAX_REASONS: Final = 32
"""Entries of ``KVStats.released``: each is a Prometheus series (``/metrics``)."""

ReleaseReason = Literal[
    "next_call",
    "replaced",
    "expired",
    "pressure",
    "ended",
    "session_end",
    "policy",
    "paused",
    "reset",
    "shutdown",
]
"""Why an engine released a session's pinned KV: its session's next call got its blocks,
a newer pin of the session replaced it, its TTL was up, an allocation needed the
blocks, its session's call ended badly (aborted or failed, or its context started
over), the gateway said the session ended, the policy's ``tick`` unpinned (or offloaded)
it, the policy paused its session, the prefix cache was reset, the engine shut down."""

Source = Literal["sdk", "sandbox", "gateway", "engine", "sim"]
Id = Annotated[str, Field(min_length=1, max_length=256)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Integer = Annotated[int, Field(ge=-MAX_COUNT, le=MAX_COUNT)]
Nanoseconds = Annotated[int, Field(ge=0, le=MAX_NS)]
Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
Port = Annotated[int, Field(ge=1, le=65535)]
ToolSeconds = Annotated[Seconds, AfterValidator(lambda seconds: min(seconds, MAX_TOOL_S))]


def clock() -> dict[str, int]:
    """Both timestamps of one boundary, read together (pass as ``**clock()``) so
    wall-clock span times and monotonic durations describe the same instant."""
    return {"mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}


def as_count(value: object) -> int | None:
    """``value`` if an event can carry it as a count (an int from 0 to ``MAX_COUNT``,
    not a bool), else None: for figures read off someone else's JSON, which a bad one
    must not turn into an event that fails to build."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def check_id(value: object, what: str) -> str:
    """Reject, at the call site, an id or name an event could not carry (``Id``)."""
    if not isinstance(value, str) or not 1 <= len(value) <= 256:
        raise ValueError(f"{what} must be a non-empty name of at most 256 characters")
    return value


def new_id() -> str:
    """A fresh random id (32 hex digits)."""
    return uuid.uuid4().hex


class EventError(ValueError):
    """An event could not be decoded or validated."""


class MalformedEvent(EventError):
    """The input is not a valid event of a known version."""


class UnknownEventVersion(EventError):
    """The event declares a schema version this code does not understand."""

    def __init__(self, version: object) -> None:
        super().__init__(
            f"unknown event schema version {version!r}: this agentmars reads versions "
            f"1..{SCHEMA_VERSION}; upgrade the reader or downgrade the writer"
        )
        self.version = version


class Event(BaseModel):
    """Fields every event has. Events are immutable and reject unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = SCHEMA_VERSION
    kind: str
    event_id: Id = Field(default_factory=new_id)
    mono_ns: Nanoseconds = Field(default_factory=time.monotonic_ns)
    wall_ns: Nanoseconds = Field(default_factory=time.time_ns)
    source: Source = "sdk"

    @field_validator("v", mode="before")
    @classmethod
    def _version_is_an_int(cls, value: object) -> object:
        # Literal[1] compares by equality, which would let true and 1.0 through.
        if type(value) is not int:
            raise ValueError(f"schema version must be an integer, got {value!r}")
        return value

    @model_validator(mode="after")
    def _unicode_text(self) -> Event:
        # JSON's "\ud800" escape reads (json.loads) as a lone surrogate, which no UTF-8
        # text holds: such an event could be neither written (to_json) nor kept. Every
        # string of every event, the keys and values of its mappings too, is checked
        # here, once, whoever builds the event.
        for name, value in self.__dict__.items():
            # Validated, a text is a str and a mapping a dict: exact types, cheaper to
            # test than isinstance (this runs for every event built, about 1 us).
            if type(value) is str:
                if value.isascii():
                    continue
            elif type(value) is not dict:
                continue
            surrogate = lone_surrogate(value)
            if surrogate is not None:
                raise PydanticCustomError(
                    "lone_surrogate",
                    "{field} holds the lone surrogate U+{code}, which no UTF-8 text can hold",
                    {"field": name, "code": f"{ord(surrogate):04X}"},
                )
        return self

    def to_json(self) -> str:
        """Compact JSON, the wire form of one event."""
        return self.model_dump_json(exclude_none=True)


def lone_surrogate(value: object) -> str | None:
    """The first lone surrogate of a string, or of the keys and values of a mapping of
    strings, else None."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return value[exc.start]
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            surrogate = lone_surrogate(key) or lone_surrogate(item)
            if surrogate is not None:
                return surrogate
    return None


class SessionEvent(Event):
    """An event that belongs to an agent session."""

    session_id: Id


class CallEvent(SessionEvent):
    """An event about one LLM or tool call: ``turn`` is the index of the session's
    LLM call the event belongs to (a tool call belongs to the turn whose LLM
    call requested it; None before the first LLM call). ``call_id`` is unique
    within its session only (tool calls may reuse the model's ids, such as
    ``call_0``): key calls by ``(session_id, call_id)``."""

    call_id: Id
    turn: Count | None = None


# --- session boundaries ----------------------------------------------------


class SessionStart(SessionEvent):
    kind: Literal["session_start"] = "session_start"
    agent: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class SessionEnd(SessionEvent):
    kind: Literal["session_end"] = "session_end"
    status: Literal["ok", "error", "cancelled"] = "ok"
    error: str | None = None
    turns: Count = 0
    duration_s: Seconds = 0.0


class SessionPause(SessionEvent):
    """The engine paused the session (a policy's ``tick``): its KV is dropped and its
    calls are held until a ``session_resume``. The admission half learns of it here."""

    kind: Literal["session_pause"] = "session_pause"
    reason: str = ""


class SessionResume(SessionEvent):
    """The engine resumed a paused session: its held calls run again."""

    kind: Literal["session_resume"] = "session_resume"


class SessionMove(SessionEvent):
    """Behind several engine replicas, the host moved the session from one to another
    (its admission half's ``moves``): its calls go to ``to_replica`` from now on, and
    the replica it left forgets it as if it had ended there."""

    kind: Literal["session_move"] = "session_move"
    from_replica: Count
    to_replica: Count


class TaskCost(Event):
    """An agent instance's predicted cost (seed 004 §4.2): the admission half of a
    policy that predicts it when the instance arrives (Justitia's, in the gateway, where
    the agent's input is read) says so for the engine half, which orders the instance's
    calls by it."""

    kind: Literal["task_cost"] = "task_cost"
    task_id: Id
    """The agent instance (``vllm_xargs.task_id``; a session without one is its own)."""
    agent: Id | None = None
    """Its agent type, as the predictor knows it."""
    cost: Annotated[float, Field(ge=0.0, le=float(MAX_COUNT), allow_inf_nan=False)]
    """KV token-time (seed 004 Eq. 1: KV tokens held x decode iterations held)."""


# --- GPU plane ---------------------------------------------------------------


class LLMSubmit(CallEvent):
    """``gpu_submit``: a call enters the serving path with its projected KV demand."""

    kind: Literal["llm_submit"] = "llm_submit"
    model: str | None = None
    operation: Literal["chat", "text_completion"] = "chat"
    stream: bool = False
    projected_prompt_tokens: Count | None = None
    projected_kv_blocks: Count | None = None
    max_tokens: Count | None = None
    follows_tool: bool = False
    """The call's context ends with a tool result (the agent resumes after a tool)."""
    expects_tool: bool = False
    """The call is expected to end in a tool call (the session then leaves the GPU)."""
    provider: Id | None = None
    """The GenAI provider as the client sees it (``openai`` for an OpenAI client, the
    provider of a LiteLLM routing string): what telemetry reports as the provider."""
    server_address: Id | None = None
    """The host the client sends the call to (the gateway's, for an agent behind it)."""
    server_port: Port | None = None


class LLMFirstToken(CallEvent):
    """``gpu_1st_token``: the first output token arrived; ``ttft_s`` is the launch delay."""

    kind: Literal["llm_first_token"] = "llm_first_token"
    ttft_s: Seconds


class LLMEnd(CallEvent):
    """``gpu_end``: the call finished; ``freed_blocks`` is set by the engine side."""

    kind: Literal["llm_end"] = "llm_end"
    status: Literal["ok", "error", "cancelled"] = "ok"
    error: str | None = None
    prompt_tokens: Count | None = None
    cached_tokens: Count | None = None
    output_tokens: Count | None = None
    freed_blocks: Count | None = None
    finish_reason: str | None = None
    ended_in_tool_call: bool = False
    duration_s: Seconds = 0.0
    response_id: Id | None = None
    """The answer's id (``chatcmpl-...``), as the engine named it."""
    response_model: Id | None = None
    """The model the answer says produced it."""

    @model_validator(mode="after")
    def _cached_within_prompt(self) -> LLMEnd:
        if (
            self.cached_tokens is not None
            and self.prompt_tokens is not None
            and self.cached_tokens > self.prompt_tokens
        ):
            raise ValueError(
                f"cached_tokens ({self.cached_tokens}) exceeds prompt_tokens ({self.prompt_tokens})"
            )
        return self


# --- CPU plane -----------------------------------------------------------------


class ToolEnqueue(CallEvent):
    kind: Literal["tool_enqueue"] = "tool_enqueue"
    tool: Id
    priority: Integer | None = None


class ToolStart(CallEvent):
    kind: Literal["tool_start"] = "tool_start"
    tool: Id
    queue_wait_s: Seconds = 0.0


class ToolEnd(CallEvent):
    kind: Literal["tool_end"] = "tool_end"
    tool: Id
    status: Literal["ok", "error", "timeout", "killed", "cancelled"] = "ok"
    exit_status: Integer | None = None
    error: str | None = None
    duration_s: ToolSeconds = 0.0
    cpu_time_s: ToolSeconds | None = None


class ToolStats(Event):
    """``tool_num``: host-side tool pressure (active tools, per-kind execution EMA)."""

    kind: Literal["tool_stats"] = "tool_stats"
    active: Count
    queued: Count = 0
    exec_ema_s: dict[Id, Seconds] = Field(default_factory=dict)
    cores: Count | None = None
    """The cores the host runs tools on (None: not said); a gateway reads the host's
    CPU capacity from it rather than guessing from its own machine."""


# --- control plane and KV ---------------------------------------------------------


class WindowUpdate(Event):
    """``window_update``: the admission window changed under dual pressure."""

    kind: Literal["window_update"] = "window_update"
    window: Count
    previous: Count
    reason: str = ""
    kv_free_blocks: Count | None = None
    active_tools: Count | None = None


class KVStats(Event):
    """Block-pool state in the allocator's native unit (seed 000 §4.1): the one shape
    KV figures travel in, from the vLLM plugin's side channel, the wall-clock twin and
    the simulator alike."""

    kind: Literal["kv_stats"] = "kv_stats"
    total_blocks: Count
    free_blocks: Count
    used_blocks: Count
    pinned_blocks: Count = 0
    pins: Count = 0
    """Sessions holding pinned blocks."""
    released: dict[Id, Count] = Field(default_factory=dict, max_length=MAX_REASONS)
    """Pins released so far, by reason (``ReleaseReason``)."""
    cpu_total_blocks: Count = 0
    cpu_free_blocks: Count = 0
    steps: Count | None = None
    """Engine steps that scheduled any token so far, when the engine counts them."""
    replica: Count | None = None
    """Which engine replica the figures are of, behind a gateway that routes over
    several (None: the only one)."""

    @classmethod
    def of_pool(cls, *, total: int, free: int, pinned: int, **fields: Any) -> KVStats:
        """Figures read off a block pool: used is the rest of the pool, and the pinned
        count is capped at it (an engine that counts a block once per pin holding it,
        as pins sharing a prefix do, or reads its counters while another thread moves
        them, can count more)."""
        used = total - free
        return cls(
            total_blocks=total,
            free_blocks=free,
            used_blocks=used,
            pinned_blocks=min(pinned, used),
            **fields,
        )

    @model_validator(mode="after")
    def _blocks_add_up(self) -> KVStats:
        if self.free_blocks + self.used_blocks > self.total_blocks:
            raise ValueError(
                f"free_blocks + used_blocks ({self.free_blocks} + {self.used_blocks}) "
                f"exceeds total_blocks ({self.total_blocks})"
            )
        if self.pinned_blocks > self.used_blocks:
            raise ValueError(
                f"pinned_blocks ({self.pinned_blocks}) exceeds used_blocks ({self.used_blocks})"
            )
        return self


class KVPin(SessionEvent):
    """The engine pinned the session's KV at the end of a call (a policy's ``Pin``, at a
    tool transition): ``blocks`` stay off the free queue until a ``kv_unpin``."""

    kind: Literal["kv_pin"] = "kv_pin"
    blocks: Count
    ttl_s: Seconds | None = None
    """How long the pin may be held at most (None: no TTL, held until released)."""


class KVUnpin(SessionEvent):
    """The engine released the session's pin, after ``held_s``."""

    kind: Literal["kv_unpin"] = "kv_unpin"
    blocks: Count
    reason: ReleaseReason
    held_s: Seconds = 0.0


AnyEvent: TypeAlias = Annotated[
    SessionStart
    | SessionEnd
    | SessionPause
    | SessionResume
    | SessionMove
    | TaskCost
    | LLMSubmit
    | LLMFirstToken
    | LLMEnd
    | ToolEnqueue
    | ToolStart
    | ToolEnd
    | ToolStats
    | WindowUpdate
    | KVStats
    | KVPin
    | KVUnpin,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)

EVENT_KINDS: tuple[str, ...] = tuple(
    cls.model_fields["kind"].default
    for cls in (
        SessionStart, SessionEnd, SessionPause, SessionResume, SessionMove, TaskCost, LLMSubmit,
        LLMFirstToken, LLMEnd, ToolEnqueue, ToolStart, ToolEnd, ToolStats,
        WindowUpdate, KVStats, KVPin, KVUnpin,
    )
)  # fmt: skip


# --- decoding ------------------------------------------------------------------


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "event"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def decode_event(data: str | bytes | Mapping[str, Any]) -> AnyEvent:
    """Decode one event from JSON text or a parsed mapping.

    Raises ``UnknownEventVersion`` for a version this code cannot read and
    ``MalformedEvent`` (with every field error spelled out) for anything else.
    """
    if isinstance(data, str | bytes):
        # Fast path for the common case, a valid event: pydantic-core parses and
        # validates in one pass. Anything it rejects is decoded again below to say why.
        try:
            return _ADAPTER.validate_json(data, strict=True)
        except ValidationError:
            pass
        try:
            data = json.loads(data)
        except (ValueError, RecursionError) as exc:
            # ValueError covers JSONDecodeError, UnicodeDecodeError and integers over
            # Python's digit limit; RecursionError very deep nesting. All bad input.
            raise MalformedEvent(f"not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise MalformedEvent(f"an event is a JSON object, got {type(data).__name__}")
    version = data.get("v")
    if version is None:
        raise MalformedEvent("missing schema version field 'v'")
    if type(version) is not int or not 1 <= version <= SCHEMA_VERSION:
        raise UnknownEventVersion(version)
    if "kind" not in data:
        raise MalformedEvent(
            f"missing event kind field 'kind'; known kinds: {', '.join(EVENT_KINDS)}"
        )
    if data["kind"] not in EVENT_KINDS:
        raise MalformedEvent(
            f"unknown event kind {data['kind']!r}; known kinds: {', '.join(EVENT_KINDS)}"
        )
    try:
        # Strict: the wire form is typed, so "12" is not a count and "yes" not a bool
        # (an int is still accepted where a float is expected).
        return _ADAPTER.validate_python(dict(data), strict=True)
    except ValidationError as exc:
        raise MalformedEvent(f"invalid {data['kind']} event: {_describe(exc)}") from None


@dataclass
class LineError:
    """A JSONL line that could not be decoded (1-based line number)."""

    line: int
    error: EventError

    def __str__(self) -> str:
        return f"line {self.line}: {self.error}"


@dataclass
class DecodedStream:
    """What ``decode_jsonl`` read: the good events and a report of the bad lines."""

    events: list[AnyEvent] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)

    @property
    def unknown_versions(self) -> list[LineError]:
        return [e for e in self.errors if isinstance(e.error, UnknownEventVersion)]


def decode_jsonl(lines: str | bytes | Iterable[str | bytes]) -> DecodedStream:
    """Decode a JSONL stream, keeping going past bad lines and reporting them.

    Blank lines are skipped. A stream from a newer writer thus yields the events
    this reader understands plus one ``UnknownEventVersion`` per newer line.
    Lines end at ``\n`` only (a ``\r`` before it is JSON whitespace): JSON text may
    hold U+2028, U+2029 or U+0085 unescaped, which ``str.splitlines`` would split on.
    """
    if isinstance(lines, str):
        lines = lines.split("\n")
    elif isinstance(lines, bytes):
        lines = lines.split(b"\n")
    result = DecodedStream()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            result.events.append(decode_event(line))
        except EventError as exc:
            result.errors.append(LineError(number, exc))
    return result


def encode_jsonl(events: Iterable[Event]) -> str:
    """JSONL text for a sequence of events (one line each, newline-terminated)."""
    return "".join(event.to_json() + "\n" for event in events)
