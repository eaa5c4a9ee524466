"""The OpenHands replay mode's model: a workload session's script, timed by the real engine.

``ScriptedLLM`` is an OpenHands ``LLM`` whose every call goes over the wire for real
(through the gateway to the engine: the conversation's own messages and tools as the
prompt, ``max_tokens`` the scripted turn's output with ``ignore_eos``, so the engine
does the turn's work) and whose answer is the script's turn instead of the engine's
text: the workload's tool as a terminal command (the trace-replay tool of
``replay.tools``: the real action on the session's repository, padded to the tool's
CPU demand and duration), then ``finish`` after the last turn. A real OpenHands
Conversation thus runs end to end on a CPU engine with a random-weight model, and
says beforehand which tool each answer calls (``next_tool`` on the wire).

Ours: an OpenHands subclass of ``LLM`` is left out of its conversation's usage stats
(``AgentBase.get_all_llms`` keeps exact ``LLM`` objects): the replay's figures come
from the event stream, not from them.
"""

from __future__ import annotations

import json
import shlex
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openhands.sdk import LLM
from openhands.sdk.llm import LLMResponse, Message, MessageToolCall, TextContent
from pydantic import PrivateAttr

from agentmars.runtime.replay.tools import tool_exec
from agentmars.server.workloads.model import SessionSpec

TERMINAL = "terminal"
FINISH = "finish"


@dataclass(frozen=True)
class ScriptedTurn:
    output_tokens: int
    tool: str
    """The tool the answer calls: ``terminal`` or ``finish``."""
    arguments: dict[str, Any]
    kind: str | None
    """The workload tool's kind (the gateway's ``next_tool``); None for ``finish``."""


def script_of(spec: SessionSpec, *, tool_scale: float = 1.0) -> list[ScriptedTurn]:
    """One turn per workload turn: its tool as a terminal command, ``finish`` last."""
    turns = []
    for index, turn in enumerate(spec.turns):
        if turn.tool is None:
            turns.append(ScriptedTurn(turn.output_tokens, FINISH, {"message": "done"}, None))
            break
        exec_spec = tool_exec(turn.tool, index, scale=tool_scale)
        arguments = {"command": shlex.join(exec_spec.command), "timeout": exec_spec.timeout_s}
        turns.append(ScriptedTurn(turn.output_tokens, TERMINAL, arguments, turn.tool.kind))
    else:
        turns.append(ScriptedTurn(1, FINISH, {"message": "done"}, None))
    return turns


class ScriptedLLM(LLM):
    _script: deque[ScriptedTurn] = PrivateAttr(default_factory=deque)
    _calls: int = PrivateAttr(default=0)

    @classmethod
    def of(cls, script: Sequence[ScriptedTurn], **fields: Any) -> ScriptedLLM:
        """``fields`` as for ``LLM`` (``model``: the engine's, e.g. ``openai/<served>``)."""
        fields.setdefault("reasoning_effort", None)
        fields.setdefault("num_retries", 0)
        fields.setdefault("api_mode", "chat")
        llm = cls(**fields)
        llm._script = deque(script)
        return llm

    def completion(  # type: ignore[override]
        self, messages: list[Message], tools: Sequence[Any] | None = None, **kwargs: Any
    ) -> LLMResponse:
        if not self._script:
            raise RuntimeError(f"the script has no turn left after {self._calls} calls")
        turn = self._script.popleft()
        self._calls += 1
        self._say_next_tool(turn.kind)
        self.litellm_extra_body["ignore_eos"] = True
        kwargs["max_tokens"] = turn.output_tokens
        served = super().completion(messages, tools, **kwargs)
        call = MessageToolCall(
            id=f"call-{self._calls}",
            name=turn.tool,
            arguments=json.dumps(turn.arguments),
            origin="completion",
        )
        message = Message(role="assistant", content=[TextContent(text="")], tool_calls=[call])
        return served.model_copy(update={"message": message})

    def _say_next_tool(self, kind: str | None) -> None:
        xargs = self.litellm_extra_body.setdefault("vllm_xargs", {})
        if kind is None:
            xargs.pop("next_tool", None)
        else:
            xargs["next_tool"] = kind
