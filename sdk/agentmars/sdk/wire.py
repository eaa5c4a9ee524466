"""The wire contract between agentmars' parts, in one place: how a call names its
session and carries its hints, how the gateway answers with a tool priority, and the
topics of the engine's side channel. The SDK writes these; the gateway, the twin, the
vLLM plugin and the routers read them, each through this module (every part may
import the SDK).

A call names its session in header ``X-Session-ID``, body ``session_id`` or
``vllm_xargs.session_id``, and carries everything else in ``vllm_xargs`` (vLLM's
``extra_args``, which take str / int / float only: the flags are 0/1 ints). The readers
below check each hint the same way wherever it is read; they raise ``HintError``, which
each reader turns into its own 400 answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from agentmars.sdk.events import MAX_COUNT, MAX_SECONDS

SESSION_HEADER: Final = "X-Session-ID"
TOOL_PRIORITY_HEADER: Final = "X-Agentmars-Tool-Priority"
"""The gateway's answer: where the session's tool calls go in the sandbox pool's
queue (lower first)."""

STREAM_PATH: Final = "/v1/events/stream"
"""The gateway's event stream: every event from then on, as SSE (bearer token)."""

XARGS: Final = "vllm_xargs"
SESSION_ID: Final = "session_id"
CALL_ID: Final = "call_id"
TURN: Final = "turn"
FOLLOWS_TOOL: Final = "follows_tool"
EXPECTS_TOOL: Final = "expects_tool"
NEXT_TOOL: Final = "next_tool"
EXPECTED_TOOL_S: Final = "expected_tool_s"
AGENT: Final = "agent"
TASK_ID: Final = "task_id"

KV_TOPIC: Final = b"agentmars.kv"
"""The engine's side channel: the topic frame of its KV figures (the second frame: a
``kv_stats`` event)."""
EVENT_TOPIC: Final = b"agentmars.event"
"""The engine's side channel: the topic frame of its engine half's events (the second
frame: the event's JSON)."""


class HintError(ValueError):
    """A hint in ``vllm_xargs`` is of the wrong type or out of range; the message names
    the field."""


def flag(xargs: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """A 0/1 marker (``follows_tool``, ``expects_tool``); bools are accepted too."""
    value = xargs.get(name, default)
    if isinstance(value, float) or value not in (0, 1):
        raise HintError(f"{XARGS}.{name} must be 0 or 1, got {value!r:.80}")
    return bool(value)


def turn(xargs: Mapping[str, Any]) -> int | None:
    """The call's turn in its session, from 0."""
    value = xargs.get(TURN)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise HintError(f"{XARGS}.{TURN} must be an integer from 0 to 2**53, got {value!r:.80}")
    return value


def seconds(xargs: Mapping[str, Any], name: str) -> float | None:
    """A duration hint (``expected_tool_s``): a number from 0 to ``MAX_SECONDS``."""
    value = xargs.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HintError(f"{XARGS}.{name} must be a number of seconds, got {value!r:.80}")
    # Compared as it came: an integer past a float's range must not reach float(), and
    # NaN fails the comparison.
    if not 0 <= value <= MAX_SECONDS:
        raise HintError(
            f"{XARGS}.{name} must be from 0 to {MAX_SECONDS:g} seconds, got {value!r:.80}"
        )
    return float(value)
