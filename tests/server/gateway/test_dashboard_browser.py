"""The dashboard in a real headless chromium (Debian's, through Playwright), on a gateway
started as a user starts it (``agentmars serve --engine sim``): it asks for the token
and refuses a wrong one, takes it from the URL's fragment without sending it anywhere
but in a header, follows a replay of agents (the SDK, the sandbox pool running their
tools) without reloading, and once the gateway is quiet shows what ``/metrics`` says.

Skipped only where ``/usr/bin/chromium`` is missing; CI installs it
(scripts/apt-packages.txt)."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from prometheus_client.parser import text_string_to_metric_families

from agentmars.runtime.replay.agent import ReplayAgents, ReplayOptions, ReplayRun
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.sinks import MemorySink
from agentmars.sdk.sinks.http import HttpSink
from agentmars.server.gateway.operator_state import RECENT
from agentmars.server.workloads.model import Workload
from agentmars.server.workloads.registry import build_workload
from agentmars.server.workloads.reshape import first_turns, fit_context, scale_tools
from tests.cli.serving import Twin, served_twin
from tests.server.gateway.browser import CHROMIUM, MISSING, chromium, shown

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=MISSING)

UPDATE_TIMEOUT_MS = 5000
"""A snapshot is due every second; this long without one is a failure."""


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    with served_twin() as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh tab (its own storage); the script's errors and any refused by the page's
    Content-Security-Policy fail the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # A refused token's 401 is logged as a failed load: expected, not an error of the page.
    page.on(
        "console",
        lambda message: (
            errors.append(message.text)
            if message.type == "error" and "Failed to load resource" not in message.text
            else None
        ),
    )
    yield page
    context.close()
    assert errors == []


def _status(page: Page) -> str:
    return str(page.locator("#status").get_attribute("data-state"))


def test_the_page_asks_for_the_token_and_refuses_a_wrong_one(page: Page, twin: Twin) -> None:
    page.goto(twin.base + "/dashboard")
    expect(page.locator("#token")).to_be_visible()
    expect(page.locator("#status")).to_have_attribute("data-state", "refused")
    page.fill("#token-input", "wrong")
    page.click("#token-form button")
    expect(page.locator("#token-reason")).to_contain_text("refused this token")
    page.fill("#token-input", twin.token)
    page.click("#token-form button")
    expect(page.locator("#status")).to_have_attribute("data-state", "live")
    expect(page.locator("#token")).to_be_hidden()
    expect(page.locator('[data-field="policy"]')).to_have_text("mars")


def test_the_token_goes_from_the_fragment_into_a_header_only(page: Page, twin: Twin) -> None:
    requests: list[tuple[str, str | None]] = []
    page.on("request", lambda r: requests.append((r.url, r.headers.get("authorization"))))
    page.goto(f"{twin.base}/dashboard#token={twin.token}")
    expect(page.locator("#status")).to_have_attribute("data-state", "live")
    assert twin.token not in page.url  # out of the address bar (and the history)
    model = httpx.get(twin.base + "/v1/models", timeout=5).json()["data"][0]["id"]
    expect(page.locator('[data-field="model_name"]')).to_have_text(model)
    assert all(twin.token not in url for url, _ in requests)
    feeds = [auth for url, auth in requests if url.endswith("/dashboard/snapshots")]
    assert feeds == [f"Bearer {twin.token}"]


# --- following a replay ---------------------------------------------------------------


def _workload() -> Workload:
    """Six sessions of up to four calls, a tool after most, arriving over a few
    seconds: a run of about twenty seconds on the twin."""
    workload = build_workload("ilr-1", sessions=6, seed=3, rate=1.0)
    return scale_tools(fit_context(first_turns(workload, 4), 2048), 0.5)


async def _replay(twin: Twin, workload: Workload, root: Path) -> ReplayRun:
    """The replay agents against the gateway, their tools in a sandbox pool whose
    events go to the gateway (as ``agentmars bench replay`` runs them)."""
    model = httpx.get(twin.base + "/v1/models", timeout=5).json()["data"][0]["id"]
    sink = HttpSink(twin.base + "/v1/events", token=twin.token, flush_interval_s=0.005)
    try:
        config = SandboxConfig(workspace_root=root / "workspaces")
        async with SandboxPool(config, emitter=Emitter([sink])) as pool:
            agents = ReplayAgents(twin.base, pool, sink, MemorySink(), ReplayOptions(model))
            try:
                return await agents.run(workload)
            finally:
                await agents.close()
    finally:
        sink.close()


class Replay:
    """A replay on a thread of its own (the browser is driven from this one)."""

    def __init__(self, twin: Twin, workload: Workload, root: Path) -> None:
        self.run: ReplayRun | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(twin, workload, root))
        self._thread.start()

    def _main(self, twin: Twin, workload: Workload, root: Path) -> None:
        try:
            self.run = asyncio.run(_replay(twin, workload, root))
        except BaseException as error:
            self.error = error

    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self) -> ReplayRun:
        self._thread.join(120)
        assert not self.running(), "the replay did not end"
        if self.error is not None:
            raise self.error
        assert self.run is not None and self.run.failed == [], self.run
        return self.run


def _next_update(page: Page) -> dict[str, str]:
    """What the page shows once it has drawn one more snapshot."""
    before = page.locator("#status-text").text_content()
    page.wait_for_function(
        "before => document.getElementById('status-text').textContent !== before",
        arg=before,
        timeout=UPDATE_TIMEOUT_MS,
    )
    return shown(page)


def _drawn_above_the_axis(page: Page, chart: str, colour: str) -> bool:
    """Whether the chart has a pixel of ``colour`` (a CSS variable) in its upper 80%,
    above the zero line every series starts on."""
    return bool(
        page.evaluate(
            """([chart, colour]) => {
                const canvas = document.querySelector(`[data-chart="${chart}"]`);
                const wanted = getComputedStyle(document.documentElement)
                    .getPropertyValue(`--${colour}`).trim().match(/\\w\\w/g)
                    .map((hex) => parseInt(hex, 16));
                const rows = Math.floor(canvas.height * 0.8);
                const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, rows).data;
                for (let i = 0; i < pixels.length; i += 4) {
                    if (pixels[i] === wanted[0] && pixels[i + 1] === wanted[1]
                        && pixels[i + 2] === wanted[2]) return true;
                }
                return false;
            }""",
            [chart, colour],
        )
    )


# --- what /metrics says --------------------------------------------------------------

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(twin: Twin) -> Samples:
    """The gateway's own samples (``agentmars_*``), by name and labels."""
    text = httpx.get(twin.base + "/metrics", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("agentmars_")
    }


