"""Where OTLP traces go, as the usual variables say."""

from __future__ import annotations

import pytest

from agentmars.sdk.otlp import traces_endpoint_from_env


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/x"}, "http://c:4318/x"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:2/t",
            },
            "http://b:2/t",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_the_endpoint_the_usual_variables_give(
    environ: dict[str, str], expected: str | None
) -> None:
    assert traces_endpoint_from_env(environ) == expected
