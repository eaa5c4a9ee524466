"""Replay agents: one per session of a workload, against a gateway, through the SDK.

Each agent opens an SDK session (``sdk.session``) and, turn by turn, asks the engine for
the turn's output through the instrumented OpenAI client (``instrument_openai``): a
streamed completion whose prompt is the session's whole context so far as token ids
(the previous prompt, its output, the turn's append), ``max_tokens`` the workload's
output length with ``ignore_eos``, so the engine computes the prompt and generates every
token the workload says. A turn that ends in a tool sends its kind as the SDK's hint
(``sdk.hints(next_tool=...)``: the call expects a tool), then runs the tool in the
session's sandbox of the pool (``tools.tool_exec``: a real command on the session's
repository, sized to the tool) at the tool priority the gateway answered with.

Events: the SDK's and the pool's go to ``events`` (a ``MemorySink``: the run's records,
``records.run_record``); the pool's tool events and each session's end also go to the
gateway (``gateway_sink``), whose own LLM events the policy sees (the SDK's are not
sent again, so the policy counts each call once).

Open-loop workloads start each session at its arrival time; closed-loop ones keep
``concurrency`` sessions running, the next starting when one ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

from agentmars import sdk
from agentmars.runtime.replay.repository import write_repository
from agentmars.runtime.replay.tools import tool_exec
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import SandboxError
from agentmars.sdk.emitter import Emitter, Sink
from agentmars.sdk.events import Event, SessionEnd
from agentmars.sdk.integrations.openai import instrument_openai
from agentmars.sdk.sinks import MemorySink
from agentmars.sdk.sinks.http import HttpSink
from agentmars.server.workloads.model import SessionSpec, Workload

FIRST_PLAIN_TOKEN = 3
"""Token ids below this are special tokens in the tiny model's (and most) vocabularies."""
VOCAB = 512
"""Prompt token ids are drawn below this: the tiny model's vocabulary (the twin takes any)."""
CALL_TIMEOUT_S = 300.0


class ReplayError(RuntimeError):
    """A session of the replay failed; the message names it and why."""


@dataclass(frozen=True)
class ReplayOptions:
    model: str
    """The served model's id (``/v1/models``)."""
    seed: int = 0
    """Seed of the prompts' token ids."""


@dataclass
class SessionOutcome:
    session_id: str
    arrival_ns: int
    """``time.monotonic_ns()`` when the session arrived (its agent started)."""
    end_ns: int = 0
    error: str | None = None


@dataclass
class ReplayRun:
    """What the agents did: each session's outcome, and every event they saw."""

    start_ns: int
    outcomes: list[SessionOutcome] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    admitted_ns: dict[str, int] = field(default_factory=dict)
    """When the gateway admitted each session, where it was read (``admissions``)."""

    @property
    def failed(self) -> list[SessionOutcome]:
        return [outcome for outcome in self.outcomes if outcome.error is not None]


