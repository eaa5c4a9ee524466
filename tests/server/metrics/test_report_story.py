"""The report tells its story at a glance: drawn from real simulator runs (MARS and FCFS
on a few of seed 000's ILR-1 sessions, a fraction of a second each), it opens with the
headline, shows the sessions' latency CDF and a timeline of a few of them, leaves out
the figures no run has data for, and ends with the details."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentmars.server.metrics import report
from agentmars.server.metrics.records import RunRecord
from agentmars.server.metrics.report import TIMELINE_SESSIONS, write_report
from agentmars.server.metrics.results import RunResult
from agentmars.server.metrics.summary import summarize
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.sim.engine import SimConfig, SimEngine
from agentmars.server.workloads.registry import build_workload
from agentmars.server.workloads.reshape import first_turns, fit_context

RATE = 0.5
POLICIES = ("mars", "fcfs")


def _simulated(policy: str) -> RunRecord:
    """The demo's shape in miniature: 10 ILR-1 sessions of at most 4 calls on the
    ``cpu-tiny`` profile's 48 KV blocks."""
    workload = build_workload("ilr-1", sessions=10, seed=1, rate=RATE)
    workload = fit_context(first_turns(workload, 4), 4096)
    config = SimConfig(tool_cores=1, tool_slots=4, num_gpu_blocks=48)
    return SimEngine(workload, make_policy(policy), load_profile("cpu-tiny"), config).run()


@pytest.fixture(scope="module")
def records() -> list[RunRecord]:
    return [_simulated(policy) for policy in POLICIES]


@pytest.fixture(scope="module")
def page(records: list[RunRecord], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("report")
    results = [RunResult(rate=RATE, summary=summarize(record)) for record in records]
    write_report(results, out, config={"plan": {"sessions": 10, "policies": ["mars", "fcfs"]}},
                 records=records)  # fmt: skip
    return out, (out / "index.html").read_text()


def test_the_page_opens_with_mars_against_fcfs_as_the_records_have_them(
    records: list[RunRecord], page: tuple[Path, str]
) -> None:
    _, index = page
    headline = index[index.index('<section id="headline">') : index.index("</section>")]
    assert index.index("headline") < index.index("<img")
    mars, fcfs = (summarize(record).latency_s for record in records)
    assert mars is not None and fcfs is not None
    mean = sum(s.latency_s for s in records[0].sessions) / len(records[0].sessions)
    assert mars.mean == pytest.approx(mean)
    lead = re.search(r"<strong>mars</strong>: ([\d.]+)x (lower|higher) mean latency than fcfs "
                     r"\(([\d.]+) s against ([\d.]+) s\), ([\d.]+)x (lower|higher) P95 "
                     r"\(([\d.]+) s against ([\d.]+) s\)", headline)  # fmt: skip
    assert lead is not None, headline
    assert [float(lead[i]) for i in (3, 4, 7, 8)] == [
        round(mars.mean, 2), round(fcfs.mean, 2), round(mars.p95, 2), round(fcfs.p95, 2)
    ]  # fmt: skip
    lower = mars.mean < fcfs.mean
    assert lead[2] == ("lower" if lower else "higher")
    ratio = fcfs.mean / mars.mean if lower else mars.mean / fcfs.mean
    assert float(lead[1]) == round(ratio, 2)
    # No prediction among these runs: the table has no prediction columns.
    assert "<th>P95 latency s</th></tr>" in headline and "predicted" not in headline
    assert f'<td class="text">mars</td><td>10/10</td><td>{mars.mean:.2f}</td>' in headline


def test_the_cdf_and_the_timeline_follow_the_headline(page: tuple[Path, str]) -> None:
    out, index = page
    images = re.findall(r'<img src="([^"]+)"', index)
    assert images[:2] == ["latency_cdf.png", "timeline.png"]
    assert all((out / name).read_bytes().startswith(b"\x89PNG") for name in images)
    # The details come last, the configuration as settings, not JSON.
    assert index.index("<h2>Details</h2>") > index.index("timeline.png")
    assert '<td class="text">plan.policies</td><td class="text">mars, fcfs</td>' in index
    assert "{" not in index[index.index("<h3>Configuration</h3>") :]


def test_one_rate_draws_no_load_curve_and_no_goodput_without_t_ideal(
    page: tuple[Path, str],
) -> None:
    out, index = page
    # One arrival rate: the headline says it, not a plot of single dots. Summarized
    # without T_ideal: no goodput, and no empty chart saying so.
    for absent in ("latency_vs_load.png", "jct_vs_load.png", "goodput-ilr-1.png"):
        assert absent not in index and not (out / absent).exists()
    assert "ttft_by_turn-ilr-1.png" in index and "evictions-ilr-1.png" in index


def test_the_simulators_core_utilisation_is_a_real_figure(page: tuple[Path, str]) -> None:
    _, index = page
    header = re.search(r"<tr><th>workload</th>.*</tr>", index)
    assert header is not None
    columns = re.findall(r"<th>(.*?)</th>", header[0])
    rows = re.findall(r'<tr><td class="text">ilr-1</td>.*</tr>', index)
    utilisations = [re.findall(r"<td[^>]*>(.*?)</td>", row)[columns.index("core<br>util.")]
                    for row in rows]  # fmt: skip
    assert len(utilisations) == 2 and all(re.fullmatch(r"[1-9]\d*%", u) for u in utilisations)


def test_the_timeline_shows_the_same_few_sessions_for_every_run(records: list[RunRecord]) -> None:
    shown = report._timeline_sessions(records)
    assert len(shown) == TIMELINE_SESSIONS == len(set(shown))
    arrivals = {s.session_id: s.arrival_s for s in records[0].sessions}
    assert [arrivals[s] for s in shown] == sorted(arrivals[s] for s in shown)
    _, axes = report._figure(1, 1)
    session = next(s for s in records[0].sessions if s.admitted_s > s.arrival_s)
    report._draw_session(axes[0, 0], 0, session)
    spans = {c.get_label(): c.get_paths() for c in axes[0, 0].collections}
    # MARS held this session before admitting it; each call and tool is a span.
    assert len(spans["admission wait"]) == 1
    assert len(spans["LLM: generating"]) == len(session.calls)
    assert len(spans["tool: running"]) == len(session.tools)
