"""Shared fixtures for the SDK tests: an in-memory sink behind a private emitter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentmars import sdk


@pytest.fixture
def memory_sink() -> sdk.MemorySink:
    return sdk.MemorySink()


@pytest.fixture
def emitter(memory_sink: sdk.MemorySink) -> sdk.Emitter:
    """A private emitter delivering to ``memory_sink``; sessions are given it explicitly."""
    return sdk.Emitter([memory_sink])


@pytest.fixture
def default_sink() -> Iterator[sdk.MemorySink]:
    """A MemorySink on the process-wide emitter, removed again afterwards."""
    sink = sdk.MemorySink()
    sdk.default_emitter().add(sink)
    try:
        yield sink
    finally:
        sdk.default_emitter().remove(sink)
