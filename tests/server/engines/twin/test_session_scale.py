"""A new session's first call on the twin costs the same at any number of sessions
(issue 38: from 1,000 to 10,000 sessions it rose from 6.2 to 10.1 ms). Counted, not
timed: the engine's sessions and pins are swapped for mappings that count the entries
anyone looks at, and a new session's first call may look at a few, not at all of them.
The engine runs on its own (no HTTP), steps of 10 us: about 3 s."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest

from agentmars.server.engines.twin import engine as engine_module
from agentmars.server.engines.twin.engine import CallRequest, LiveEngine
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import FittedCost, Profile, load_profile

SESSIONS = 3000


def _profile() -> Profile:
    base = load_profile("cpu-tiny")
    return base.model_copy(update={"cost": FittedCost(c0=1e-5, c1=0.0, c2=0.0, c3=0.0, c4=0.0)})


class _Counted(OrderedDict[str, Any]):
    """A mapping that counts the entries iterated over, by any of its views."""

    looked_at = 0

    def __iter__(self) -> Iterator[str]:
        for key in super().__iter__():
            self.looked_at += 1
            yield key

    def keys(self) -> Any:
        return iter(self)

    def values(self) -> Any:
        return (self[key] for key in self)

    def items(self) -> Any:
        return ((key, self[key]) for key in self)


async def _call(engine: LiveEngine, session_id: str, max_tokens: int = 2) -> None:
    stream = engine.submit(
        CallRequest(prompt="hello " * 40, prompt_tokens=60, max_tokens=max_tokens,
                    session_id=session_id)
    )  # fmt: skip
    async for _ in stream.tokens():
        pass


async def _looked_at_by_new_sessions(engine: LiveEngine, known: int) -> tuple[int, int, int]:
    """Entries of the sessions and of the pins looked at while 10 new sessions make their
    first call, ``known`` sessions (each with one call done) before them; and the pins."""
    runner = asyncio.create_task(engine.run())
    try:
        for number in range(known):
            await _call(engine, f"s{number}")
        engine._sessions = sessions = _Counted(engine._sessions)
        engine.kv.pins = pins = _Counted(engine.kv.pins)
        for number in range(10):
            await _call(engine, f"new{number}")
    finally:
        runner.cancel()
    return sessions.looked_at, pins.looked_at, len(pins)


@pytest.mark.parametrize("policy", ["mars", "continuum"])
def test_a_new_sessions_first_call_looks_at_a_few_sessions_and_pins_not_all(policy: str) -> None:
    # mars: `agentmars serve`'s default; continuum (a TTL longer than the test): a pin for
    # every session, each with an expiry the engine watches.
    settings = {"ttl_s": 600.0} if policy == "continuum" else {}
    engine = LiveEngine(_profile(), make_policy(policy, **settings))
    sessions, pins, pinned = asyncio.run(_looked_at_by_new_sessions(engine, SESSIONS))
    # Before issue 38's fix: every new session copied all the sessions' ids (3,000+
    # each), and every step went through all the pins.
    assert sessions <= 10
    assert pins <= 10
    if policy == "continuum":
        assert pinned >= SESSIONS  # every session holds a pin (none expired)
        # The expiries the engine keeps stay in proportion to the pins held.
        assert len(engine._expiries) <= 2 * pinned + 64


def test_past_its_memory_the_engine_forgets_the_least_recently_used_idle_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "SESSION_MEMORY", 2)
    engine = LiveEngine(_profile(), make_policy("fcfs"))

    async def play() -> list[list[str]]:
        runner = asyncio.create_task(engine.run())
        remembered = []
        try:
            await _call(engine, "a")
            await _call(engine, "b")
            # A long call: its session is busy, and busy sessions are not forgotten (the
            # calls below take a few steps each, it takes a context's worth of them).
            longest = engine.profile.max_model_len - 100
            busy = asyncio.create_task(_call(engine, "busy", max_tokens=longest))
            while "busy" not in engine._sessions:
                assert not busy.done(), busy.result()
                await asyncio.sleep(0)
            remembered.append(list(engine._sessions))
            for session in ("c", "d", "b"):
                await _call(engine, session)
                remembered.append(list(engine._sessions))
            busy.cancel()
        finally:
            runner.cancel()
        return remembered

    assert asyncio.run(play()) == [
        ["b", "busy"],  # a, the least recently used idle one, went
        ["busy", "c"],  # b went
        ["busy", "d"],  # busy is older than c, but busy: c went
        ["busy", "b"],  # b comes back as a new session
    ]
