"""agentmars client SDK: the unified information stream and the hooks that feed it.

    from agentmars import sdk
    sdk.configure(sdk.MemorySink())
    with sdk.session(agent="coder", task_id="issue-42"):
        with sdk.llm_call("my-model"): ...
        with sdk.tool("terminal"): ...
        with sdk.hints(next_tool="pytest", expected_tool_s=30):
            client.chat.completions.create(...)  # an instrumented client

LLM clients are instrumented by ``agentmars.sdk.integrations.openai`` and
``agentmars.sdk.integrations.litellm``.
"""

from typing import Any

from agentmars.sdk import sinks
from agentmars.sdk.calls import KV_BLOCK_SIZE, Hints, LLMCall, ToolCall, hints, llm_call, tool
from agentmars.sdk.emitter import Emitter, Sink, configure, default_emitter
from agentmars.sdk.events import (
    SCHEMA_VERSION,
    AnyEvent,
    Event,
    EventError,
    MalformedEvent,
    UnknownEventVersion,
    decode_event,
    decode_jsonl,
    encode_jsonl,
)
from agentmars.sdk.session import NoActiveSession, Session, current_session, session
from agentmars.sdk.sinks import JsonlSink, MemorySink

# Sinks that need the HTTP client or the OpenTelemetry SDK load on first use here too.
_LAZY_SINKS = frozenset({"HttpSink", "OTelSink"})

__all__ = [
    "KV_BLOCK_SIZE",
    "SCHEMA_VERSION",
    "AnyEvent",
    "Emitter",
    "Event",
    "EventError",
    "Hints",
    "HttpSink",
    "JsonlSink",
    "LLMCall",
    "MalformedEvent",
    "MemorySink",
    "NoActiveSession",
    "OTelSink",
    "Session",
    "Sink",
    "ToolCall",
    "UnknownEventVersion",
    "configure",
    "current_session",
    "decode_event",
    "decode_jsonl",
    "default_emitter",
    "encode_jsonl",
    "hints",
    "llm_call",
    "session",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_SINKS:
        return getattr(sinks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
