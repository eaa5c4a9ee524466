"""What the gateway reads of a request before forwarding it: the session it belongs to,
the call's id, the tool markers and the scheduling hints (``call_metadata``).

The SDK's wire contract (``agentmars.sdk.integrations.request``) names the session in
header ``X-Session-ID``, body ``session_id`` and ``vllm_xargs.session_id`` and carries
everything else in ``vllm_xargs``. An agent that does not use the SDK still names its
conversation in its own ecosystem's fields (OpenAI's ``prompt_cache_key``, LiteLLM's
``x-litellm-session-id``, Anthropic's ``metadata.user_id``...): the gateway reads those
too, so an unmodified agent gets one session per conversation instead of one per call.
Where each API carries its tool markers and prompt is ``llm_apis``'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentmars.sdk.events import MAX_COUNT, MAX_SECONDS, new_id
from agentmars.sdk.integrations.request import SESSION_HEADER
from agentmars.server.gateway.llm_apis import CHAT, LLMApi

MAX_NAME = 256
"""Longest id or name accepted (the events' ``Id`` bound)."""
FOREIGN_SESSION_FIELDS: tuple[tuple[str, str], ...] = (
    ("body", "prompt_cache_key"),  # OpenAI; OpenHands sets it to its conversation id
    ("header", "x-litellm-session-id"),  # LiteLLM
    ("body", "program_id"),  # Autellix / Continuum: the agent program
    ("header", "x-dynamo-session-id"),  # NVIDIA Dynamo
    ("header", "x-session-token"),
)
"""Where other systems name the session, highest precedence first (after agentmars'
own fields)."""


class BadRequest(ValueError):
    """The request's metadata is unusable; the message becomes the 400 body."""


@dataclass(frozen=True, slots=True)
class CallMeta:
    """What the gateway knows of one call before forwarding it."""

    session_id: str
    call_id: str
    """The client's ``vllm_xargs.call_id`` (the SDK's call id), else a fresh one: the
    gateway's events and the engine name the call by it."""
    turn: int | None
    follows_tool: bool
    expects_tool: bool
    prompt_tokens: int
    ephemeral: bool
    """The request named no session: it is a one-call session of its own."""
    next_tool: str | None = None
    """The tool the agent expects to run after this call."""
    expected_tool_s: float | None = None
    """How long the agent expects that tool to run, in seconds."""
    agent: str | None = None
    """The agent's name (its kind, e.g. ``coder``)."""
    task_id: str | None = None
    """The agent instance (seed 004): the task that a fan-out agent's branch sessions
    share."""
    prompt_text: str = ""
    """The prompt's text, bounded (``llm_apis.MAX_PROMPT_TEXT``)."""

    def hints(self) -> dict[str, str | float]:
        """The optional fields the client gave, as ``vllm_xargs`` entries."""
        named = {
            "next_tool": self.next_tool,
            "expected_tool_s": self.expected_tool_s,
            "agent": self.agent,
            "task_id": self.task_id,
        }
        return {name: value for name, value in named.items() if value is not None}


def _check_id(value: object, field: str) -> str:
    # Session ids travel to the engine in the X-Session-ID header: printable ASCII only.
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= MAX_NAME
        or not (value.isascii() and value.isprintable())
    ):
        raise BadRequest(
            f"{field} must be a non-empty string of at most {MAX_NAME} printable ASCII "
            f"characters, got {value!r:.80}"
        )
    return value


def _own_session_id(
    headers: Mapping[str, str], body: Mapping[str, Any], xargs: Mapping[str, Any]
) -> str | None:
    """agentmars' own fields: any of them, but they must agree."""
    named = [
        (f"header {SESSION_HEADER}", headers.get(SESSION_HEADER.lower())),
        ("session_id", body.get("session_id")),
        ("vllm_xargs.session_id", xargs.get("session_id")),
    ]
    ids = sorted({_check_id(value, field) for field, value in named if value is not None})
    if len(ids) > 1:
        raise BadRequest(f"the request names different sessions: {ids}")
    return ids[0] if ids else None


def _source(
    place: str, name: str, headers: Mapping[str, str], body: Mapping[str, Any]
) -> tuple[object, str]:
    """The value at a session source, and the source's name for an error."""
    if place == "header":
        return headers.get(name), f"header {name}"
    if place == "metadata":
        metadata = body.get("metadata")
        return (metadata.get(name) if isinstance(metadata, Mapping) else None), f"metadata.{name}"
    return body.get(name), name


