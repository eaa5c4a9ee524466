"""What the gateway reads of a request before forwarding it: the session it belongs to,
the call's id, the tool markers and the scheduling hints (``call_metadata``).

The SDK's wire contract (``agentmars.sdk.integrations.request``) names the session in
header ``X-Session-ID``, body ``session_id`` and ``vllm_xargs.session_id`` and carries
everything else in ``vllm_xargs``. An agent that does not use the SDK still names its
conversation in its own ecosystem's fields (OpenAI's ``prompt_cache_key``, LiteLLM's
``x-litellm-session-id``, Anthropic's ``metadata.user_id``, the Responses API's
``conversation``...): the gateway reads those too, so an unmodified agent gets one
session per conversation instead of one per call. A Responses call may instead continue
an earlier answer (``previous_response_id``): it joins the session of the call that gave
that answer, which the gateway remembers (``ResponseSessions``). Where each API carries
its tool markers and prompt is ``llm_apis``'.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentmars.sdk import wire
from agentmars.sdk.events import new_id
from agentmars.sdk.wire import SESSION_HEADER
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


MAX_RESPONSE_IDS = 65_536
"""Answers whose session ``ResponseSessions`` remembers (ours: four times the seats,
``admission.MAX_ADMITTED_SESSIONS``, room for each open session's newest answer, which
its chain goes on from, and for older ones it may branch from; a few hundred bytes
each). Past it the least recently used is forgotten: a call continuing it names its
session after it, as after a restart."""


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
    """The request named no session and its answer cannot be continued: it is a
    one-call session of its own, ended with the call."""
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


class ResponseSessions:
    """The session of each answer a later call may continue (``LLMApi.continues_field``),
    by the answer's response id, at most ``limit``, least recently used first (on the
    event loop only). Kept past the session's end: a chain continued after its session
    idled out is that session again."""

    def __init__(self, limit: int = MAX_RESPONSE_IDS) -> None:
        self.limit = limit
        self._sessions: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def remember(self, response_id: str, session_id: str) -> None:
        self._sessions[response_id] = session_id
        self._sessions.move_to_end(response_id)
        if len(self._sessions) > self.limit:
            self._sessions.popitem(last=False)

    def session_of(self, response_id: str) -> str | None:
        session_id = self._sessions.get(response_id)
        if session_id is not None:
            self._sessions.move_to_end(response_id)
        return session_id


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
    """The value at a session source, and the source's name for an error. The places:
    ``header``, ``body``, ``metadata`` (a field of the body's ``metadata``) and
    ``id_or_object`` (a body field holding the id or an object with it, ``{"id":
    ...}``)."""
    if place == "header":
        return headers.get(name), f"header {name}"
    if place == "metadata":
        metadata = body.get("metadata")
        return (metadata.get(name) if isinstance(metadata, Mapping) else None), f"metadata.{name}"
    value = body.get(name)
    if place == "id_or_object" and isinstance(value, Mapping):
        # Without its id the object names no session, and the engine would refuse it.
        return value.get("id", ""), f"{name}.id"
    return value, name


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


def _continued_session_id(
    body: Mapping[str, Any], api: LLMApi, answers: ResponseSessions | None
) -> str | None:
    """The session of the answer the call continues. One the gateway does not know
    (it restarted, or forgot it) names the session itself: the calls that continue
    this one then join it."""
    if api.continues_field is None or (value := body.get(api.continues_field)) is None:
        return None
    previous = _check_id(value, api.continues_field)
    return (answers.session_of(previous) if answers is not None else None) or previous


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


def call_metadata(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    api: LLMApi = CHAT,
    answers: ResponseSessions | None = None,
) -> CallMeta:
    """The metadata of a request to ``api`` (``headers`` with lower-case names), with
    the sessions of the ``answers`` a call may continue; ``BadRequest`` names the
    field of a value that cannot be used.

    The session is named by the first of these sources present:

    1. agentmars' own: header ``X-Session-ID``, body ``session_id``,
       ``vllm_xargs.session_id`` (several may be given; if they disagree: 400);
    2. body ``prompt_cache_key`` (OpenAI's; OpenHands sets it to its conversation id);
    3. header ``x-litellm-session-id`` (LiteLLM's);
    4. body ``program_id`` (an Autellix / Continuum-style program id);
    5. header ``X-Dynamo-Session-ID`` (NVIDIA Dynamo's);
    6. header ``x-session-token``;
    7. the API's own (``LLMApi.session_fields``: Anthropic's ``metadata.user_id``,
       the Responses API's ``conversation``);
    8. the answer the call continues (``LLMApi.continues_field``: the Responses API's
       ``previous_response_id``): the session of the call that gave it, else the
       answer's id itself.

    The sources below the first present one are not read, so they neither conflict
    nor fail (an OpenHands agent sends its conversation id as both
    ``prompt_cache_key`` and ``x-litellm-session-id``; another client may send
    unrelated values). Without any, the call is a one-call session of its own
    (``ephemeral``), unless a later call may continue its answer (``stores_answer``):
    then its session is ``resp-<call id>``, which such a call joins and which ends,
    as any session whose client never says goodbye, when it idles out. Session, call
    and task ids are 1-256 printable ASCII characters.
    """
    xargs = body.get("vllm_xargs", {})
    if not isinstance(xargs, Mapping):
        raise BadRequest("vllm_xargs must be a JSON object")
    session_id = (
        _own_session_id(headers, body, xargs)
        or _foreign_session_id(headers, body, api)
        or _continued_session_id(body, api, answers)
    )
    call_id = _id(xargs, wire.CALL_ID) or new_id()
    ephemeral = session_id is None and not api.stores_answer(body)
    if session_id is None:
        session_id = f"call-{new_id()}" if ephemeral else f"resp-{call_id}"
    try:
        turn = wire.turn(xargs)
        follows_tool = wire.flag(xargs, wire.FOLLOWS_TOOL, api.follows_tool(body))
        expects_tool = wire.flag(xargs, wire.EXPECTS_TOOL, api.tools_offered(body))
        expected_tool_s = wire.seconds(xargs, wire.EXPECTED_TOOL_S)
    except wire.HintError as error:
        raise BadRequest(str(error)) from None
    return CallMeta(
        session_id=session_id,
        call_id=call_id,
        turn=turn,
        follows_tool=follows_tool,
        expects_tool=expects_tool,
        # The SDK's own projection (characters / 4); 1 for a body with no prompt.
        prompt_tokens=api.prompt_tokens(body) or 1,
        ephemeral=ephemeral,
        next_tool=_name(xargs, wire.NEXT_TOOL, min_length=1),
        expected_tool_s=expected_tool_s,
        agent=_name(xargs, wire.AGENT, min_length=0),
        task_id=_id(xargs, wire.TASK_ID),
        prompt_text=api.prompt_text(body),
    )
