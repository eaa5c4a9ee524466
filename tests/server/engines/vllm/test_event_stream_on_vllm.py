"""The event stream end to end on the real stack: an agent's SDK session (an
instrumented ``openai.OpenAI`` client, ``HttpSink`` to the gateway), the gateway in
front of vLLM CPU with the agentmars plugin, linked by the side channel as ``agentmars
serve`` links them, and a test policy (``stream_policy``) whose engine half is VTC's
and records every event it receives, with its counters, in a JSONL file.

- One event feed: each boundary of a call is reported twice (by the SDK, through the
  gateway's ``/v1/events``, and by the gateway itself), and reaches the engine half
  once, under the SDK's call id; VTC charges each call once.
- Two halves, the second direction (the first: ``test_thunderagent_on_vllm``): the
  engine half's decision depends on an event the admission half published: it pins a
  finished call only after the gateway's ``window_update`` reached it.

One vLLM server for both tests (the test policy, loaded with
``AGENTMARS_POLICY_MODULES``); each test runs its own gateway in this process."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agentmars import sdk
from agentmars.sdk.events import (
    LLMSubmit,
    SessionEnd,
    ToolEnd,
    ToolStart,
    WindowUpdate,
)
from agentmars.sdk.integrations.openai import instrument_openai
from agentmars.sdk.sinks.http import HttpSink
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, SERVED_MODEL_NAME
from agentmars.server.engines.vllm.smoke import model_vocab_size, random_prompt
from agentmars.server.gateway.app import Gateway
from tests.server.engines.vllm.helpers import (
    LinkedEngine,
    blocks,
    eventually,
    kv_status,
    linked_gateway,
    linked_vllm,
    post_events,
    released,
)
from tests.server.engines.vllm.stream_policy import NAME, read_log

TOKEN = "stream-token"
MODULE = "tests.server.engines.vllm.stream_policy"
W_PROMPT, W_OUTPUT = 1.5, 3.0
"""VTC's weights here (not its defaults, 1 and 2, so the check tells them apart)."""
USABLE_BLOCKS = 63
"""64 blocks, less vLLM's null block."""
CALLS = 3
OUTPUT_TOKENS = 8
CALL_BOUNDARIES = ("llm_submit", "llm_first_token", "llm_end")


@pytest.fixture(scope="class")
def probe(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LinkedEngine]:
    folder = tmp_path_factory.mktemp("stream-probe")
    with linked_vllm(
        vllm_python, folder, NAME, settings=_settings(folder), modules=[MODULE]
    ) as engine:
        yield engine


def _settings(folder: Path) -> dict[str, Any]:
    return {"w_prompt": W_PROMPT, "w_output": W_OUTPUT, "log": str(folder / "engine.jsonl")}


def _engine_log(engine: LinkedEngine) -> list[dict[str, Any]]:
    return read_log(_settings(engine.folder)["log"])


def _trigger(client: httpx.Client) -> None:
    """A call of no session. The plugin takes the gateway's events at the top of a
    step and this policy has no tick, so an idle engine hears nothing new until vLLM
    schedules something."""
    body = {"model": SERVED_MODEL_NAME, "prompt": [5, 6, 7], "max_tokens": 1}
    assert client.post("/v1/completions", json=body).status_code == 200


def _sdk_session(gateway_url: str) -> tuple[str, list[Any], list[sdk.AnyEvent]]:
    """An agent's session with the SDK: three streamed chat calls with a tool between
    each two, its events posted to the gateway (and kept in memory). Returns the
    session id, the usage each response reported and the SDK's own events."""
    memory = sdk.MemorySink()
    sdk.configure(HttpSink(f"{gateway_url}/v1/events", token=TOKEN), memory)
    client = instrument_openai(
        openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)
    )
    usages = []
    try:
        with sdk.session(agent="probe") as session:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You fix the failing test. " * 20},
                {"role": "user", "content": "tests/test_parse.py fails: " + "x = 1; " * 40},
            ]
            for turn in range(CALLS):
                stream = client.chat.completions.create(
                    model=SERVED_MODEL_NAME,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=OUTPUT_TOKENS,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True},
                )
                text, usage = "", None
                for chunk in stream:
                    usage = chunk.usage or usage
                    text += "".join(choice.delta.content or "" for choice in chunk.choices)
                usages.append(usage)
                messages.append({"role": "assistant", "content": text})
                if turn < CALLS - 1:
                    with sdk.tool("bash"):
                        time.sleep(0.05)  # the tool runs
                    messages.append({"role": "user", "content": f"bash said: ok {turn}"})
    finally:
        sdk.configure()  # closes the HttpSink: what it still holds is sent
    return session.session_id, usages, memory.events


def _hub_calls(gateway: Gateway, call_id: str) -> set[tuple[str, str]]:
    return {
        (event.kind, event.source)
        for event in gateway.hub.events()
        if getattr(event, "call_id", None) == call_id
    }


