"""``instrument_litellm()`` whichever was imported first: LiteLLM's functions are
replaced wherever loaded code holds them (OpenHands binds them when it is imported),
and ``uninstrument_litellm()`` puts them all back. Also the Responses API wrappers."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import litellm
import pytest

from agentmars import sdk
from agentmars.sdk.integrations import litellm as agentmars_litellm

from .conftest import LLMServer, assert_call_recorded

os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")


@contextmanager
def _instrumented() -> Iterator[None]:
    agentmars_litellm.instrument_litellm()
    try:
        yield
    finally:
        agentmars_litellm.uninstrument_litellm()


def _openhands_llm(server: LLMServer, **fields: Any) -> Any:
    """OpenHands' LLM (its module imported now, if not before) aimed at ``server``."""
    openhands_llm = pytest.importorskip("openhands.sdk.llm.llm")
    from pydantic import SecretStr

    return openhands_llm.LLM(
        model="openai/scripted",
        base_url=f"{server.url}/v1",
        api_key=SecretStr("unused"),
        reasoning_effort=None,
        num_retries=0,
        usage_id="agentmars-test",
        **fields,
    )


def _hello() -> list[Any]:
    from openhands.sdk.llm import Message, TextContent

    return [Message(role="user", content=[TextContent(text="hello there")])]


def _llm_events(sink: sdk.MemorySink, session_id: str) -> list[Any]:
    return [e for e in sink.of_session(session_id) if e.kind.startswith("llm_")]


@pytest.mark.parametrize("stream", [False, True])
def test_the_calls_of_openhands_imported_before_are_recorded(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    llm = _openhands_llm(llm_server, api_mode="chat", max_output_tokens=5, stream=stream)
    from openhands.sdk.llm import llm as openhands_llm

    assert openhands_llm.litellm_completion is litellm.completion  # bound at its import
    with _instrumented(), sdk.session(emitter=emitter) as s:
        llm.completion(_hello(), **({"on_token": lambda chunk: None} if stream else {}))
    assert openhands_llm.litellm_completion is litellm.completion  # put back
    assert llm_server.requests[-1].headers["x-session-id"] == s.session_id
    assert_call_recorded(events, s.session_id, streamed=stream, n_tokens=5)
    end = _llm_events(events, s.session_id)[-1]
    assert end.output_tokens == 5 and end.prompt_tokens


def test_the_responses_calls_of_openhands_are_recorded(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    llm = _openhands_llm(llm_server, api_mode="responses", max_output_tokens=5)
    with _instrumented(), sdk.session(emitter=emitter) as s:
        llm.responses(_hello())
    request = llm_server.requests[-1]
    assert request.path == "/v1/responses" and request.headers["x-session-id"] == s.session_id
    submit, end = _llm_events(events, s.session_id)
    assert (submit.kind, end.kind, end.status) == ("llm_submit", "llm_end", "ok")
    # LiteLLM raises the bound it sends (to 16); the answer's usage is what is recorded.
    assert end.output_tokens == request.body["max_output_tokens"] and end.prompt_tokens


def test_openhands_imported_after_instrumenting_gets_the_wrappers() -> None:
    """In a fresh interpreter, as the import order cannot be undone in this one."""
    program = """
import importlib
import agentmars.sdk.integrations.litellm as agentmars_litellm
import litellm
implementation = importlib.import_module("litellm.responses.main")
originals = {
    "litellm_completion": litellm.completion,
    "litellm_acompletion": litellm.acompletion,
    "litellm_responses": implementation.responses,
    "litellm_aresponses": implementation.aresponses,
}
agentmars_litellm.instrument_litellm()
import openhands.sdk.llm.llm as openhands_llm
for name, original in originals.items():
    bound = getattr(openhands_llm, name)
    assert bound is not original and bound.__wrapped__ is original, name
agentmars_litellm.uninstrument_litellm()
for name, original in originals.items():
    assert getattr(openhands_llm, name) is original, name
"""
    pytest.importorskip("openhands.sdk")
    subprocess.run([sys.executable, "-c", program], check=True, timeout=300)


def test_uninstrument_puts_back_every_binding_made_since() -> None:
    original = litellm.completion
    late = types.ModuleType("agentmars_test_late_importer")
    with _instrumented():
        sys.modules[late.__name__] = late
        exec("from litellm import completion", late.__dict__)
        assert late.completion is agentmars_litellm.completion
    del sys.modules[late.__name__]
    assert late.completion is original and litellm.completion is original
    holders = [
        module.__name__
        for module in list(sys.modules.values())
        if isinstance(module, types.ModuleType)
        and any(value is agentmars_litellm.completion for value in vars(module).values())
    ]
    assert holders == [agentmars_litellm.__name__]


def test_a_function_replaced_since_the_import_is_refused_loudly() -> None:
    original = litellm.completion
    litellm.completion = lambda *args, **kwargs: None
    try:
        with pytest.raises(RuntimeError, match=r"litellm\.completion is .* replaced it since"):
            agentmars_litellm.instrument_litellm()
        assert litellm.acompletion is not agentmars_litellm.acompletion  # nothing changed
    finally:
        litellm.completion = original


def _responses_kwargs(server: LLMServer, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "api_base": f"{server.url}/v1",
        "api_key": "unused",
        "input": "hello there",
        "max_output_tokens": 5,
        **extra,
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_and_aresponses(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink, stream: bool
) -> None:
    kwargs = _responses_kwargs(llm_server, "hosted_vllm/scripted", stream=stream)
    async with sdk.session(emitter=emitter) as s:
        reply = agentmars_litellm.responses(**kwargs)
        if stream:
            assert len(list(reply)) > 5
        reply = await agentmars_litellm.aresponses(**kwargs)
        if stream:
            assert len([event async for event in reply]) > 5
    request = llm_server.requests[-1]
    assert request.path == "/v1/responses" and request.headers["x-session-id"] == s.session_id
    assert request.body["vllm_xargs"]["turn"] == 1
    kinds = ["llm_submit", *(["llm_first_token"] if stream else []), "llm_end"]
    calls = _llm_events(events, s.session_id)
    assert [e.kind for e in calls] == kinds * 2
    for end in (calls[len(kinds) - 1], calls[-1]):
        assert (end.prompt_tokens, end.output_tokens) == (2, request.body["max_output_tokens"])
        assert end.finish_reason == "completed" and not end.ended_in_tool_call


def test_a_call_litellm_makes_inside_another_is_part_of_it(
    llm_server: LLMServer, emitter: sdk.Emitter, events: sdk.MemorySink
) -> None:
    """LiteLLM answers ``responses`` for a provider without a Responses API through
    ``litellm.completion``, which is then a wrapper too: still one call."""
    with _instrumented(), sdk.session(emitter=emitter) as s:
        litellm.responses(**_responses_kwargs(llm_server, "deepseek/scripted"))
    request = llm_server.requests[-1]
    assert request.path == "/v1/chat/completions"
    assert request.headers["x-session-id"] == s.session_id
    assert [e.kind for e in _llm_events(events, s.session_id)] == ["llm_submit", "llm_end"]
    assert _llm_events(events, s.session_id)[-1].output_tokens == 5
