"""The scripts in examples/ run as a user runs them, against the twin behind the gateway
(`agentmars serve --engine sim --profile cpu-tiny` on loopback), and leave what they say."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from agentmars.sdk.events import LLMEnd, LLMSubmit, SessionEnd, ToolEnd, decode_jsonl
from tests.cli.serving import Twin as ServedTwin
from tests.cli.serving import served_twin

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Twin(ServedTwin):
    def engine_calls(self) -> float:
        text = httpx.get(self.engine + "/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "agentmars_sim_requests_finished_total":
                    return sample.value
        raise AssertionError(f"no agentmars_sim_requests_finished_total in {self.engine}")


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    with served_twin() as served:
        yield Twin(served.base, served.engine)


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("script", ["decorated_agent_loop.py", "litellm_agent.py"])
def test_an_agent_loop_records_its_session(twin: Twin, script: str, tmp_path: Path) -> None:
    events_path = tmp_path / "e.jsonl"
    calls_before = twin.engine_calls()
    args = ["--base-url", twin.base + "/v1", "--events", str(events_path), "--max-turns", "6"]
    _run(script, *args)

    decoded = decode_jsonl(events_path.read_text())
    assert decoded.errors == []
    events = decoded.events
    kinds = [event.kind for event in events]
    assert kinds[0] == "session_start" and kinds[-1] == "session_end"
    assert len({getattr(event, "session_id", None) for event in events}) == 1
    counts = Counter(kinds)
    # The twin calls "terminal" for a session's first three calls, then "finish".
    assert counts["llm_submit"] == counts["llm_end"] >= 2
    assert counts["tool_start"] == counts["tool_end"] >= 1
    # It stopped on the model's "finish", not on --max-turns; every answer was a tool call.
    assert counts["llm_end"] < 6
    ends = [e for e in events if isinstance(e, LLMEnd)]
    assert all(e.status == "ok" and e.ended_in_tool_call for e in ends)
    submits = [e for e in events if isinstance(e, LLMSubmit)]
    assert [e.follows_tool for e in submits] == [False] + [True] * (len(submits) - 1)
    tool_ends = [e for e in events if isinstance(e, ToolEnd)]
    assert all(e.status == "ok" and e.exit_status == 0 for e in tool_ends)
    assert {e.tool for e in tool_ends} == {"terminal"}
    assert isinstance(events[-1], SessionEnd) and events[-1].status == "ok"
    # The calls went through the gateway to the engine, one engine call per LLM call.
    assert twin.engine_calls() - calls_before == counts["llm_end"]


def _gateway_counts(twin: Twin) -> dict[str, float]:
    """The gateway's tool calls (by tool) and sessions seen ended, from its metrics."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(twin.base + "/metrics").text):
        for sample in family.samples:
            if sample.name == "agentmars_tool_duration_seconds_count":
                counts[sample.labels["tool"]] = sample.value
            elif sample.name == "agentmars_session_duration_seconds_count":
                counts["sessions"] = sample.value
    return counts