def _value(samples: Samples, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The one sample of ``name`` whose labels include ``labels`` (None if none)."""
    found = [
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and (labels or {}).items() <= dict(sample_labels).items()
    ]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def _as_shown(value: float | None) -> str:
    return "–" if value is None else str(int(value))


BY_LABEL = {
    "sessions": ("agentmars_sessions", "state", ("waiting", "engine", "tool", "idle")),
    "kv_blocks": ("agentmars_kv_blocks", "state", ("free", "used", "pinned")),
    "tool_calls": ("agentmars_tool_calls", "state", ("queued", "running")),
    "tool_cores": ("agentmars_tool_cores", "state", ("busy", "idle")),
    "llm_calls": ("agentmars_llm_calls_total", "status", ("ok", "error", "cancelled")),
}
GAUGES: dict[str, tuple[str, dict[str, str]]] = {
    "admission_queue": ("agentmars_admission_queue_sessions", {}),
    "kv_pinned_sessions": ("agentmars_kv_pinned_sessions", {}),
    **{
        f"{field}.{value}": (series, {label: value})
        for field, (series, label, values) in BY_LABEL.items()
        for value in values
    },
}
"""The page's integer fields and the series of ``/metrics`` that say the same."""
HISTOGRAMS = {
    "ttft_s": "agentmars_llm_time_to_first_token_seconds",
    "llm_call_s": "agentmars_llm_request_duration_seconds",
    "session_s": "agentmars_session_duration_seconds",
    "admission_wait_s": "agentmars_admission_wait_seconds",
}
"""The page's percentiles and the histograms they are the percentiles of."""


def _expected(samples: Samples) -> dict[str, str]:
    """The integer fields as ``/metrics`` says they are."""
    expected = {field: _as_shown(_value(samples, *series)) for field, series in GAUGES.items()}
    window = _value(samples, "agentmars_admission_window_sessions")
    expected["window"] = "none" if window is None else str(int(window))
    for field, histogram in HISTOGRAMS.items():
        expected[f"{field}.count"] = _as_shown(_value(samples, histogram + "_count"))
    return expected


def _quiet(twin: Twin) -> Samples:
    """``/metrics`` once two scrapes a second apart agree (nothing moves any more)."""
    deadline = time.monotonic() + 30
    before = _scrape(twin)
    while True:
        time.sleep(1.0)  # the quiet being checked for: a second without change
        now = _scrape(twin)
        if now == before:
            return now
        assert time.monotonic() < deadline, "the gateway did not become quiet"
        before = now


def _seconds(text: str) -> float:
    number, unit = text.split()
    return float(number) / {"µs": 1e6, "ms": 1e3, "s": 1.0}[unit]


def _bucket_bounds(samples: Samples, histogram: str, rank: int) -> tuple[float, float]:
    """The bounds of the bucket of ``histogram`` the ``rank``-th smallest observation
    (from 0) fell in."""
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for (name, labels), value in samples.items()
        if name == histogram + "_bucket"
    )
    lower = 0.0
    for upper, cumulative in buckets:
        if cumulative > rank:
            return lower, upper
        lower = upper
    raise AssertionError(f"{histogram} has no bucket for observation {rank}")