class TestStreamOnVllm:
    @pytest.mark.slow
    def test_each_boundary_of_an_sdk_session_reaches_the_engine_half_once(
        self, probe: LinkedEngine
    ) -> None:
        with linked_gateway(probe, TOKEN, NAME, policy_settings=_settings(probe.folder)) as (
            client,
            gateway,
        ):
            url = str(client.base_url).rstrip("/")
            session_id, usages, ours = _sdk_session(url)
            eventually(
                lambda: any(isinstance(e, SessionEnd) for e in gateway.hub.events()),
                "the SDK's session_end reaches the gateway",
            )
            _trigger(client)
            eventually(
                lambda: any(r["event"]["kind"] == "session_end" for r in _engine_log(probe)),
                "the session_end reaches the engine half",
            )
        call_ids = [e.call_id for e in ours if isinstance(e, LLMSubmit)]
        assert len(set(call_ids)) == CALLS
        for call_id in call_ids:
            # Each boundary was reported by the SDK and by the gateway, under one id.
            assert _hub_calls(gateway, call_id) == {
                (kind, source) for kind in CALL_BOUNDARIES for source in ("sdk", "gateway")
            }

        records = [r for r in _engine_log(probe) if r["event"].get("session_id") == session_id]
        kinds = Counter(r["event"]["kind"] for r in records)
        boundaries = Counter(
            (r["event"]["kind"], r["event"]["call_id"])
            for r in records
            if r["event"]["kind"] in CALL_BOUNDARIES
        )
        # Once each, whichever report came first, and no call of another id.
        assert boundaries == Counter(
            {(kind, call_id): 1 for kind in CALL_BOUNDARIES for call_id in call_ids}
        )
        tool_ids = [e.call_id for e in ours if isinstance(e, ToolEnd)]
        assert len(tool_ids) == CALLS - 1
        for kind in ("session_start", "session_end", "tool_start", "tool_end"):
            assert kinds[kind] == (CALLS - 1 if kind.startswith("tool") else 1), kinds
        assert [r["event"]["call_id"] for r in records if r["event"]["kind"] == "tool_end"] == (
            tool_ids
        )

        # VTC's counter: w_p x prompt + w_q x output tokens of the calls so far, once each.
        charged = 0.0
        for call_id, usage in zip(call_ids, usages, strict=True):
            assert usage is not None and usage.completion_tokens == OUTPUT_TOKENS
            charged += W_PROMPT * usage.prompt_tokens + W_OUTPUT * usage.completion_tokens
            (end,) = (
                r
                for r in records
                if r["event"]["kind"] == "llm_end" and r["event"]["call_id"] == call_id
            )
            assert end["event"]["prompt_tokens"] == usage.prompt_tokens
            assert end["counters"][session_id] == pytest.approx(charged)
        # Ended, the session's counter is forgotten.
        (last,) = (r for r in records if r["event"]["kind"] == "session_end")
        assert session_id not in last["counters"]

    @pytest.mark.slow
    def test_the_engine_pins_only_once_the_gateways_window_update_reached_it(
        self, probe: LinkedEngine
    ) -> None:
        vocab_size = model_vocab_size(probe.config.model)
        context = random_prompt(1300, vocab_size, seed=11)
        tail = random_prompt(20, vocab_size, seed=12)
        full_blocks = (1300 + 20 + 4 - 1) // CPU_BLOCK_SIZE  # 10: the second call's pin

        def call(prompt: list[int], turn: int) -> None:
            body = {
                "model": SERVED_MODEL_NAME,
                "prompt": prompt,
                "max_tokens": 4,
                "ignore_eos": True,
                "session_id": "w",
                "vllm_xargs": {"session_id": "w", "turn": turn},
            }
            assert client.post("/v1/completions", json=body).status_code == 200

        with linked_gateway(probe, TOKEN, NAME, policy_settings=_settings(probe.folder)) as (
            client,
            gateway,
        ):
            start = kv_status(probe.status)
            call(context, 0)
            before = kv_status(probe.status)
            # The engine half has seen no window_update since the last session ended.
            assert blocks(before) == (USABLE_BLOCKS, 0, 0)
            assert released(before, start) == {}

            # The tool's end makes the admission half publish its window_update.
            tool = {"session_id": "w", "call_id": "w-tool", "turn": 0, "tool": "bash"}
            post_events(client, TOKEN, ToolStart(**tool), ToolEnd(duration_s=0.1, **tool))
            eventually(
                lambda: any(isinstance(e, WindowUpdate) for e in gateway.hub.events()),
                "the admission half publishes its window_update",
            )
            (update,) = (e for e in gateway.hub.events() if isinstance(e, WindowUpdate))
            assert (update.window, update.previous, update.source) == (2, 1, "gateway")
            call(context + tail, 1)
            after = kv_status(probe.status)
            assert (after.pins, after.pinned_blocks) == (1, full_blocks)
            assert released(after, start) == {}

            post_events(client, TOKEN, SessionEnd(session_id="w"))
            eventually(
                lambda: sum(isinstance(e, WindowUpdate) for e in gateway.hub.events()) == 2,
                "the admission half narrows its window again",
            )
            _trigger(client)
            ended = kv_status(probe.status)
            assert blocks(ended) == (USABLE_BLOCKS, 0, 0)
            assert released(ended, after) == {"session_end": 1}

        # The engine half got the admission half's event through the side channel, in
        # the stream's order: after the first call's end and the tool's, before the
        # second call's submit (the gateway's, forwarded on the same channel).
        records = [r["event"] for r in _engine_log(probe)]
        ids = [event["event_id"] for event in records]
        update_at = ids.index(update.event_id)
        assert records[update_at]["source"] == "gateway"
        assert _engine_log(probe)[update_at]["window"] == 2

        def position(kind: str, turn: int) -> int:
            return next(
                i
                for i, event in enumerate(records)
                if (event["kind"], event.get("session_id"), event.get("turn")) == (kind, "w", turn)
            )

        assert position("llm_end", 0) < position("tool_end", 0) < update_at
        assert update_at < position("llm_submit", 1)
        assert _engine_log(probe)[-1]["window"] == 1
