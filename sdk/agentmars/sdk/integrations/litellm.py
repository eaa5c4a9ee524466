"""LiteLLM integration: ``completion`` / ``acompletion`` / ``responses`` / ``aresponses``
wrappers and ``instrument_litellm()`` / ``uninstrument_litellm()``.

The wrappers inject the session metadata (``request.begin_call``) and time the
call in the caller's thread: submit before the request, first token on the
first content chunk (or Responses delta event), end when the response or the stream
finishes. LiteLLM's own ``CustomLogger`` callbacks are not used for the timing on
purpose: LiteLLM runs success callbacks on a background thread pool after the call
(see ``litellm_core_utils/streaming_handler.py``, ``executor.submit``), too late
for a stream the schedulers consume in real time, and its pre-call hooks
cannot change the outgoing request outside the LiteLLM proxy.

``instrument_litellm()`` puts the wrappers in place of LiteLLM's functions wherever a
loaded module holds them, under any name: ``litellm.completion`` and also names bound
earlier by ``from litellm import completion as litellm_completion``, as OpenHands'
``openhands.sdk.llm.llm`` does at import. It replaces them in LiteLLM's own modules
too, so code importing them afterwards gets the wrappers: the import order does not
matter. What it cannot reach (a function kept in an object or a closure before it
ran) should call these wrappers itself.

A call's telemetry names the model as LiteLLM routes it, without the routing prefix
(``openai/cpu-tiny`` is model ``cpu-tiny`` of provider ``openai``: LiteLLM's
``get_llm_provider``), and the server of its ``api_base``.

The gateway's tool priority (``request.remember_tool_priority``) is read from the
answer's ``_hidden_params["additional_headers"]``, where LiteLLM keeps the
provider's headers (prefixed ``llm_provider-``), of a whole answer and a stream alike.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from types import ModuleType
from typing import Any, NamedTuple

# LiteLLM fetches its model-cost map from the internet at import unless told
# otherwise; serving hosts often have no route out.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from litellm.responses.streaming_iterator import BaseResponsesAPIStreamingIterator

from agentmars.sdk.integrations.request import (
    Target,
    recorded_acall,
    recorded_call,
    remember_tool_priority,
)
from agentmars.sdk.semconv import provider_of_litellm

Function = Callable[..., Any]
_COMPLETION_ARGS = ("model", "messages")
_RESPONSES_ARGS = ("input", "model")

_CREATING: ContextVar[bool] = ContextVar("agentmars_litellm_creating", default=False)
"""Set while a wrapper runs LiteLLM's function. LiteLLM calls its own public functions
by name inside some calls (``responses`` through ``litellm.completion`` for providers
without a Responses API, fallbacks through ``litellm.acompletion``), which once
instrumented are wrappers too: the inner call is part of the outer one, not another."""


def _named(
    positional: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    if len(args) > len(positional):
        raise TypeError(f"pass LiteLLM arguments after {' and '.join(positional)} by keyword")
    return {**dict(zip(positional, args, strict=False)), **kwargs}


def _target(kwargs: Mapping[str, Any]) -> Target:
    """The model, its provider and its server, as LiteLLM routes the call."""
    model = kwargs.get("model")
    if not isinstance(model, str):
        return Target(None if model is None else str(model))
    try:
        name, provider, _, api_base = litellm.get_llm_provider(
            model=model,
            custom_llm_provider=kwargs.get("custom_llm_provider"),
            api_base=kwargs.get("api_base") or kwargs.get("base_url"),
        )
    except Exception:  # LiteLLM refuses the call itself then, with its own message
        return Target(model)
    if api_base:
        return Target.of_url(name, provider_of_litellm(provider), api_base)
    return Target(name, provider_of_litellm(provider))


def _provider_headers(response: Any) -> dict[str, str]:
    hidden = getattr(response, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    if not isinstance(headers, dict):
        return {}
    return {str(k).removeprefix("llm_provider-"): v for k, v in headers.items()}


def _is_stream(response: Any) -> bool:
    return isinstance(response, litellm.CustomStreamWrapper | BaseResponsesAPIStreamingIterator)


def _recorded(original: Function, positional: tuple[str, ...]) -> Function:
    def create(**kwargs: Any) -> Any:
        creating = _CREATING.set(True)
        try:
            response = original(**kwargs)
        finally:
            _CREATING.reset(creating)
        remember_tool_priority(_provider_headers(response))
        return response

    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        if _CREATING.get():
            return original(*args, **kwargs)
        named = _named(positional, args, kwargs)
        return recorded_call(create, named, "chat", _is_stream, _target)

    return recorded


def _arecorded(original: Function, positional: tuple[str, ...]) -> Function:
    async def create(**kwargs: Any) -> Any:
        creating = _CREATING.set(True)
        try:
            response = await original(**kwargs)
        finally:
            _CREATING.reset(creating)
        remember_tool_priority(_provider_headers(response))
        return response

    @functools.wraps(original)
    async def recorded(*args: Any, **kwargs: Any) -> Any:
        if _CREATING.get():
            return await original(*args, **kwargs)
        named = _named(positional, args, kwargs)
        return await recorded_acall(create, named, "chat", _is_stream, _target)

    return recorded


completion = _recorded(litellm.completion, _COMPLETION_ARGS)
"""``litellm.completion`` with session metadata and boundary events."""
acompletion = _arecorded(litellm.acompletion, _COMPLETION_ARGS)
"""``litellm.acompletion`` with session metadata and boundary events."""
responses = _recorded(litellm.responses, _RESPONSES_ARGS)
"""``litellm.responses`` (the Responses API) with session metadata and boundary events."""
aresponses = _arecorded(litellm.aresponses, _RESPONSES_ARGS)
"""``litellm.aresponses`` with session metadata and boundary events."""


class _Wrapped(NamedTuple):
    home: ModuleType
    """The module defining the function."""
    name: str
    original: Function
    wrapper: Function


_WRAPPED = [
    _Wrapped(litellm, "completion", litellm.completion, completion),
    _Wrapped(litellm, "acompletion", litellm.acompletion, acompletion),
    _Wrapped(litellm, "responses", litellm.responses, responses),
    _Wrapped(litellm, "aresponses", litellm.aresponses, aresponses),
]
# OpenHands imports ``responses`` / ``aresponses`` from ``litellm.responses.main``. Since
# LiteLLM's dispatch layer (1.8x) those are other functions than ``litellm.responses`` /
# ``aresponses`` (the implementations behind them): they are wrapped too.
_IMPLEMENTATION = importlib.import_module("litellm.responses.main")
_WRAPPED += [
    _Wrapped(_IMPLEMENTATION, name, implementation, wrap(implementation, _RESPONSES_ARGS))
    for name, wrap in (("responses", _recorded), ("aresponses", _arecorded))
    if (implementation := getattr(_IMPLEMENTATION, name)) is not getattr(litellm, name)
]


def _rebind(replacements: dict[int, Function]) -> None:
    """In every loaded module but this one, bind each name whose value's id is a key
    of ``replacements`` to that key's value. (By id: a module may hold values that
    cannot be hashed; the functions keyed are kept alive by ``_WRAPPED``.)"""
    for module in list(sys.modules.values()):
        if not isinstance(module, ModuleType) or module.__name__ == __name__:
            continue
        namespace = module.__dict__
        for name, value in list(namespace.items()):
            replacement = replacements.get(id(value))
            if replacement is not None:
                namespace[name] = replacement


def instrument_litellm() -> None:
    """Route LiteLLM's ``completion``, ``acompletion``, ``responses`` and ``aresponses``
    through the wrappers, wherever loaded code holds them, whichever was imported first
    (idempotent; ``uninstrument_litellm`` undoes it).

    Raises ``RuntimeError``, changing nothing, when one of them was replaced since
    this module was imported (by another instrumentation): the code holding the
    replacement would go unrecorded, and silently."""
    for home, name, original, wrapper in _WRAPPED:
        bound = getattr(home, name)
        if bound is not original and bound is not wrapper:
            raise RuntimeError(
                f"{home.__name__}.{name} is {bound!r}, not the LiteLLM function agentmars "
                f"wrapped at its import: something replaced it since, and the code holding "
                f"the replacement cannot be instrumented. Call instrument_litellm() "
                f"before installing that replacement, or import "
                f"agentmars.sdk.integrations.litellm after it."
            )
    _rebind({id(w.original): w.wrapper for w in _WRAPPED})


def uninstrument_litellm() -> None:
    """Put LiteLLM's own functions back wherever a wrapper is bound, by
    ``instrument_litellm`` or by an import after it."""
    _rebind({id(w.wrapper): w.original for w in _WRAPPED})