def _check_percentiles(page: Page, samples: Samples) -> None:
    """Each percentile the page shows lies where the histogram of ``/metrics`` puts it:
    between the buckets of the two observations it interpolates, and as the figure shown
    rounds it."""
    for field, histogram in HISTOGRAMS.items():
        count = int(_value(samples, histogram + "_count") or 0)
        assert count <= RECENT  # the percentiles are of every observation
        for q in (50, 90, 99):
            node = page.locator(f'[data-field="{field}.p{q}"]')
            if count == 0:
                expect(node).to_have_text("–")
                continue
            exact = float(str(node.get_attribute("title")).split()[0])
            assert math.isclose(_seconds(str(node.text_content())), exact, rel_tol=5e-3)
            position = (count - 1) * q / 100
            low, _ = _bucket_bounds(samples, histogram, math.floor(position))
            _, high = _bucket_bounds(samples, histogram, math.ceil(position))
            assert low <= exact <= high, (field, q, exact, low, high)


def _calls_counted(fields: dict[str, str]) -> int:
    return sum(int(fields[f"llm_calls.{status}"]) for status in BY_LABEL["llm_calls"][2])


def test_the_page_follows_a_replay_and_then_shows_what_metrics_says(
    page: Page, twin: Twin, tmp_path: Path
) -> None:
    page.goto(f"{twin.base}/dashboard#token={twin.token}")
    expect(page.locator("#status")).to_have_attribute("data-state", "live")
    page.evaluate("window.notReloaded = true")  # a reload would lose it
    calls_before = _calls_counted(shown(page))
    workload = _workload()
    replay = Replay(twin, workload, tmp_path)
    during: list[dict[str, str]] = []
    while replay.running():
        during.append(_next_update(page))
    replay.result()

    # It followed the run: the calls rising, sessions in the engine and at their tools.
    ok = [int(fields["llm_calls.ok"]) for fields in during]
    assert ok == sorted(ok) and len(set(ok)) >= 3, ok
    assert max(int(fields["sessions.engine"]) for fields in during) >= 1
    assert max(int(fields["tool_calls.running"]) for fields in during) >= 1
    assert _drawn_above_the_axis(page, "sessions", "engine")
    assert _drawn_above_the_axis(page, "tools", "busy")
    assert _drawn_above_the_axis(page, "tools", "ended")  # the calls ended each second
    assert page.evaluate("window.notReloaded") is True

    # Quiet after it: the page and /metrics say the same, the calls are the run's.
    samples = _quiet(twin)
    expected = _expected(samples)
    calls = sum(len(session.turns) for session in workload.sessions)
    # Each of the run's calls counted once. By its outcome: the OpenAI client closes a
    # stream at its [DONE] without reading the response's end, and a gateway that sees
    # the close before its relay has ended counts the call cancelled (reported).
    assert _calls_counted(expected) == calls_before + calls and expected["llm_calls.error"] == "0"
    assert expected["session_s.count"] != "0" and expected["ttft_s.count"] != "0"
    deadline = time.monotonic() + 5
    fields = shown(page)
    while differ := {k: (fields[k], v) for k, v in expected.items() if fields[k] != v}:
        assert time.monotonic() < deadline, f"shown vs /metrics: {differ}"
        fields = _next_update(page)
    _check_percentiles(page, samples)
    assert re.fullmatch(r"\d+", fields["kv_blocks.free"]), "the twin reports its KV blocks"
