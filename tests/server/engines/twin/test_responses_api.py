"""OpenAI's Responses API on the twin (``engines.twin.responses_api``), read by the
OpenAI client as vLLM's: whole and streamed, text and function calls, a conversation
continued by ``previous_response_id`` and by ``conversation``."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.server.engines.twin.conftest import MODEL

BASH = {
    "type": "function",
    "name": "bash",
    "description": "Run a command.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def test_a_whole_response_says_its_text_and_usage(twin: openai.OpenAI) -> None:
    response = twin.responses.create(
        model=MODEL, instructions="Be brief.", input="Say hi.", max_output_tokens=6
    )
    assert response.id.startswith("resp_") and response.model == MODEL
    # The twin has no end token: the answer runs to its budget, as vLLM reports it.
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "lorem ipsum dolor sit amet consectetur "
    assert response.usage is not None
    assert response.usage.output_tokens == 6
    assert response.usage.input_tokens == 9  # "<|system|>Be brief.\n<|user|>Say hi.\n": 36 chars


def test_a_streamed_response_gives_its_events_in_order(twin: openai.OpenAI) -> None:
    events = list(
        twin.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[4:8] == ["response.output_text.delta"] * 4
    assert kinds[8:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == deltas == "lorem ipsum dolor sit "
    assert final.usage is not None and final.usage.output_tokens == 4


def _call(twin: openai.OpenAI, stream: bool, **fields: Any) -> Any:
    if not stream:
        return twin.responses.create(model=MODEL, max_output_tokens=40, **fields)
    with twin.responses.stream(model=MODEL, max_output_tokens=40, **fields) as events:
        return events.get_final_response()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_call_and_its_output_continue_the_response(
    twin: openai.OpenAI, stream: bool
) -> None:
    first = _call(twin, stream, input="List the files.", tools=[BASH])
    (call,) = first.output
    assert call.type == "function_call" and call.name == "bash"
    assert set(json.loads(call.arguments)) == {"command"}
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
    second = _call(twin, stream, input=[result], previous_response_id=first.id, tools=[BASH])
    # The stored context is the prompt's start: the first prompt, its call, the result.
    assert second.usage.input_tokens > first.usage.input_tokens + 5
    assert second.previous_response_id == first.id


def test_a_conversation_keeps_its_context_across_responses(twin: openai.OpenAI) -> None:
    first = twin.responses.create(model=MODEL, input="One.", conversation="conv-1")
    second = twin.responses.create(model=MODEL, input="Two.", conversation={"id": "conv-1"})
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_an_unknown_previous_response_is_a_404(twin: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="resp_nope"):
        twin.responses.create(model=MODEL, input="Hi.", previous_response_id="resp_nope")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "web_search_call"}]}, "input"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "instructions": 3}, "instructions"),
        ({"input": "x", "conversation": 5}, "conversation"),
    ],
)
def test_what_the_twin_cannot_serve_is_a_400_naming_the_field(
    twin: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        twin.responses.create(model=MODEL, **fields)
    assert refused.value.body["param"] == param  # type: ignore[index]
