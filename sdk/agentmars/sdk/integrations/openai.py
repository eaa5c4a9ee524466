"""OpenAI-client integration: ``instrument_openai(client)``.

Patches the client's ``chat.completions.create`` and ``completions.create`` so
every call made inside an agentmars session carries the session metadata
(``request.begin_call``) and records submit and end; streams are returned
wrapped so the first token and the end are recorded as the caller reads them
(a whole response shows no first-token time to the client, so none is emitted).
Calls outside a session pass through untouched. The patched ``create`` goes through
openai's raw-response wrapper (its documented way to an answer's headers) and keeps
the gateway's tool priority for the session (``request.remember_tool_priority``);
the caller gets the parsed answer, as from ``create``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import openai

from agentmars.sdk.integrations.request import (
    Operation,
    recorded_acall,
    recorded_call,
    remember_tool_priority,
)

Client = TypeVar("Client", openai.OpenAI, openai.AsyncOpenAI)
_MARK = "_agentmars_instrumented"


def _raw_create(resource: Any) -> Callable[..., Any]:
    """``resource.with_raw_response.create`` around the unpatched ``create``, built
    afresh: the resource's own cached ``with_raw_response`` is left alone."""
    return type(resource).with_raw_response.func(resource).create  # type: ignore[no-any-return]


def _wrap_sync(resource: Any, operation: Operation) -> Any:
    raw_create = _raw_create(resource)

    def create(**kwargs: Any) -> Any:
        answer = raw_create(**kwargs)
        remember_tool_priority(answer.headers)
        return answer.parse()

    @functools.wraps(resource.create)
    def recorded_create(**kwargs: Any) -> Any:  # the client's create() is keyword-only
        return recorded_call(create, kwargs, operation, _is_stream)

    return recorded_create


def _wrap_async(resource: Any, operation: Operation) -> Any:
    raw_create = _raw_create(resource)

    async def create(**kwargs: Any) -> Any:
        answer = await raw_create(**kwargs)
        remember_tool_priority(answer.headers)
        return answer.parse()

    @functools.wraps(resource.create)
    async def recorded_create(**kwargs: Any) -> Any:
        return await recorded_acall(create, kwargs, operation, _is_stream)

    return recorded_create


def _is_stream(response: Any) -> bool:
    return isinstance(response, openai.Stream | openai.AsyncStream)


def instrument_openai(client: Client) -> Client:
    """Instrument an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client in place
    (idempotent) and return it."""
    if not isinstance(client, openai.OpenAI | openai.AsyncOpenAI):
        raise TypeError(
            f"instrument_openai expects an openai.OpenAI or openai.AsyncOpenAI client, "
            f"got {type(client).__name__}"
        )
    if getattr(client, _MARK, False):
        return client
    wrap = _wrap_async if isinstance(client, openai.AsyncOpenAI) else _wrap_sync
    chat, text = client.chat.completions, client.completions
    chat.create = wrap(chat, "chat")  # type: ignore[method-assign]
    text.create = wrap(text, "text_completion")  # type: ignore[method-assign]
    setattr(client, _MARK, True)
    return client
