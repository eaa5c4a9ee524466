"""``GatewayAdmissions`` against a real gateway (``agentmars serve --engine sim``): each
session's admission is its first call leaving the gateway for the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from agentmars.runtime.replay.admissions import AdmissionsUnreadable, GatewayAdmissions
from tests.cli.serving import Twin, served_twin


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    with served_twin() as served:
        yield served


def _call(twin: Twin, session: str) -> None:
    answer = httpx.post(
        twin.base + "/v1/completions",
        json={"model": "cpu-tiny", "prompt": "hello", "max_tokens": 2},
        headers={"X-Session-ID": session},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text


async def test_each_session_is_admitted_once_at_its_first_call(twin: Twin) -> None:
    async with GatewayAdmissions(twin.base, twin.token) as admissions:
        before = time.monotonic_ns()
        _call(twin, "first")
        between = time.monotonic_ns()
        _call(twin, "first")  # a later call of the same session: not an admission
        _call(twin, "second")
        after = time.monotonic_ns()
        deadline = time.monotonic() + 10
        while len(admissions.admitted_ns) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the reader reads while this test waits
    assert set(admissions.admitted_ns) == {"first", "second"}
    assert before <= admissions.admitted_ns["first"] <= between
    assert between <= admissions.admitted_ns["second"] <= after


async def test_a_stream_it_may_not_read_is_an_error_at_start(twin: Twin) -> None:
    with pytest.raises(AdmissionsUnreadable, match="did not open"):
        async with GatewayAdmissions(twin.base, "not-the-token"):
            pass
