"""A test policy whose halves make the event stream visible on the real stack
(``test_two_halves_on_vllm.py``). vLLM loads it with
``AGENTMARS_POLICY_MODULES=tests.server.engines.vllm.stream_policy`` (the repository's
root is on vLLM's ``PYTHONPATH``: ``helpers.linked_vllm``); the test process imports it
for the gateway. It imports nothing but agentmars, so both environments can.

- Admission half: admits everyone; its window is 1 until the stream reports a tool's
  end, then 2, and back to 1 when a session ends, each change published as a
  ``window_update`` (source ``gateway``), which reaches the engine through the side
  channel.
- Engine half: VTC's (``policies/vtc.py``), which writes every event it receives, with
  its counters, to the JSONL file ``log`` (one line an event, in the order received),
  and pins a finished call only while the newest ``window_update`` it saw says the
  window is wider than 1 (else releases it, as VTC does).
"""

from __future__ import annotations

import json
from typing import Any

from agentmars.sdk.events import AnyEvent, SessionEnd, ToolEnd, WindowUpdate
from agentmars.server.policies.interface import AdmissionHalf, KVDecision, Pin, Policy, Release
from agentmars.server.policies.registry import register
from agentmars.server.policies.views import CallView, EngineView
from agentmars.server.policies.vtc import VTCEngine

NAME = "test-stream-probe"


class WindowOnTools(AdmissionHalf):
    """Admits everyone; says ``window_update`` 1 -> 2 at a tool's end, 2 -> 1 at a
    session's end."""

    def __init__(self) -> None:
        self.window = 1

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, ToolEnd) and self.window == 1:
            self._set_window(2, f"{event.session_id}'s tool ended")
        elif isinstance(event, SessionEnd) and self.window == 2:
            self._set_window(1, f"{event.session_id} ended")

    def _set_window(self, window: int, reason: str) -> None:
        update = WindowUpdate(window=window, previous=self.window, reason=reason, source="gateway")
        self.window = window
        self.publish(update)


class RecordingVTC(VTCEngine):
    """VTC's engine half, recording what it receives; pins while the window is wide."""

    def __init__(self, w_prompt: float, w_output: float, log: str | None) -> None:
        super().__init__(w_prompt, w_output)
        self.log = log
        self.window = 1
        """The newest ``window_update``'s window (1 until one arrives)."""

    def on_event(self, event: AnyEvent) -> None:
        super().on_event(event)
        if isinstance(event, WindowUpdate):
            self.window = event.window
        if self.log is not None:
            line = {
                "event": json.loads(event.to_json()),
                "counters": dict(self.counters),
                "window": self.window,
            }
            with open(self.log, "a") as out:
                out.write(json.dumps(line) + "\n")

    def on_call_finished(self, call: CallView, view: EngineView) -> KVDecision:
        return Pin() if self.window > 1 else Release()


@register
class StreamProbe(Policy):
    """Test policy: VTC that records the stream it receives, and pins finished calls
    only while the gateway's window is wider than one."""

    name = NAME
    variant = "test-only (tests/server/engines/vllm/stream_policy.py)"

    def __init__(self, w_prompt: float = 1.0, w_output: float = 2.0, log: str | None = None):
        if w_prompt < 0 or w_output < 0:
            raise ValueError("weights must be non-negative")
        self.w_prompt = w_prompt
        self.w_output = w_output
        self.log = log

    def settings(self) -> dict[str, Any]:
        return {"w_prompt": self.w_prompt, "w_output": self.w_output, "log": self.log}

    def admission(self) -> WindowOnTools:
        return WindowOnTools()

    def engine(self) -> RecordingVTC:
        return RecordingVTC(self.w_prompt, self.w_output, self.log)


def read_log(path: str) -> list[dict[str, Any]]:
    """The engine half's records so far (none before the first event)."""
    try:
        with open(path) as lines:
            return [json.loads(line) for line in lines if line.endswith("\n")]
    except FileNotFoundError:
        return []