def _runs_to_its_end(program: str, env: dict[str, str], tmp_path: Path) -> None:
    """An OpenHands program run in a folder of its own, with ``env`` over this one's
    (its LLM_BASE_URL left out unless given); its conversation must finish."""
    folder = tmp_path / program
    folder.mkdir()
    ran = subprocess.run(
        [sys.executable, str(EXAMPLES / program)],
        capture_output=True, text=True, timeout=120, cwd=folder,
        env={**{k: v for k, v in os.environ.items() if k != "LLM_BASE_URL"}, **env},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().endswith("All done: finished"), ran.stdout


def test_openhands_on_agentmars_differs_from_plain_openhands_by_the_import(
    twin: Twin, tmp_path: Path
) -> None:
    """Issue 40: at most three lines. The two programs are docs/openhands.md's, and each
    runs to its end: the plain one with OpenHands' own tools in its directory, the
    drop-in with its session's calls through the gateway and its tools in the sandbox,
    their events at the gateway."""
    plain = (EXAMPLES / "openhands_plain.py").read_text()
    dropin = (EXAMPLES / "openhands_dropin.py").read_text()
    changed = [
        line
        for line in difflib.unified_diff(plain.splitlines(), dropin.splitlines(), n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    assert changed == [
        "-from openhands.sdk import LLM, Agent, Conversation, Tool",
        "+from openhands.sdk import LLM, Agent, Tool",
        "+",
        "+from agentmars.runtime.openhands import Conversation",
    ]
    doc = (EXAMPLES.parent / "docs" / "openhands.md").read_text()
    assert f"```python\n{plain}```" in doc and f"```python\n{dropin}```" in doc

    _runs_to_its_end("openhands_plain.py", {"LLM_BASE_URL": twin.base + "/v1"}, tmp_path)
    before = _gateway_counts(twin)
    # No LLM_BASE_URL: the runtime points the agent's LLM at the gateway.
    gateway = {"AGENTMARS_GATEWAY_URL": twin.base, "AGENTMARS_GATEWAY_TOKEN": twin.token}
    _runs_to_its_end("openhands_dropin.py", gateway, tmp_path)
    after = _gateway_counts(twin)
    # The twin calls "terminal" for a session's first three calls, then "finish".
    assert after.get("terminal", 0) - before.get("terminal", 0) == 3
    assert after["sessions"] - before.get("sessions", 0) == 1


class GatewayEvents:
    """The gateway's event stream (``GET /v1/events/stream``) read on a thread while
    a block runs: the LLM calls' ends, as ``(session, ended in a tool call)``."""

    def __init__(self, twin: Twin) -> None:
        self.twin = twin
        self.ends: list[tuple[str, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._open = threading.Event()

    def _read(self) -> None:
        headers = {"Authorization": f"Bearer {self.twin.token}"}
        url = self.twin.base + "/v1/events/stream"
        with httpx.stream("GET", url, headers=headers, timeout=None) as response:
            self._open.set()
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                event = json.loads(line[5:]) if line.startswith("data:") else {}
                if event.get("kind") == "llm_end":
                    self.ends.append((event["session_id"], event["ended_in_tool_call"]))

    def __enter__(self) -> GatewayEvents:
        self._thread.start()
        assert self._open.wait(10), "the gateway's event stream did not open"
        return self

    def __exit__(self, *exc: object) -> None:
        # The next event (a heartbeat, or the next test's) lets the reader see the stop.
        self._stop.set()


@pytest.mark.parametrize(
    ("script", "base"),
    [("openai_agents_agent.py", "/v1"), ("anthropic_agent.py", "")],
    ids=["openai-agents", "anthropic"],
)
def test_an_unmodified_agent_framework_runs_as_one_session(
    twin: Twin, script: str, base: str
) -> None:
    """The OpenAI Agents SDK (Responses API, turns chained by previous_response_id) and
    an Anthropic-client loop (Messages API, ``metadata.user_id``): every call of the
    run is in one session at the gateway, and the tool loop ends in an answer (the
    twin calls tools for a session's first three calls, then answers in text)."""
    with GatewayEvents(twin) as events:
        _run(script, "--base-url", twin.base + base)
        deadline = time.monotonic() + 10
        while len(events.ends) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # the stream's events trail the answers a little
    sessions = {session for session, _ in events.ends}
    assert len(sessions) == 1, events.ends
    assert [tool for _, tool in events.ends] == [True, True, True, False]


def test_otel_export_prints_the_session_call_and_tool_spans(twin: Twin) -> None:
    done = _run("otel_export.py", "--base-url", twin.base + "/v1")
    # The console exporter prints one indented JSON document per span.
    decoder = json.JSONDecoder()
    spans: list[dict[str, Any]] = []
    text = done.stdout.strip()
    while text:
        span, end = decoder.raw_decode(text)
        spans.append(span)
        text = text[end:].strip()
    by_name = {span["name"]: span for span in spans}
    assert set(by_name) == {"invoke_agent coder", "chat cpu-tiny", "execute_tool python"}
    root = by_name["invoke_agent coder"]
    assert root["parent_id"] is None
    for child in ("chat cpu-tiny", "execute_tool python"):
        assert by_name[child]["parent_id"] == root["context"]["span_id"]
        assert by_name[child]["context"]["trace_id"] == root["context"]["trace_id"]
    assert by_name["chat cpu-tiny"]["attributes"]["gen_ai.usage.output_tokens"] == 8
    assert by_name["execute_tool python"]["attributes"]["agentmars.tool.exit_status"] == 0


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that keeps the names of the spans posted to it."""

    spans: ClassVar[list[tuple[str, str]]] = []  # (path, span name)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend((self.path, span.name) for span in scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_otel_export_sends_the_spans_over_otlp_http(twin: Twin) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"  # the script adds the path
        done = _run("otel_export.py", "--base-url", twin.base + "/v1", "--otlp-endpoint", endpoint)
    finally:
        server.shutdown()
        server.server_close()
    assert done.stdout == ""
    assert sorted(_Collector.spans) == [
        ("/v1/traces", "chat cpu-tiny"),
        ("/v1/traces", "execute_tool python"),
        ("/v1/traces", "invoke_agent coder"),
    ]
