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

from agentmars.sdk.integrations.request import recorded_acall, recorded_call

_ORIGINAL_COMPLETION: Callable[..., Any] = litellm.completion
_ORIGINAL_ACOMPLETION: Callable[..., Any] = litellm.acompletion


def _named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """LiteLLM's first two parameters are ``model`` and ``messages``."""
    if len(args) > 2:
        raise TypeError("pass LiteLLM arguments after model and messages by keyword")
    return {**dict(zip(("model", "messages"), args, strict=False)), **kwargs}


@functools.wraps(_ORIGINAL_COMPLETION)
def completion(*args: Any, **kwargs: Any) -> Any:
    """``litellm.completion`` with session metadata and boundary events."""
    return recorded_call(_ORIGINAL_COMPLETION, _named(args, kwargs), "chat", _is_stream)


@functools.wraps(_ORIGINAL_ACOMPLETION)
async def acompletion(*args: Any, **kwargs: Any) -> Any:
    """``litellm.acompletion`` with session metadata and boundary events."""
    return await recorded_acall(_ORIGINAL_ACOMPLETION, _named(args, kwargs), "chat", _is_stream)


def _is_stream(response: Any) -> bool:
    return isinstance(response, litellm.CustomStreamWrapper)


def instrument_litellm() -> None:
    """Route ``litellm.completion`` / ``litellm.acompletion`` through the wrappers
    (idempotent)."""
    litellm.completion = completion
    litellm.acompletion = acompletion
