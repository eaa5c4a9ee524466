"""OpenAI-client integration: ``instrument_openai(client)``.

Patches the client's ``chat.completions.create``, ``completions.create`` and
``responses.create`` (the Responses API) so every call made inside an agentmars session
carries the session metadata (``request.begin_call``) and records submit and end;
streams are returned wrapped so the first token and the end are recorded as the caller
reads them (a whole response shows no first-token time to the client, so none is
emitted). Calls outside a session pass through untouched.

The patched ``create`` goes through openai's raw-response wrapper (its documented way to
an answer's headers) and keeps the gateway's tool priority for the session
(``request.remember_tool_priority``); the caller gets the parsed answer, as from
``create``, or the raw response when it called ``with_raw_response.create``. The call's
telemetry names the provider ``openai`` (the API the client speaks, whoever serves it:
the conventions' provider "as identified by the client"; ``azure.ai.openai`` for an
Azure client) and the server of the client's ``base_url``. Copies made
by ``with_options(...)`` / ``copy(...)`` are instrumented too. Calls through
``with_streaming_response`` are passed through unrecorded, with a warning.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import openai
from openai._constants import RAW_RESPONSE_HEADER

from agentmars.sdk.integrations.request import (
    Operation,
    Target,
    Targeting,
    recorded_acall,
    recorded_call,
    remember_tool_priority,
)

Client = TypeVar("Client", openai.OpenAI, openai.AsyncOpenAI)
_MARK = "_agentmars_instrumented"
_LAZY_WRAPPERS = ("with_raw_response", "with_streaming_response")


def _raw_create(resource: Any) -> Callable[..., Any]:
    """``resource.with_raw_response.create`` around the unpatched ``create``, built
    afresh: the resource's own cached ``with_raw_response`` is left alone."""
    return type(resource).with_raw_response.func(resource).create  # type: ignore[no-any-return]


def _raw_mode(kwargs: dict[str, Any]) -> str | None:
    """What openai's ``with_raw_response`` ("true") or ``with_streaming_response``
    ("stream") asked of this call, through the header they set."""
    return (kwargs.get("extra_headers") or {}).get(RAW_RESPONSE_HEADER)


def _warn_unrecorded() -> None:
    # The body of a with_streaming_response call is the caller's to read, lazily and
    # in any of several ways: its end and usage cannot be seen without reading it first.
    warnings.warn(
        "agentmars does not record calls made through with_streaming_response; "
        "use create() or with_raw_response.create() inside a session",
        RuntimeWarning,
        stacklevel=3,
    )


class _Answer:
    """The raw response of one call: its headers carry the tool priority, and a caller
    of ``with_raw_response`` gets it back rather than the parsed answer."""

    def __init__(self, wants_raw: bool) -> None:
        self.wants_raw = wants_raw
        self.raw: Any = None

    def take(self, raw: Any) -> Any:
        self.raw = raw
        remember_tool_priority(raw.headers)
        return raw.parse()

    def give(self, recorded: Any) -> Any:
        if not self.wants_raw:
            return recorded
        # parse() caches its answer, and the caller's parse() must give it the stream
        # that records as it is read rather than the bare one.
        self.raw._parsed_by_type[self.raw._cast_to] = recorded
        return self.raw


def _targeting(resource: Any) -> Targeting:
    client = resource._client
    azure = isinstance(client, openai.AzureOpenAI | openai.AsyncAzureOpenAI)
    provider = "azure.ai.openai" if azure else "openai"

    def target(kwargs: Mapping[str, Any]) -> Target:
        model = kwargs.get("model")
        return Target.of_url(None if model is None else str(model), provider, client.base_url)

    return target


def _wrap_sync(resource: Any, operation: Operation) -> Any:
    raw_create, unrecorded = _raw_create(resource), resource.create
    target = _targeting(resource)

    @functools.wraps(resource.create)
    def recorded_create(**kwargs: Any) -> Any:  # the client's create() is keyword-only
        mode = _raw_mode(kwargs)
        if mode == "stream":
            _warn_unrecorded()
            return unrecorded(**kwargs)
        answer = _Answer(wants_raw=mode is not None)
        recorded = recorded_call(
            lambda **kw: answer.take(raw_create(**kw)), kwargs, operation, _is_stream, target
        )
        return answer.give(recorded)

    return recorded_create


def _wrap_async(resource: Any, operation: Operation) -> Any:
    raw_create, unrecorded = _raw_create(resource), resource.create
    target = _targeting(resource)

    @functools.wraps(resource.create)
    async def recorded_create(**kwargs: Any) -> Any:
        mode = _raw_mode(kwargs)
        if mode == "stream":
            _warn_unrecorded()
            return await unrecorded(**kwargs)
        answer = _Answer(wants_raw=mode is not None)

        async def create(**kw: Any) -> Any:
            return answer.take(await raw_create(**kw))

        return answer.give(await recorded_acall(create, kwargs, operation, _is_stream, target))

    return recorded_create


def _is_stream(response: Any) -> bool:
    return isinstance(response, openai.Stream | openai.AsyncStream)


def _instrument_copies(client: Client) -> None:
    """``with_options`` (an alias of ``copy``) builds a new client, whose resources are
    new and unpatched: instrument each copy as it is made."""
    copy = client.copy

    @functools.wraps(copy)
    def instrumented_copy(*args: Any, **kwargs: Any) -> Any:
        return instrument_openai(copy(*args, **kwargs))

    client.copy = client.with_options = instrumented_copy  # type: ignore[method-assign]


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
    operations: list[tuple[Any, Operation]] = [
        (client.chat.completions, "chat"),
        (client.completions, "text_completion"),
        (client.responses, "chat"),  # the event schema's name for a conversation turn
    ]
    for resource, operation in operations:
        resource.create = wrap(resource, operation)
    # The raw- and streaming-response wrappers are built around ``create`` on first use
    # and cached: drop any built before, so the next use wraps the patched ``create``.
    for holder in (client, client.chat, *(resource for resource, _ in operations)):
        for name in _LAZY_WRAPPERS:
            vars(holder).pop(name, None)
    _instrument_copies(client)
    setattr(client, _MARK, True)
    return client
