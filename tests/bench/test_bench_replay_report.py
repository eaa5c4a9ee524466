"""The demo's report from a real replay on the twin (MARS then FCFS, three short
sessions each, their tools in the sandbox pool; the simulator's prediction beside each):
its headline is the measured runs' latencies and the prediction's error, a measured
run's tool core utilisation is what the sandbox pool measured, and the page renders in
a headless chromium with no console error, the headline and every figure shown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentmars.bench.replay import ReplayOutput, ReplayPlan, engine_shape, publish_output, run_all
from agentmars.bench.session_mix import SandboxShape
from agentmars.server.metrics.results import prediction_error
from tests.server.gateway.browser import CHROMIUM, MISSING, chromium

pytestmark = pytest.mark.slow

PLAN = ReplayPlan(sessions=3, rate=4, max_turns=2, tool_scale=0.1, policies=("mars", "fcfs"))


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReplayOutput, Path]:
    out = tmp_path_factory.mktemp("replay")
    engine = engine_shape(
        (None, None), num_blocks=48, max_context=PLAN.max_context, cores="0",
        agent_cores="1", log_dir=out / "logs", profile="cpu-tiny",
    )  # fmt: skip
    output = run_all(PLAN, engine, SandboxShape(tool_slots=4))
    assert [run.policy for run in output.runs] == ["mars", "fcfs"], output.failed_runs
    index = publish_output(output, out)
    assert index == out / "index.html"
    return output, index


def _cells(html: str, *first: str) -> list[str]:
    """The cells of the table row whose first cells are ``first``."""
    lead = "".join(f'<td class="text">{re.escape(cell)}</td>' for cell in first)
    row = re.search(rf"<tr>{lead}.*?</tr>", html)
    assert row is not None, first
    return re.findall(r"<td[^>]*>(.*?)</td>", row[0])


def test_the_headline_is_the_measured_latencies_and_the_predictions_error(
    replayed: tuple[ReplayOutput, Path],
) -> None:
    output, index = replayed
    html = index.read_text()
    headline = html[html.index('<section id="headline">') : html.index("</section>")]
    latencies = {summary.policy: summary.latency_s for summary in output.summaries()}
    errors = output.prediction_errors()
    assert set(errors) == {"mars", "fcfs"}
    for policy, error in errors.items():
        measured, predicted = latencies[policy], latencies[f"{policy} (sim)"]
        assert measured is not None and predicted is not None
        assert _cells(headline, policy) == [
            policy, "3/3", f"{measured.mean:.2f}", f"{measured.p95:.2f}",
            f"{predicted.mean:.2f}", f"{error:+.0%}",
            f"{predicted.p95:.2f}", f"{prediction_error(predicted.p95, measured.p95):+.0%}",
        ]  # fmt: skip
    assert re.search(r"<strong>mars</strong>: [\d.]+x (lower|higher) mean latency than fcfs", html)


def test_a_measured_runs_core_utilisation_is_its_tools_cpu_time(
    replayed: tuple[ReplayOutput, Path],
) -> None:
    output, index = replayed
    html = index.read_text()
    header = re.search(r"<tr><th>workload</th>.*?</tr>", html)
    assert header is not None
    column = re.findall(r"<th>(.*?)</th>", header[0]).index("core<br>util.")
    summaries = {summary.policy: summary for summary in output.summaries()}
    for run in output.runs:
        busy_s = run.record.tool_busy_core_s
        # The sandbox pool measured every tool's CPU time: a real figure, not 0.
        assert busy_s is not None and busy_s > 0
        utilisation = summaries[run.policy].cpu.core_utilisation
        assert utilisation is not None and 0 < utilisation <= 1
        assert _cells(html, "ilr-1", run.policy)[column] == f"{utilisation:.0%}"


def test_a_measured_sessions_admission_is_the_gateways(
    replayed: tuple[ReplayOutput, Path],
) -> None:
    output, _ = replayed
    for run in output.runs:
        for session in run.record.sessions:
            first = session.calls[0]
            # Stamped by the gateway as the call left admission: after the agent sent
            # it, before its first token (without the gateway's stream it would be the
            # agent's own submit).
            assert first.submit_s < session.admitted_s <= first.first_token_s, session


@pytest.mark.skipif(not CHROMIUM.exists(), reason=MISSING)
def test_the_page_renders_in_chromium_without_errors(replayed: tuple[ReplayOutput, Path]) -> None:
    _, index = replayed
    errors: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(index.as_uri())
        page.wait_for_load_state("load")
        lead = page.locator("#headline .lead").first
        assert lead.is_visible() and "mean latency than fcfs" in lead.inner_text()
        assert page.locator("#headline table").is_visible()
        shown = page.evaluate(
            """() => [...document.images].map((image) => [
                image.getAttribute("src"), image.complete && image.naturalWidth > 0])"""
        )
    names = [name for name, _ in shown]
    assert names[:2] == ["latency_cdf.png", "timeline.png"]
    assert all(loaded for _, loaded in shown), shown
    assert errors == []
