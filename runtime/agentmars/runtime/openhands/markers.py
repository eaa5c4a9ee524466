"""The session markers of one conversation's LLM calls, kept from its events.

OpenHands sends an LLM's ``litellm_extra_body`` as the request's extra body on every
call (the same dict: ``openhands/sdk/llm/options/common.py``), so writing the markers
into that dict between calls puts them on the next call's wire: ``session_id`` (the
conversation id) and ``vllm_xargs`` with ``session_id``, ``turn``, ``follows_tool``,
``expects_tool`` and, when known, ``next_tool`` (the gateway's and vLLM's fields:
``agentmars.sdk.integrations.request``). The conversation's callbacks, which run in its
own thread before its next LLM call, move them on:

- an agent's answer (its first ``ActionEvent`` or ``MessageEvent`` of a new
  ``llm_response_id``) ends a call: the next is one turn later;
- an observation (a tool's result, a rejection, a tool error) makes the next call
  follow a tool;
- a user's message makes it follow none.

``expects_tool`` is 1: an OpenHands agent answers every step with a tool call (its
``finish`` too). ``next_tool``, the tool the answer will call, is known only to whoever
knows the script (a replayed workload): ``expect_tool`` sets it for the next call.
"""

from __future__ import annotations

import threading
from typing import Any

from openhands.sdk.event import ActionEvent, Event, MessageEvent, ObservationBaseEvent


class SessionMarkers:
    def __init__(self, session_id: str, body: dict[str, Any]) -> None:
        self.session_id = session_id
        self.body = body
        """The LLM's ``litellm_extra_body``, written in place."""
        self.turn = 0
        self.follows_tool = False
        self._next_tool: str | None = None
        self._answer: str | None = None
        """The latest answer's ``llm_response_id``: its tool calls' events come
        one after another, so only a new id starts a turn."""
        self._caller_xargs = dict(body.get("vllm_xargs") or {})
        self._lock = threading.Lock()
        self._write()

    @property
    def answered_turn(self) -> int | None:
        """The latest call that has answered (the one a tool runs for)."""
        return self.turn - 1 if self.turn else None

    def expect_tool(self, tool: str | None) -> None:
        """The tool the next call's answer will call (None: unknown)."""
        with self._lock:
            self._next_tool = tool
            self._write()

    def on_event(self, event: Event) -> None:
        """A conversation callback."""
        with self._lock:
            if isinstance(event, ActionEvent | MessageEvent) and event.source == "agent":
                answer = event.llm_response_id
                if answer is None or answer != self._answer:
                    self._answer = answer
                    self.turn += 1
                    self.follows_tool = False
                    self._next_tool = None
            elif isinstance(event, ObservationBaseEvent):
                self.follows_tool = True
            elif isinstance(event, MessageEvent) and event.source == "user":
                self.follows_tool = False
            else:
                return
            self._write()

    def _write(self) -> None:
        xargs: dict[str, Any] = {
            **self._caller_xargs,
            "session_id": self.session_id,
            "turn": self.turn,
            "follows_tool": int(self.follows_tool),
            "expects_tool": 1,
        }
        if self._next_tool is not None:
            xargs["next_tool"] = self._next_tool
        self.body["session_id"] = self.session_id
        self.body["vllm_xargs"] = xargs
