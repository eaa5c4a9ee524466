"""Whether the twin's chat answer calls a tool, which one, and with what arguments.

The request's ``tools`` and ``tool_choice`` are read as OpenAI defines them:
``"none"`` answers in text; ``"required"`` or a named function always calls one tool;
``"auto"`` (or no ``tool_choice``) decides deterministically, so an agent loop on the
twin runs a few turns and then ends:

1. ``vllm_xargs.expects_tool`` = 0 (a replayed workload's script, or a client that
   knows): text.
2. ``vllm_xargs.next_tool``, when offered: that tool (the script names it).
3. From turn ``TOOL_TURNS`` of the session on (``vllm_xargs.turn``, else the session's
   calls so far; a call without a session is a first call): ``FINISH_TOOL`` when
   offered (an OpenHands agent ends its conversation on it); else text, which ends
   an agent loop such as the OpenAI Agents SDK's or an Anthropic client's.
4. Else the first offered tool other than ``FINISH_TOOL``.

NOTE: ``expects_tool`` = 1 does not keep a session from finishing (step 3): the SDK
and the gateway set it whenever tools are offered, so it says "a tool may come", not
which (a script that wants one names it: step 2). The arguments are
``schema_values.value_for`` the tool's ``parameters``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentmars.server.engines.twin.engine import LiveError
from agentmars.server.engines.twin.schema_values import SchemaError, json_for

TOOL_TURNS = 3
"""Calls of a session answered with a working tool before ``auto`` turns to finishing
(ours: enough for an agent loop to run a tool, read its result and go on)."""
FINISH_TOOL = "finish"
"""The tool that ends an OpenHands agent's conversation."""
NO_PARAMETERS: Mapping[str, Any] = {"type": "object"}
"""A function without ``parameters`` takes none (OpenAI's reading)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of an offered function, as the answer's tokens spell it."""

    name: str
    arguments: str
    """JSON text."""
    id: str


@dataclass(frozen=True, slots=True)
class SessionHints:
    """What the request's session metadata says of the coming answer."""

    turn: int
    """The call's place in its session (0: the first call)."""
    expects_tool: bool | None = None
    """None: the client did not say."""
    next_tool: str | None = None


def offered_tools(body: Mapping[str, Any]) -> dict[str, object]:
    """The request's functions, name -> ``parameters`` schema, in the order offered."""
    tools = body.get("tools")
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise LiveError("'tools' must be a list of function tools", "tools")
    offered: dict[str, object] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or tool.get("type") != "function":
            raise LiveError(
                "each tool must be {'type': 'function', 'function': {...}} "
                "(the simulated engine calls functions only)",
                "tools",
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise LiveError("each function must have a non-empty string 'name'", "tools")
        offered.setdefault(name, function.get("parameters", NO_PARAMETERS))
    return offered


def tool_call_for(body: Mapping[str, Any], hints: SessionHints) -> ToolCall | None:
    """The tool call that answers the request, or None for a text answer."""
    tools = offered_tools(body)
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        name = _auto_choice(tools, hints)
    elif choice == "none":
        name = None
    elif choice == "required":
        name = _auto_choice(tools, hints) or _working_tool(tools)
    else:
        name = _named_choice(choice, tools)
    return None if name is None else _call(name, tools[name])


def _auto_choice(tools: Mapping[str, object], hints: SessionHints) -> str | None:
    if not tools or hints.expects_tool is False:
        return None
    if hints.next_tool in tools:
        return hints.next_tool
    if hints.turn >= TOOL_TURNS:
        return FINISH_TOOL if FINISH_TOOL in tools else None
    return _working_tool(tools)


def _working_tool(tools: Mapping[str, object]) -> str:
    if not tools:
        raise LiveError("tool_choice 'required' needs 'tools' to choose from", "tool_choice")
    return next((name for name in tools if name != FINISH_TOOL), FINISH_TOOL)


def _named_choice(choice: object, tools: Mapping[str, object]) -> str:
    function = None
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        function = choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise LiveError(
            "'tool_choice' must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if name not in tools:
        raise LiveError(
            f"tool_choice names the function {name!r:.80}, which 'tools' does not offer",
            "tool_choice",
        )
    return name


def _call(name: str, parameters: object) -> ToolCall:
    try:
        arguments = json_for(parameters)
    except SchemaError as error:
        raise LiveError(f"the parameters of function {name!r:.80}: {error}", "tools") from None
    return ToolCall(name, arguments, f"call_{uuid.uuid4().hex[:24]}")
