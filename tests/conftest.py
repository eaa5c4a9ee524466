"""What every part's tests share: the environment OpenHands and LiteLLM need, set
before any test module imports them (LiteLLM fetches its model-cost map in a background
thread otherwise, which can deadlock with the imports of the main thread on a host
without a route out; the Makefile sets the same), and an OpenTelemetry tracer provider
whose spans are kept in memory (the SDK's sink, the gateway's and the sandbox's spans
are tested on it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


TESTS = Path(__file__).parent
VLLM_MODULES = frozenset(
    path.relative_to(TESTS.parent).as_posix()
    for path in TESTS.rglob("test_*.py")
    if "vllm_python" in path.read_text()
)
"""The test modules that start vLLM: those that take the ``vllm_python`` fixture."""
LATE_VLLM_MODULES = frozenset(
    f"tests/server/engines/vllm/{name}.py"
    for name in (
        "test_every_policy_served",  # each server on vllm_core(), with long deadlines
        # vLLM's scheduler in a subprocess, no server and no deadline but the test's:
        "test_bench_schedule",
        "test_prefix_lookup",
        "test_pause_running",
        "test_pins",
        "test_cpu_tier_order",
        "test_vllm033",
    )
)
"""Of those, the ones run last, after every module without vLLM, by the worker that ran
those, while the other worker still runs the rest (each on its own core:
``vllm_core``)."""
assert LATE_VLLM_MODULES <= VLLM_MODULES, sorted(LATE_VLLM_MODULES - VLLM_MODULES)


def _scope(module: str) -> str:
    if module in LATE_VLLM_MODULES:
        return "vllm-late"
    return "vllm" if module in VLLM_MODULES else module


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that start vLLM first, the late ones last (``VllmApart``)."""
    rank = {"vllm": 0, "vllm-late": 2}
    items.sort(key=lambda item: rank.get(_scope(item.nodeid.split("::")[0]), 1))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":  # -n's default; another --dist is kept
        return None
    from xdist.scheduler import LoadScopeScheduling

    class VllmApart(LoadScopeScheduling):  # type: ignore[misc]
        """How ``make test``'s two workers share the suite: the modules that start
        vLLM, most of its time, run one after another on one worker, from the start;
        every other module runs whole on the other worker meanwhile, and then the late
        vLLM modules, on the other core. Two vLLM servers on one core would miss their
        deadlines; a module whole keeps its module fixtures set up once. (xdist's own
        ``loadgroup`` marks do not group under pytest 9.2: it renames ``_nodeid``,
        which pytest no longer reads.)"""

        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid.split("::")[0])

    return VllmApart(config, log)
