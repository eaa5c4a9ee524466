"""LiteLLM integration: ``completion`` / ``acompletion`` wrappers and ``instrument_litellm()``.

The wrappers inject the session metadata (``request.begin_call``) and time the
call in the caller's thread: submit before the request, first token on the
first content chunk, end when the response or the stream finishes. LiteLLM's
own ``CustomLogger`` callbacks are not used for the timing on purpose: LiteLLM
runs success callbacks on a background thread pool after the call (see
``litellm_core_utils/streaming_handler.py``, ``executor.submit``), too late
for a stream the schedulers consume in real time, and its pre-call hooks
cannot change the outgoing request outside the LiteLLM proxy.

``instrument_litellm()`` swaps ``litellm.completion`` / ``litellm.acompletion``
for the wrappers, for code that calls them through the module; code that bound
the functions earlier (``from litellm import completion``) should call these
wrappers instead.

The gateway's tool priority (``request.remember_tool_priority``) is read from the
answer's ``_hidden_params["additional_headers"]``, where LiteLLM keeps the
provider's headers (prefixed ``llm_provider-``), of a whole answer and a stream alike.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

# LiteLLM fetches its model-cost map from the internet at import unless told
# otherwise; serving hosts often have no route out.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm

from agentmars.sdk.integrations.request import (
    recorded_acall,
    recorded_call,
    remember_tool_priority,
)

_ORIGINAL_COMPLETION: Callable[..., Any] = litellm.completion
_ORIGINAL_ACOMPLETION: Callable[..., Any] = litellm.acompletion


def _named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's first two parameters are ``model`` and ``messages``."""
    if len(args) > 2:
        raise TypeError("pass LiteLLM arguments after model and messages by keyword")
    return {**dict(zip(("model", "messages"), args, strict=False)), **kwargs}


def _provider_headers(response: Any) -> dict[str, str]:
    hidden = getattr(response, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    if not isinstance(headers, dict):
        return {}
    return {str(k).removeprefix("llm_provider-"): v for k, v in headers.items()}


def _create(**kwargs: Any) -> Any:
    response = _ORIGINAL_COMPLETION(**kwargs)
    remember_tool_priority(_provider_headers(response))
    return response


async def _acreate(**kwargs: Any) -> Any:
    response = await _ORIGINAL_ACOMPLETION(**kwargs)
    remember_tool_priority(_provider_headers(response))
    return response


@functools.wraps(_ORIGINAL_COMPLETION)
def completion(*args: Any, **kwargs: Any) -> Any:
    """``litellm.completion`` with session metadata and boundary events."""
    return recorded_call(_create, _named(args, kwargs), "chat", _is_stream)


@functools.wraps(_ORIGINAL_ACOMPLETION)
async def acompletion(*args: Any, **kwargs: Any) -> Any:
    """``litellm.acompletion`` with session metadata and boundary events."""
    return await recorded_acall(_acreate, _named(args, kwargs), "chat", _is_stream)


def _is_stream(response: Any) -> bool:
    return isinstance(response, litellm.CustomStreamWrapper)


def instrument_litellm() -> None:
    """Route ``litellm.completion`` / ``litellm.acompletion`` through the wrappers
    (idempotent)."""
    litellm.completion = completion
    litellm.acompletion = acompletion
