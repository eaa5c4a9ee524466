"""The twin's other vLLM routes (``engines.twin.app``): ``/tokenize``,
``/detokenize``, ``/version`` and one model's card (``models.retrieve``)."""

from __future__ import annotations

import httpx
import openai
import pytest

from agentmars.server.engines.twin.app import VLLM_API_VERSION, synthetic_tokens
from tests.server.engines.twin.conftest import MODEL


def test_tokenize_counts_what_a_call_is_charged(twin_url: str) -> None:
    answer = httpx.post(
        f"{twin_url}/tokenize", json={"prompt": "abcdefghij", "return_token_strs": True}
    )
    assert answer.status_code == 200
    tokens = answer.json()
    assert tokens["count"] == synthetic_tokens("abcdefghij") == 3
    assert tokens["token_strs"] == ["abcd", "efgh", "ij"]
    assert len(tokens["tokens"]) == 3 and tokens["max_model_len"] > 0
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}]}
    counted = httpx.post(f"{twin_url}/tokenize", json=chat).json()
    answered = openai.OpenAI(base_url=f"{twin_url}/v1", api_key="x").chat.completions.create(
        max_tokens=1, **chat
    )
    assert answered.usage is not None
    assert counted["count"] == answered.usage.prompt_tokens and counted["token_strs"] is None


def test_detokenize_gives_the_vocabulary_words_of_the_ids(twin_url: str) -> None:
    answer = httpx.post(f"{twin_url}/detokenize", json={"tokens": [0, 1, 9]})
    assert answer.json() == {"prompt": "lorem ipsum ipsum "}


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
        ("/detokenize", {"model": "nope", "tokens": [1]}, "model"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(
    twin_url: str, route: str, body: dict[str, object], param: str
) -> None:
    answer = httpx.post(f"{twin_url}{route}", json=body)
    assert answer.status_code in (400, 404)
    assert answer.json()["error"]["param"] == param


def test_version_and_one_models_card(twin: openai.OpenAI, twin_url: str) -> None:
    assert httpx.get(f"{twin_url}/version").json() == {"version": VLLM_API_VERSION}
    card = twin.models.retrieve(MODEL)
    assert card.id == MODEL and card.owned_by == "agentmars"
    with pytest.raises(openai.NotFoundError):
        twin.models.retrieve("nope")
