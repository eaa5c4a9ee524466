"""What a tool asks the sandbox to run, and what comes back."""

from __future__ import annotations

import re
from collections import deque
from itertools import islice
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentmars.sdk.events import MAX_TOOL_S

MAX_COMMAND_BYTES = 64 * 1024
"""Upper bound on argv + env + cwd: a command line is not a transport for data
(stdin is, up to ``MAX_STDIN_BYTES``). Our choice; Linux's own limit is larger."""
MAX_ARGS = 4096
"""Arguments in ``command``. With ``MAX_ENV_VARS`` (each two arguments of the sandbox
init) and the mounts, the sandbox's command line stays well below bubblewrap's limit of
9,000 arguments, so a valid spec never fails inside bubblewrap."""
MAX_ENV_VARS = 1024
"""Variables in ``env`` (our choice; see ``MAX_ARGS``)."""
MAX_STDIN_BYTES = 16 * 1024 * 1024
MAX_TIMEOUT_S = MAX_TOOL_S
"""A tool call's longest timeout: the stream's bound on a tool's duration."""
MAX_OUTPUT_CAP_BYTES = 16 * 1024 * 1024
"""Largest ``output_cap_bytes``: the pool holds up to this much per stream of a call
in its own memory, outside the slot's memory cgroup (our choice: 16 MiB of a tool's
output is more than a model reads)."""
# NOTE: fullmatch, never match with "$": "$" also matches before a final newline.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_TEXT_CHECKED_ITEMS = 2 * (MAX_ARGS + 2 * MAX_ENV_VARS)
"""How many values of a request ``UnicodeModel`` looks at, at most: twice what a valid
request holds (the rest of a longer one is refused by the fields' own limits)."""

ExecStatus = Literal["ok", "error", "timeout", "killed", "cancelled"]
TRUNCATION_MARKER = "\n[agentmars: output truncated, {dropped} more bytes not shown]\n"


class SandboxError(Exception):
    """A request the sandbox cannot serve (bad input, unknown session, pool closed)."""


class UnknownSession(SandboxError):
    """The session has no workspace in this pool (never opened, or closed)."""


def check_session_id(session_id: str) -> str:
    """Session ids name workspace directories: 1-128 characters of [A-Za-z0-9._-],
    not starting with a dot or dash (so never ``..`` or an option)."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise SandboxError(
            f"invalid session id {session_id!r}: use 1-128 characters of letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    return session_id


def lone_surrogate_in(value: object) -> str | None:
    """Where, in decoded JSON (``value``: dicts, lists, strings), a string holds a lone
    surrogate (JSON's ``"\\ud800"`` decodes to one), which is not Unicode text: no
    UTF-8 can carry it, to a file name, a command line or an answer. None if nowhere.
    Breadth first, so the request's own fields come first, and within
    ``_TEXT_CHECKED_ITEMS`` values."""
    pending: deque[tuple[object, str]] = deque([(value, "")])
    left = _TEXT_CHECKED_ITEMS
    while pending:
        item, where = pending.popleft()
        if isinstance(item, str):
            if not item.isascii() and _LONE_SURROGATE.search(item):
                return where or "the value"
        elif isinstance(item, dict):
            for key, inner in islice(item.items(), left):
                if isinstance(key, str) and not key.isascii() and _LONE_SURROGATE.search(key):
                    return f"a name in {where}" if where else "a field name"
                pending.append((inner, f"{where}[{key!r}]" if where else str(key)))
            left -= len(item)
        elif isinstance(item, list):
            pending.extend((inner, f"{where}[{i}]") for i, inner in islice(enumerate(item), left))
            left -= len(item)
        if left <= 0:
            break
    return None


class UnicodeModel(BaseModel):
    """A request whose every string must be Unicode text: one with a lone surrogate
    anywhere is refused (422 through the service), with where it is, before any field
    is looked at."""

    @model_validator(mode="before")
    @classmethod
    def _strings_are_unicode(cls, data: object) -> object:
        where = lone_surrogate_in(data)
        if where is not None:
            raise ValueError(
                f"{where} is not Unicode text: it holds a lone surrogate (a \\ud800-\\udfff "
                "escape without its pair, or its bytes), which UTF-8 cannot carry"
            )
        return data


class ExecSpec(UnicodeModel):
    """One command to run in a session's sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    command: Annotated[list[str], Field(min_length=1, max_length=MAX_ARGS)]
    """argv; run a shell explicitly (``["bash", "-lc", "..."]``) when one is wanted."""
    cwd: str = "."
    """Working directory relative to the session's workspace (must stay inside it)."""
    env: Annotated[dict[str, str], Field(max_length=MAX_ENV_VARS)] = Field(default_factory=dict)
    """Variables added to the sandbox's clean environment."""
    stdin: str | None = None
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] | None = None
    """Wall-clock limit; the whole process tree is killed when it passes. None: the
    pool's default."""
    output_cap_bytes: Annotated[int, Field(ge=0, le=MAX_OUTPUT_CAP_BYTES)] | None = None
    """Bytes kept per stream (stdout, stderr), at most ``MAX_OUTPUT_CAP_BYTES``; the
    rest is counted and dropped. None: the pool's default."""

    @field_validator("command")
    @classmethod
    def _command_is_plain_text(cls, command: list[str]) -> list[str]:
        if not command[0]:
            raise ValueError("command[0] (the program) must not be empty")
        if any("\x00" in arg for arg in command):
            raise ValueError("command arguments must not contain NUL bytes")
        return command

    @field_validator("env")
    @classmethod
    def _env_names_are_valid(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"invalid environment variable name {name!r}")
            if "\x00" in value:
                raise ValueError(f"environment variable {name} contains a NUL byte")
        return env

    @field_validator("cwd")
    @classmethod
    def _cwd_stays_inside(cls, cwd: str) -> str:
        parts = cwd.replace("\\", "/").split("/")
        if cwd.startswith("/") or ".." in parts or "\x00" in cwd:
            raise ValueError(f"cwd {cwd!r} must be a relative path inside the workspace")
        return cwd

    @field_validator("stdin")
    @classmethod
    def _stdin_is_bounded(cls, stdin: str | None) -> str | None:
        if stdin is not None and len(stdin.encode()) > MAX_STDIN_BYTES:
            raise ValueError(f"stdin is larger than {MAX_STDIN_BYTES} bytes")
        return stdin

    @model_validator(mode="after")
    def _command_is_bounded(self) -> ExecSpec:
        size = sum(len(a.encode()) + 1 for a in self.command)
        size += sum(len(k) + len(v.encode()) + 2 for k, v in self.env.items()) + len(self.cwd)
        if size > MAX_COMMAND_BYTES:
            raise ValueError(
                f"command, env and cwd total {size} bytes; the limit is {MAX_COMMAND_BYTES}"
            )
        return self


class ExecResult(BaseModel):
    """How a command ended. ``status``: ``ok`` (exit 0), ``error`` (non-zero exit),
    ``timeout`` (killed at its time limit), ``killed`` (by a signal from outside or
    a resource limit), ``cancelled`` (interrupted on request)."""

    model_config = ConfigDict(frozen=True)

    status: ExecStatus
    exit_status: int | None
    """The exit code, or minus the signal number that ended the process."""
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_s: float
    cpu_s: float | None = None
    queue_wait_s: float = 0.0
    slot: int | None = None
    cores: list[int] = Field(default_factory=list)
    backend: str = ""
    detail: str | None = None
    """Why a run ended abnormally, in words (limit hit, sandbox failure)."""
