"""Property-based requests from the gateway's own OpenAPI document (schemathesis):
whatever the body, no 5xx comes from the gateway itself. A 502 that reports the
engine's own failure is the engine's (the scripted engine answers 500 to some
malformed message lists) and is counted apart."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from agentmars.server.engines.scripted.app import ScriptedLatency, create_scripted_llm_app
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.web.serving import serve_in_thread
from tests.server.gateway.conftest import MODEL, TOKEN

CASES = 300
STREAM = "/v1/events/stream"  # endless by design: not a request/response operation


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[str, dict[str, Any]]]:
    """A gateway in front of an instant scripted engine, and its OpenAPI document with
    ``model`` narrowed to the model the engine serves (so bodies reach the engine)."""
    engine_app = create_scripted_llm_app(ScriptedLatency(0.0, 0.0), model=MODEL)
    app = create_gateway_app(GatewayConfig(upstream_url="", token=TOKEN))
    with serve_in_thread(engine_app) as engine_url:
        app.state.gateway.config.upstream_url = engine_url
        with serve_in_thread(app) as url:
            document = app.openapi()
            for path in ("/v1/chat/completions", "/v1/completions"):
                body = document["paths"][path]["post"]["requestBody"]
                body["content"]["application/json"]["schema"]["properties"]["model"] = {
                    "enum": [MODEL]
                }
            yield url, document


def _strategy(document: dict[str, Any]) -> st.SearchStrategy[Any]:
    schema = schemathesis.openapi.from_dict(document)
    strategies = []
    for path, methods in document["paths"].items():
        if path == STREAM:
            continue
        for method in methods:
            operation = schema[path][method.upper()]
            strategies.append(operation.as_strategy())
            if path.endswith("completions"):
                strategies.append(operation.as_strategy(GenerationMode.NEGATIVE))
    return st.one_of(strategies)


def _engine_failed(response: Any) -> bool:
    """The gateway's 502 for an engine that answered 5xx (``upstream_error``)."""
    if response.status_code != 502:
        return False
    error = response.json()["error"]
    return bool(error["type"] == "upstream_error" and "HTTP 500" in error["message"])


def test_no_case_gets_a_5xx(live: tuple[str, dict[str, Any]]) -> None:
    url, document = live
    statuses: Counter[tuple[str, int]] = Counter()

    @given(case=_strategy(document))
    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        response = case.call(base_url=url, timeout=10)
        statuses[(case.path, response.status_code)] += 1
        assert response.status_code < 500 or _engine_failed(response), (
            case.path,
            case.body,
            response.text[:500],
        )

    check()
    assert sum(statuses.values()) >= 200
    # the run reached the engine and answered from it, not only refusals
    assert statuses[("/v1/chat/completions", 200)] > 0
    assert statuses[("/v1/completions", 200)] > 0
