"""Anthropic's Messages API on the twin (``engines.twin.messages_api``), read by the
``anthropic`` client as vLLM's: whole and streamed, text, stop sequences and tool use,
and Anthropic's error body."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.server.engines.twin.conftest import MODEL

BASH = {
    "name": "bash",
    "description": "Run a command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


@pytest.fixture(scope="module")
def claude(twin_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=twin_url, api_key="unused", max_retries=0)


def test_a_whole_message_says_its_text_stop_and_usage(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL, system="Be brief.", max_tokens=5, messages=[{"role": "user", "content": "Hi."}]
    )
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    (block,) = message.content
    assert block.type == "text" and block.text == "lorem ipsum dolor sit amet "
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    # "<|system|>Be brief.\n<|user|>Hi.\n": 32 characters, none cached.
    assert (message.usage.input_tokens, message.usage.output_tokens) == (8, 5)
    assert message.usage.cache_read_input_tokens == 0


def test_a_stop_sequence_ends_the_message_and_is_named(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL,
        max_tokens=8,
        stop_sequences=["nothing", "sit"],
        messages=[{"role": "user", "content": "Hi."}],
    )
    assert message.content[0].text == "lorem ipsum dolor "  # type: ignore[union-attr]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "sit")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_use_and_its_result_make_a_tool_loop(
    claude: anthropic.Anthropic, stream: bool
) -> None:
    def ask(messages: list[dict[str, Any]], **fields: Any) -> anthropic.types.Message:
        fields |= {"model": MODEL, "max_tokens": 40, "tools": [BASH], "messages": messages}
        if not stream:
            return claude.messages.create(**fields)
        with claude.messages.stream(**fields) as events:
            return events.get_final_message()

    first = ask([{"role": "user", "content": "List the files."}], tool_choice={"type": "any"})
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "bash"
    assert set(use.input) == {"command"}  # type: ignore[arg-type]
    assert first.stop_reason == "tool_use"
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}
    history = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [result]},
    ]
    second = ask(history, tool_choice={"type": "none"})
    assert second.content[0].type == "text" and second.stop_reason == "max_tokens"
    assert second.usage.input_tokens > first.usage.input_tokens


def test_a_stream_gives_anthropics_events_in_order(twin_url: str) -> None:
    body = {"model": MODEL, "max_tokens": 3, "stream": True,
            "messages": [{"role": "user", "content": "Hi."}]}  # fmt: skip
    with httpx.stream("POST", f"{twin_url}/v1/messages", json=body) as response:
        kinds = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": [{"role": "user", "content": "Hi."}]}, "'max_tokens' is required"),
        ({"max_tokens": 4, "messages": []}, "'messages' must be a non-empty list"),
        ({"max_tokens": 4, "messages": [{"role": "bot", "content": "x"}]}, "role 'user'"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
             "tools": [{"name": "t"}]},
            "input_schema",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
             "tool_choice": {"type": "sometimes"}},
            "'tool_choice' must be",
        ),
    ],
)  # fmt: skip
def test_a_request_the_twin_cannot_serve_gets_anthropics_error_body(
    twin_url: str, body: dict[str, Any], message: str
) -> None:
    response = httpx.post(f"{twin_url}/v1/messages", json={"model": MODEL, **body})
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]


def test_another_model_is_anthropics_not_found(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(
            model="nope", max_tokens=4, messages=[{"role": "user", "content": "Hi."}]
        )
