"""What the twin's answer says under ``stop``, ``response_format``, ``echo`` and
``logprobs``: honoured or refused with a 400 naming the field, never ignored; read by
the real OpenAI client from a twin on loopback."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from agentmars.server.engines.twin.replies import Reply, reply_for
from tests.server.engines.twin.conftest import MODEL

MESSAGES = [{"role": "user", "content": "hello"}]
# The synthetic words: "lorem ipsum dolor sit amet consectetur adipiscing elit " again.


def _refused(call: Any, param: str) -> str:
    with pytest.raises(openai.BadRequestError) as refused:
        call()
    error = refused.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    message: str = error["message"]
    return message


# --- Reply, without a server -----------------------------------------------------------


@pytest.mark.parametrize("span", [1, 3, 7, 40])
def test_the_pieces_of_any_reply_make_up_its_content(span: int) -> None:
    for body in ({}, {"response_format": {"type": "json_object"}}, {"stop": "sit"}):
        reply = reply_for(body, None, span)
        said = "".join(reply.piece(i) for i in range(reply.length))
        assert said == reply.content
        assert reply.piece(0)  # the first token always says something


def test_a_stop_string_ends_the_reply_on_the_token_that_completes_it() -> None:
    # "sit am" starts in token 3 ("sit ") and is complete in token 4 ("amet ").
    reply = reply_for({"stop": ["elit", "sit am"]}, None, 10)
    assert (reply.content, reply.length, reply.finish_reason) == ("lorem ipsum dolor ", 5, "stop")
    assert reply_for({"stop": "nowhere"}, None, 10).finish_reason == "length"
    # A JSON document is cut as the words are (vLLM's stop strings see all text).
    document = reply_for({"response_format": {"type": "json_object"}, "stop": "lorem"}, None, 4)
    assert (document.content, document.finish_reason) == ('{"answer": "', "stop")
    # Past the answer's span the stop string is never said.
    assert reply_for({"stop": "elit"}, None, 7) == reply_for({}, None, 7)


def test_a_json_document_spread_over_more_tokens_than_characters_still_adds_up() -> None:
    reply = Reply('{"a": 1}', 100, "stop")
    assert "".join(reply.piece(i) for i in range(100)) == '{"a": 1}'


# --- stop ---------------------------------------------------------------------------


def _generated(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    families = text_string_to_metric_families(text)
    samples = [s for f in families for s in f.samples if s.name == "vllm:generation_tokens_total"]
    return samples[0].value


def test_stop_cuts_the_answer_and_the_engine_decodes_no_further(
    twin: openai.OpenAI, twin_url: str
) -> None:
    before = _generated(twin_url)
    reply = twin.chat.completions.create(
        model=MODEL, messages=MESSAGES, stop=["sit am"], max_tokens=20
    )
    assert reply.choices[0].message.content == "lorem ipsum dolor "
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert _generated(twin_url) - before == 5  # the call ended on the stop, not at 20
    chunks = list(
        twin.completions.create(model=MODEL, prompt="hi", stop="dolor", max_tokens=20, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == "lorem ipsum "
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len(chunks) == 3


@pytest.mark.parametrize("stop", [5, [1], "", ["ok", ""], {"s": 1}, ["x"] * 65])
def test_a_bad_stop_gets_a_400(twin: openai.OpenAI, stop: Any) -> None:
    _refused(
        lambda: twin.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"stop": stop}
        ),
        "stop",
    )


# --- logprobs ------------------------------------------------------------------------


def test_logprobs_are_refused_saying_why(twin: openai.OpenAI) -> None:
    says = _refused(
        lambda: twin.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True),
        "logprobs",
    )
    assert "computes no logprobs" in says
    _refused(
        lambda: twin.chat.completions.create(
            model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2
        ),
        "logprobs",
    )
    _refused(
        lambda: twin.chat.completions.create(model=MODEL, messages=MESSAGES, top_logprobs=2),
        "top_logprobs",
    )
    # The completions API's logprobs=0 still asks for the sampled token's.
    _refused(lambda: twin.completions.create(model=MODEL, prompt="hi", logprobs=0), "logprobs")
    off = twin.chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=False, top_logprobs=0, max_tokens=1
    )
    assert off.choices[0].logprobs is None


# --- response_format ----------------------------------------------------------------


class Answer(BaseModel):
    title: str
    score: int
    tags: list[str]


def test_response_formats_give_parseable_json(twin: openai.OpenAI) -> None:
    document = twin.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format={"type": "json_object"}, max_tokens=4
    )
    assert isinstance(json.loads(document.choices[0].message.content or ""), dict)
    assert document.choices[0].finish_reason == "stop"
    parsed = twin.chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=Answer, max_tokens=6
    )
    assert parsed.choices[0].message.parsed == Answer(title="lorem", score=1, tags=["lorem"])
    schema = {"type": "array", "items": {"enum": [3, 4]}}
    text = twin.completions.create(
        model=MODEL, prompt="hi", max_tokens=2,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
    )  # fmt: skip
    assert json.loads(text.choices[0].text) == [3]
    plain = twin.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format={"type": "text"}, max_tokens=1
    )
    assert plain.choices[0].message.content == "lorem "


@pytest.mark.parametrize(
    "form",
    [
        {"type": "yaml"},
        "json_object",
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": {"type": "widget"}}},
    ],
)
def test_a_response_format_the_twin_cannot_follow_gets_a_400(
    twin: openai.OpenAI, form: Any
) -> None:
    _refused(
        lambda: twin.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"response_format": form}
        ),
        "response_format",
    )


# --- echo ------------------------------------------------------------------------------


def test_echo_starts_a_completion_with_its_prompt(twin: openai.OpenAI) -> None:
    whole = twin.completions.create(model=MODEL, prompt="say: ", echo=True, max_tokens=2)
    assert whole.choices[0].text == "say: lorem ipsum "
    assert whole.usage is not None and whole.usage.completion_tokens == 2
    # Token ids echo as the vocabulary's words (the ids the answer's own words have).
    chunks = twin.completions.create(
        model=MODEL, prompt=[1, 0], echo=True, max_tokens=1, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == "ipsum lorem lorem "
    _refused(
        lambda: twin.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"echo": True}
        ),
        "echo",
    )
    _refused(
        lambda: twin.completions.create(model=MODEL, prompt="x", extra_body={"echo": "yes"}),
        "echo",
    )


# --- hostile values of the new fields -----------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)
schemas = st.recursive(
    st.sampled_from([{"type": t} for t in ("string", "integer", "object", "array", "widget")])
    | st.just({"$ref": "#"}) | json_values,
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(st.sampled_from("abc"), inner)},
        optional={"required": st.lists(st.sampled_from("abcd"), max_size=3)},
    ) | st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=2)}),
    max_leaves=6,
)  # fmt: skip
functions = st.fixed_dictionaries({"name": st.sampled_from(["a", "finish"]), "parameters": schemas})
tools = st.lists(
    st.fixed_dictionaries({"type": st.just("function"), "function": functions}) | json_values,
    max_size=2,
)
fields = {
    "tools": tools | json_values,
    "tool_choice": st.sampled_from(["none", "auto", "required"])
    | st.fixed_dictionaries({"type": st.just("function"), "function": json_values})
    | json_values,
    "stop": json_values | st.lists(st.text(max_size=4), max_size=3),
    "logprobs": json_values,
    "top_logprobs": json_values,
    "echo": json_values,
    "response_format": st.fixed_dictionaries(
        {
            "type": st.sampled_from(["json_schema", "json_object", "text"]),
            "json_schema": st.fixed_dictionaries({"schema": schemas}),
        }
    )
    | json_values,
}
bodies = st.lists(st.sampled_from(list(fields)), min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: fields[name] for name in names})
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extra=bodies, chat=st.booleans())
def test_no_value_of_these_fields_gets_a_server_error(
    twin_url: str, extra: dict[str, Any], chat: bool
) -> None:
    body = {"model": MODEL, "max_tokens": 3, "messages": MESSAGES, "prompt": "hi", **extra}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    reply = httpx.post(twin_url + path, content=json.dumps(body), timeout=10)
    assert reply.status_code in (200, 400), reply.text
    if reply.status_code == 400:
        assert reply.json()["error"]["message"]
    elif chat and reply.json()["choices"][0]["message"]["tool_calls"]:
        call = reply.json()["choices"][0]["message"]["tool_calls"][0]
        json.loads(call["function"]["arguments"])