class _SessionEndsTo:
    """Forwards the sessions' ends to the gateway (its admission half ends them there)."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    def emit(self, event: Event) -> None:
        if isinstance(event, SessionEnd):
            self._sink.emit(event)

    def close(self) -> None:
        """The gateway's sink is the caller's to close."""


def prompt_ids(spec: SessionSpec, seed: int) -> list[list[int]]:
    """Token ids of each turn's append, seeded by the session; a prefix group's shared
    prefix is the same ids in every session of the group (its KV can be shared)."""
    own = random.Random(f"{seed}:{spec.session_id}")
    appends = [
        [own.randrange(FIRST_PLAIN_TOKEN, VOCAB) for _ in range(turn.append_tokens)]
        for turn in spec.turns
    ]
    if spec.prefix_group is not None and spec.shared_prefix_tokens:
        shared = random.Random(f"{seed}:group:{spec.prefix_group}")
        prefix = [
            shared.randrange(FIRST_PLAIN_TOKEN, VOCAB) for _ in range(spec.shared_prefix_tokens)
        ]
        appends[0][: len(prefix)] = prefix
    return appends


class WorkloadReplay:
    """Runs a workload's sessions, each in a sandbox session of ``pool`` holding its
    repository: open-loop, each at its arrival time, or closed-loop, ``concurrency`` at
    a time. A subclass runs a session's agent (``_agent``); what it raises of
    ``FAILURES`` fails that session only."""

    FAILURES: tuple[type[Exception], ...] = (SandboxError, ReplayError)

    def __init__(self, pool: SandboxPool, events: MemorySink, options: ReplayOptions) -> None:
        self._pool = pool
        self._events = events
        self._options = options

    async def run(
        self, workload: Workload, on_done: Callable[[SessionOutcome], None] | None = None
    ) -> ReplayRun:
        """Every session of ``workload``, each in a workspace holding its repository;
        every workspace is closed after, whatever happened."""
        sessions = workload.sessions
        for index, spec in enumerate(sessions):
            workspace = await asyncio.to_thread(self._pool.open_session, spec.session_id)
            await asyncio.to_thread(write_repository, workspace, self._options.seed + index)
        run = ReplayRun(start_ns=time.monotonic_ns())
        try:
            if workload.arrival == "closed":
                assert workload.concurrency is not None
                run.outcomes = await self._closed_loop(sessions, workload.concurrency, on_done)
            else:
                run.outcomes = await self._open_loop(sessions, run.start_ns, on_done)
        finally:
            for spec in sessions:
                # One closed already or that cannot be closed is unmounted when the
                # pool closes.
                with contextlib.suppress(SandboxError):
                    await self._pool.close_session(spec.session_id)
        run.events = list(self._events.events)
        return run

    async def close(self) -> None:
        """Release what the agents hold (nothing here)."""

    async def _open_loop(
        self,
        sessions: Sequence[SessionSpec],
        start_ns: int,
        on_done: Callable[[SessionOutcome], None] | None,
    ) -> list[SessionOutcome]:
        ended = _Ended(sessions)

        async def at_arrival(spec: SessionSpec) -> SessionOutcome:
            delay_s = start_ns / 1e9 + spec.arrival_s - time.monotonic()
            await asyncio.sleep(max(delay_s, 0.0))
            await ended.all_of(spec.after)
            return await ended.mark(spec, self._session(spec, on_done))

        return list(await asyncio.gather(*(at_arrival(spec) for spec in sessions)))

    async def _closed_loop(
        self,
        sessions: Sequence[SessionSpec],
        concurrency: int,
        on_done: Callable[[SessionOutcome], None] | None,
    ) -> list[SessionOutcome]:
        slots = asyncio.Semaphore(concurrency)
        ended = _Ended(sessions)

        async def in_turn(spec: SessionSpec) -> SessionOutcome:
            # A session holds its place while it waits for the ones before it in the
            # list it depends on (which have their places already), as the simulator's
            # closed loop does.
            async with slots:
                await ended.all_of(spec.after)
                return await ended.mark(spec, self._session(spec, on_done))

        # Tasks are created in list order and the semaphore wakes waiters in order.
        return list(await asyncio.gather(*(in_turn(spec) for spec in sessions)))

    async def _session(
        self, spec: SessionSpec, on_done: Callable[[SessionOutcome], None] | None
    ) -> SessionOutcome:
        outcome = SessionOutcome(spec.session_id, arrival_ns=time.monotonic_ns())
        try:
            await self._agent(spec)
        except self.FAILURES as error:
            outcome.error = f"{spec.session_id}: {type(error).__name__}: {error}"
        outcome.end_ns = time.monotonic_ns()
        if on_done is not None:
            on_done(outcome)
        return outcome

    async def _agent(self, spec: SessionSpec) -> None:
        raise NotImplementedError


class _Ended:
    """Which sessions of a replay have ended, for those that wait for others
    (``SessionSpec.after``); a session that failed counts as ended, so the ones
    waiting for it still run."""

    def __init__(self, sessions: Sequence[SessionSpec]) -> None:
        self._events = {spec.session_id: asyncio.Event() for spec in sessions}

    async def all_of(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            await self._events[session_id].wait()

    async def mark(self, spec: SessionSpec, running: Awaitable[SessionOutcome]) -> SessionOutcome:
        try:
            return await running
        finally:
            self._events[spec.session_id].set()


class ReplayAgents(WorkloadReplay):
    """Runs a workload's sessions against ``gateway`` (its ``/v1`` base is
    ``gateway + "/v1"``), tools in ``pool``."""

    FAILURES = (*WorkloadReplay.FAILURES, openai.OpenAIError)

    def __init__(
        self,
        gateway: str,
        pool: SandboxPool,
        gateway_sink: HttpSink,
        events: MemorySink,
        options: ReplayOptions,
    ) -> None:
        super().__init__(pool, events, options)
        self._gateway_sink = gateway_sink
        self._emitter = Emitter([events, _SessionEndsTo(gateway_sink)])
        self._client = instrument_openai(
            openai.AsyncOpenAI(
                base_url=gateway.rstrip("/") + "/v1",
                api_key="agentmars-replay",
                timeout=CALL_TIMEOUT_S,
                max_retries=0,
            )
        )

    async def close(self) -> None:
        await self._client.close()

    async def _agent(self, spec: SessionSpec) -> None:
        appends = prompt_ids(spec, self._options.seed)
        async with sdk.session(
            spec.session_id, agent=spec.agent, task_id=spec.task_id, emitter=self._emitter
        ) as session:
            context: list[int] = []
            for index, turn in enumerate(spec.turns):
                prompt = [*context, *appends[index]]
                hints = sdk.hints(
                    next_tool=turn.tool.kind if turn.tool is not None else None,
                    expected_tool_s=turn.tool.wall_s if turn.tool is not None else None,
                )
                with hints:
                    output = await self._call(prompt, turn.output_tokens)
                context = [*prompt, *output]
                if turn.tool is not None:
                    await self._tool(session, spec, index)

    async def _call(self, prompt: list[int], output_tokens: int) -> list[int]:
        """The output token ids of one streamed completion."""
        stream = await self._client.completions.create(
            model=self._options.model,
            prompt=prompt,
            max_tokens=output_tokens,
            stream=True,
            # The usage chunk gives the call's events their token counts.
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        output: list[int] = []
        async for chunk in stream:
            for choice in chunk.choices:
                output += _token_ids(choice)
        if len(output) != output_tokens:
            raise ReplayError(f"the engine returned {len(output)} of {output_tokens} tokens")
        return output

    async def _tool(self, session: sdk.Session, spec: SessionSpec, turn: int) -> None:
        tool = spec.turns[turn].tool
        assert tool is not None
        result = await self._pool.run(
            spec.session_id,
            tool_exec(tool, turn),
            tool=tool.kind,
            priority=session.tool_priority or 0,
            call_id=f"{spec.session_id}-tool{turn}",
            turn=turn,
        )
        if result.status != "ok" or result.exit_status != 0:
            detail = result.detail or result.stderr.strip()[-300:]
            raise ReplayError(f"tool {tool.kind} after turn {turn}: {result.status} ({detail})")
        # The pool's events reach the gateway before the next call does, as an agent's
        # tool result reaches its next prompt.
        await asyncio.to_thread(self._gateway_sink.flush)
        session.note_tool_result()


def _token_ids(choice: Any) -> list[int]:
    """The ``token_ids`` vLLM (and the twin) add to a completion choice when asked
    (``return_token_ids``); the OpenAI client keeps unknown fields."""
    ids = getattr(choice, "token_ids", None)
    return [int(token) for token in ids] if ids else []
