"""The operator's view of one gateway: one fold of the event stream and of the
admission's own state, which ``/metrics`` (``metrics.py``) and the dashboard both read,
so that the two never disagree.

What is open now is read when asked: sessions by state from the admission (``waiting``
for admission; admitted with an LLM call in flight at the gateway: ``engine``; else
with a tool call queued or running: ``tool``; else ``idle``), tool calls from the tool
events, KV blocks and pins from the view's newest KV figures, the admission window from
the newest ``window_update`` (None while no such event came: a policy without a window
admits everything, and a missing figure says so better than a sentinel).

Latencies are folded as they come, each into a Prometheus histogram: the admission wait
of each session let in (the admission tells, ``Admission.on_admit``), and from the
events, the first-token time and duration of each LLM call as the gateway measured it
(its own events only: one of each per call, whatever the SDK also reports), each
session from its ``session_start`` (else its arrival at the gateway) to its
``session_end``, and each tool call's queue wait and duration (each boundary once,
``EventFeed``: the sandbox and the SDK may both report one). Every method runs on the
gateway's event loop.
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import get_args

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel, ConfigDict

from agentmars.sdk.events import AnyEvent, LLMEnd, LLMFirstToken
from agentmars.sdk.tool_stats import ToolKinds
from agentmars.server.gateway.admission import Admission, WaitingSession
from agentmars.server.gateway.events import CallStatus
from agentmars.server.policies.feed import EventFeed
from agentmars.server.web.prometheus import REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS

WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
"""Admission and tool queue waits (ours: none under no pressure, up to the hour an
agent may wait behind a full window or a busy sandbox)."""
TOOL_BUCKETS: tuple[float, ...] = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
)  # fmt: skip
"""Tool durations (ours: a ``ls`` to the longest test suite the sandbox lets run)."""
SESSION_BUCKETS: tuple[float, ...] = (
    1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0,
    14400.0, 28800.0,
)  # fmt: skip
"""Whole sessions (ours: a one-call session to a day's agent task)."""
RECENT = 1024
"""Observations the percentiles are taken over, the most recent (ours: a few minutes of
a busy gateway, so the dashboard follows a change of load)."""
MAX_STARTED = 65_536
"""Sessions whose start is remembered until their end (ours: above the admission's
waiting, admitted and known sessions together); past it, the oldest is forgotten and
its end not measured."""


class Percentiles(BaseModel):
    """Percentiles of the ``RECENT`` most recent observations (None before the first);
    ``count``: all observations, the histogram's ``_count``."""

    model_config = ConfigDict(frozen=True)

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    count: int = 0


class OperatorSnapshot(BaseModel):
    """The gateway now, JSON-able: the dashboard's feed, and the gauges of ``/metrics``."""

    model_config = ConfigDict(frozen=True)

    policy: str
    model_name: str
    wall_s: float
    """``time.time()`` when taken."""
    window: int | None
    """The admission window; None: the policy has sent none (it has no window)."""
    admission_queue: int
    """Sessions waiting for admission."""
    sessions: dict[str, int]
    """Open sessions by state: waiting, engine, tool, idle."""
    kv_blocks: dict[str, int]
    """Engine KV blocks: free, used (pins excluded), pinned, which add up to the pool;
    empty while the engine has sent no figures."""
    kv_pinned_sessions: int
    kv_pins_released: dict[str, int]
    """KV pins released so far, by reason (the vLLM plugin's figures only)."""
    tool_calls: dict[str, int]
    """Tool calls: queued, running."""
    tool_calls_ended: int
    """Tool calls ended since the gateway started: the dashboard draws how many end a
    second, where a call shorter than the snapshots' second shows (it may never be
    running when a snapshot is taken)."""
    tool_cores: dict[str, int]
    """Cores for tools: busy (one a running call, as the policies' view counts them, at
    most all), idle."""
    ttft_s: Percentiles
    """Streamed calls only (a call answered whole has no first token to time)."""
    llm_call_s: Percentiles
    """Every call, streamed or not, from its admission to its end (OpenHands does not
    stream: its calls are only here)."""
    session_s: Percentiles
    admission_wait_s: Percentiles
    llm_calls: dict[str, int]
    """LLM calls the gateway forwarded, by outcome."""


def _sample_values(
    metric: Counter | Histogram, suffix: str
) -> Iterator[tuple[dict[str, str], float]]:
    """The labels and value of each of ``metric``'s samples whose name ends in ``suffix``."""
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                yield sample.labels, sample.value


class Distribution:
    """One latency: every observation in its histogram, the most recent kept for the
    percentiles."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self.recent: deque[float] = deque(maxlen=RECENT)

    def observe(self, seconds: float) -> None:
        self.histogram.observe(seconds)
        self.recent.append(seconds)

    def percentiles(self) -> Percentiles:
        if not self.recent:
            return Percentiles()
        data = list(self.recent)
        # Python < 3.13 wants two points; one point is each of its own percentiles.
        cuts = statistics.quantiles(data, n=100, method="inclusive") if len(data) > 1 else data * 99
        p50, p90, p99 = cuts[49], cuts[89], cuts[98]
        ((_, count),) = _sample_values(self.histogram, "_count")
        return Percentiles(p50=p50, p90=p90, p99=p99, count=int(count))


class OperatorState:
    """The fold; ``observe`` every event the gateway's hub publishes. It subscribes to
    the admission's ``on_admit`` itself."""

    def __init__(self, admission: Admission, model_name: str) -> None:
        self.admission = admission
        self.policy = admission.policy_name
        self.model_name = model_name
        """The served model (the ``model_name`` label); the gateway may learn it after."""
        self.window: int | None = None
        self.feed = EventFeed(self._fold)
        self._tools = ToolKinds()
        self.tool_calls_ended = 0
        self._started: OrderedDict[str, float] = OrderedDict()
        """Sessions' start, monotonic seconds."""
        self.admission_wait = Distribution(
            Histogram(
                "agentmars_admission_wait_seconds",
                "Wait of a session from its first call's arrival to its admission",
                buckets=WAIT_BUCKETS,
                registry=None,
            )
        )
        self.ttft = Distribution(
            Histogram(
                "agentmars_llm_time_to_first_token_seconds",
                "Time to the first token of a streamed LLM call, at the gateway",
                buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
                registry=None,
            )
        )
        self.llm_duration = Distribution(
            Histogram(
                "agentmars_llm_request_duration_seconds",
                "LLM call end to end (after admission), at the gateway",
                buckets=REQUEST_LATENCY_BUCKETS,
                registry=None,
            )
        )
        self.session_duration = Distribution(
            Histogram(
                "agentmars_session_duration_seconds",
                "Agent session from its start (or arrival) to its end",
                buckets=SESSION_BUCKETS,
                registry=None,
            )
        )
        self.tool_queue_wait = Histogram(
            "agentmars_tool_queue_wait_seconds",
            "Tool call from enqueue to start",
            ["tool"],
            buckets=WAIT_BUCKETS,
            registry=None,
        )
        self.tool_duration = Histogram(
            "agentmars_tool_duration_seconds",
            "Tool call from start to end",
            ["tool"],
            buckets=TOOL_BUCKETS,
            registry=None,
        )
        self.llm_calls = Counter(
            "agentmars_llm_calls", "LLM calls the gateway forwarded, by outcome", ["status"],
            registry=None,
        )  # fmt: skip
        for status in get_args(CallStatus):
            self.llm_calls.labels(status)  # every outcome shown, 0 until it happens
        admission.on_admit = self._admitted

    def metrics(self) -> Iterator[Metric]:
        """The histograms and counters, without the ``policy`` and ``model_name``
        labels (``metrics.py`` adds them)."""
        distributions = (self.admission_wait, self.ttft, self.llm_duration, self.session_duration)
        for metric in (
            *(distribution.histogram for distribution in distributions),
            self.tool_queue_wait,
            self.tool_duration,
            self.llm_calls,
        ):
            yield from metric.collect()

    # --- folding -------------------------------------------------------------------------

    def observe(self, event: AnyEvent) -> None:
        """Fold one event of the stream."""
        if isinstance(event, LLMFirstToken | LLMEnd):
            if event.source == "gateway":
                self._llm(event)
        elif event.kind == "window_update":
            self.window = event.window
        else:
            self.feed(event)

    def _llm(self, event: LLMFirstToken | LLMEnd) -> None:
        if isinstance(event, LLMFirstToken):
            self.ttft.observe(event.ttft_s)
            return
        self.llm_duration.observe(event.duration_s)
        self.llm_calls.labels(event.status).inc()

    def _fold(self, event: AnyEvent) -> None:
        if event.kind == "session_start":
            self._start(event.session_id, event.mono_ns / 1e9)
        elif event.kind == "session_end":
            start = self._started.pop(event.session_id, None)
            if start is None:
                return
            # The gateway ends a session at its idle expiry, long after its last
            # activity: its own end says how long the session lasted.
            lasted = event.mono_ns / 1e9 - start if event.source != "gateway" else event.duration_s
            self.session_duration.observe(max(lasted, 0.0))
        elif event.kind == "tool_start":
            self.tool_queue_wait.labels(self._tools.kind(event.tool)).observe(event.queue_wait_s)
        elif event.kind == "tool_end":
            self.tool_duration.labels(self._tools.kind(event.tool)).observe(event.duration_s)
            self.tool_calls_ended += 1

    def _admitted(self, session: WaitingSession) -> None:
        # The admission's clock is the view's, monotonic seconds as the events' mono_ns.
        self.admission_wait.observe(max(self.admission.view.now - session.called_s, 0.0))
        if session.session_id not in self._started:
            self._start(session.session_id, session.arrival_s)

    def _start(self, session_id: str, start_s: float) -> None:
        self._started.pop(session_id, None)
        self._started[session_id] = start_s
        if len(self._started) > MAX_STARTED:
            self._started.popitem(last=False)

    # --- reading -------------------------------------------------------------------------

    def sessions(self) -> dict[str, int]:
        """Open sessions by state (O(admitted sessions))."""
        admission = self.admission
        engine = tool = 0
        for session_id, session in admission.admitted.items():
            if session.in_flight:
                engine += 1
            elif admission.view.runs_tools(session_id):
                tool += 1
        idle = len(admission.admitted) - engine - tool
        return {"waiting": len(admission.waiting), "engine": engine, "tool": tool, "idle": idle}

    def snapshot(self) -> OperatorSnapshot:
        view = self.admission.view
        kv = view.kv
        kv_blocks = {}
        if kv is not None:
            pinned = kv.pinned_blocks
            used = kv.total_blocks - kv.free_blocks - pinned
            kv_blocks = {"free": kv.free_blocks, "used": used, "pinned": pinned}
        cores = view.tool_cores
        busy = min(view.active_tools, cores)
        return OperatorSnapshot(
            policy=self.policy,
            model_name=self.model_name,
            wall_s=time.time(),
            window=self.window,
            admission_queue=len(self.admission.waiting),
            sessions=self.sessions(),
            kv_blocks=kv_blocks,
            kv_pinned_sessions=kv.pins if kv is not None else 0,
            kv_pins_released=dict(kv.released) if kv is not None else {},
            tool_calls={"queued": view.queued_tools, "running": view.active_tools},
            tool_cores={"busy": busy, "idle": cores - busy},
            tool_calls_ended=self.tool_calls_ended,
            ttft_s=self.ttft.percentiles(),
            llm_call_s=self.llm_duration.percentiles(),
            session_s=self.session_duration.percentiles(),
            admission_wait_s=self.admission_wait.percentiles(),
            llm_calls={
                labels["status"]: int(value)
                for labels, value in _sample_values(self.llm_calls, "_total")
            },
        )
