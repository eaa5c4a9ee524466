"""Where the event stream goes: memory, a JSONL file, an HTTP collector, OpenTelemetry.

``HttpSink`` and ``OTelSink`` load on first use, so importing the SDK never
pulls in the HTTP client or the OpenTelemetry SDK.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentmars.sdk.sinks.jsonl import JsonlSink
from agentmars.sdk.sinks.memory import MemorySink

_LAZY = {"HttpSink": "agentmars.sdk.sinks.http", "OTelSink": "agentmars.sdk.sinks.otel"}

__all__ = ["HttpSink", "JsonlSink", "MemorySink", "OTelSink"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