def _foreign_session_id(
    headers: Mapping[str, str], body: Mapping[str, Any], api: LLMApi
) -> str | None:
    """The first of ``FOREIGN_SESSION_FIELDS`` and the API's own present; the others
    are not read."""
    for place, name in (*FOREIGN_SESSION_FIELDS, *api.session_fields):
        value, field = _source(place, name, headers, body)
        if value is not None:
            return _check_id(value, field)
    return None


def _flag(xargs: Mapping[str, Any], name: str, default: bool) -> bool:
    value = xargs.get(name, default)
    # vLLM's extra_args carry ints, so the SDK sends 0/1; bools are accepted too.
    if value not in (0, 1) or isinstance(value, float):
        raise BadRequest(f"vllm_xargs.{name} must be 0 or 1, got {value!r}")
    return bool(value)


def _turn(xargs: Mapping[str, Any]) -> int | None:
    turn = xargs.get("turn")
    if turn is None:
        return None
    if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn <= MAX_COUNT:
        raise BadRequest(f"vllm_xargs.turn must be an integer from 0 to 2**53, got {turn!r:.80}")
    return turn


def _id(xargs: Mapping[str, Any], name: str) -> str | None:
    value = xargs.get(name)
    return None if value is None else _check_id(value, f"vllm_xargs.{name}")


def _name(xargs: Mapping[str, Any], name: str, *, min_length: int) -> str | None:
    value = xargs.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not min_length <= len(value) <= MAX_NAME:
        least = "a non-empty string" if min_length else "a string"
        raise BadRequest(
            f"vllm_xargs.{name} must be {least} of at most {MAX_NAME} characters, got {value!r:.80}"
        )
    return value


def _seconds(xargs: Mapping[str, Any], name: str) -> float | None:
    value = xargs.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"vllm_xargs.{name} must be a number of seconds, got {value!r:.80}")
    # Compared as it came: an integer past a float's range must not reach float().
    if not 0 <= value <= MAX_SECONDS:
        raise BadRequest(
            f"vllm_xargs.{name} must be from 0 to {MAX_SECONDS:g} seconds, got {value!r:.80}"
        )
    return float(value)


def call_metadata(
    headers: Mapping[str, str], body: Mapping[str, Any], api: LLMApi = CHAT
) -> CallMeta:
    """The metadata of a request to ``api`` (``headers`` with lower-case names);
    ``BadRequest`` names the field of a value that cannot be used.

    The session is named by the first of these sources present:

    1. agentmars' own: header ``X-Session-ID``, body ``session_id``,
       ``vllm_xargs.session_id`` (several may be given; if they disagree: 400);
    2. body ``prompt_cache_key`` (OpenAI's; OpenHands sets it to its conversation id);
    3. header ``x-litellm-session-id`` (LiteLLM's);
    4. body ``program_id`` (an Autellix / Continuum-style program id);
    5. header ``X-Dynamo-Session-ID`` (NVIDIA Dynamo's);
    6. header ``x-session-token``;
    7. the API's own (``LLMApi.session_fields``: Anthropic's ``metadata.user_id``).

    The sources below the first present one are not read, so they neither conflict
    nor fail (an OpenHands agent sends its conversation id as both
    ``prompt_cache_key`` and ``x-litellm-session-id``; another client may send
    unrelated values). Without any, the call is a one-call session of its own
    (``ephemeral``). Session, call and task ids are 1-256 printable ASCII characters.
    """
    xargs = body.get("vllm_xargs", {})
    if not isinstance(xargs, Mapping):
        raise BadRequest("vllm_xargs must be a JSON object")
    session_id = _own_session_id(headers, body, xargs)
    if session_id is None:
        session_id = _foreign_session_id(headers, body, api)
    return CallMeta(
        session_id=session_id or f"call-{new_id()}",
        call_id=_id(xargs, "call_id") or new_id(),
        turn=_turn(xargs),
        follows_tool=_flag(xargs, "follows_tool", api.follows_tool(body)),
        expects_tool=_flag(xargs, "expects_tool", api.tools_offered(body)),
        # The SDK's own projection (characters / 4); 1 for a body with no prompt.
        prompt_tokens=api.prompt_tokens(body) or 1,
        ephemeral=session_id is None,
        next_tool=_name(xargs, "next_tool", min_length=1),
        expected_tool_s=_seconds(xargs, "expected_tool_s"),
        agent=_name(xargs, "agent", min_length=0),
        task_id=_id(xargs, "task_id"),
        prompt_text=api.prompt_text(body),
    )
