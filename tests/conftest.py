"""What every part's tests share: the environment OpenHands and LiteLLM need, set
before any test module imports them (LiteLLM fetches its model-cost map in a background
thread otherwise, which can deadlock with the imports of the main thread on a host
without a route out; the Makefile sets the same), and an OpenTelemetry tracer provider
whose spans are kept in memory (the SDK's sink, the gateway's and the sandbox's spans
are tested on it)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """A provider that ends its spans in ``exporter``."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()
