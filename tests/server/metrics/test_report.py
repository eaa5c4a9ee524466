"""The terminal table and the report folder (PNG plots + index.html)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentmars.server.metrics import report
from agentmars.server.metrics.report import summary_table, write_report
from agentmars.server.metrics.results import RunResult
from agentmars.server.metrics.summary import RunSummary, summarize
from tests.server.metrics.records_factory import call, run, session

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COLOURS = {"fcfs": "C0", "mars": "C1"}


def _summary(
    policy: str, latency_s: float, *, workload: str = "ILR-1", evicted: int = 0, ideal: bool = True
) -> RunSummary:
    """One session arriving at 0 whose two calls take 1 s to first token; run alone it
    takes 2 s."""
    calls = [call(0, 0, 1.0, 3, 0.5), call(1, latency_s - 2, 1.0, 3, 0.5)]
    record = run(
        [session("a", 0, latency_s, calls=calls)],
        duration_s=latency_s,
        policy=policy,
        workload=workload,
        evictions=[(latency_s / 2, evicted)] if evicted else [],
    )
    alone_calls = [call(0, 0, 0.5, 3, 0.5), call(1, 1, 0.5, 3, 0.5)]
    alone = {"a": session("a", 0, 2.0, calls=alone_calls)}
    return summarize(record, alone if ideal else None)


def _sweep() -> list[RunResult]:
    return [
        RunResult(rate=0.1, summary=_summary("fcfs", 4.0, evicted=8)),
        RunResult(rate=0.2, summary=_summary("fcfs", 6.0, evicted=12)),
        RunResult(rate=0.1, summary=_summary("mars", 3.0)),
        RunResult(rate=0.2, summary=_summary("mars", 5.0)),
        RunResult(rate=0.3, summary=_summary("mars", 8.0, workload="w/2 <b>", ideal=False)),
        RunResult(rate=None, summary=_summary("fcfs", 8.0, workload="w/2 <b>", ideal=False)),
    ]


def test_write_report_draws_pngs_and_an_index_that_shows_them(tmp_path: Path) -> None:
    out = tmp_path / "report"
    written = write_report(_sweep(), out, config={"rates": [0.1, 0.2], "profile": "h100<x>"})
    names = [path.name for path in written]
    assert names == [
        "latency_vs_load.png",
        "ttft_by_turn-ILR-1.png",
        "evictions-ILR-1.png",
        "goodput-ILR-1.png",
        "ttft_by_turn-w_2_b.png",
        "index.html",
    ]
    for png in written[:-1]:
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > len(PNG_SIGNATURE)
    index = (out / "index.html").read_text()
    assert set(re.findall(r'<img src="([^"]+)"', index)) == set(names[:-1])
    assert "<h2>w/2 &lt;b&gt;</h2>" in index
    # w/2 <b> has no goodput (no T_ideal) and no evictions: those figures are left out
    assert '<td class="text">profile</td><td class="text">h100&lt;x&gt;</td>' in index
    assert '<td class="text">rates</td><td class="text">0.1, 0.2</td>' in index
    # the headline (at each point with finished runs: a header and its policies), the
    # configuration and the runs table: one row per run, with its rate and mean latency
    headline = (1 + 2) * 2 + (1 + 1) * 2
    assert index.count("<tr>") == headline + (1 + 2) + (1 + len(_sweep()))
    assert "<th>output<br>tok/s</th>" in index  # more columns than the terminal table
    assert (
        '<td class="text">ILR-1</td><td class="text">fcfs</td><td>0.2</td><td>1/1</td><td>6.00</td>'
        in index
    )


def test_write_report_needs_results(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one run result"):
        write_report([], tmp_path)


def _axes() -> Any:
    _, axes = report._figure(1, 1)
    return axes[0, 0]


def _notes(ax: Any) -> list[str]:
    return [text.get_text() for text in ax.texts]


def test_one_rate_is_drawn_as_points() -> None:
    ax = _axes()
    report._draw_latency_vs_load(ax, [RunResult(rate=0.1, summary=_summary("mars", 3.0))], COLOURS)
    mean, p95 = ax.get_lines()
    assert (list(mean.get_xdata()), list(mean.get_ydata()), mean.get_marker()) == (
        [0.1],
        [3.0],
        "o",
    )
    assert (list(p95.get_ydata()), p95.get_marker()) == ([3.0], "s")


def test_load_curves_need_two_open_loop_rates() -> None:
    # ILR-1 at 0.1 and 0.2/s is drawn; w/2 <b> (one rate, and closed loop) is not
    assert list(report._load_curves(_sweep(), report.LATENCY)) == ["ILR-1"]
    assert report._load_curves(_sweep()[:1], report.LATENCY) == {}


def test_no_evictions_leave_an_empty_plot_with_a_note() -> None:
    ax = _axes()
    report._draw_evictions(ax, [RunResult(summary=_summary("mars", 3.0))], COLOURS)
    assert ax.get_lines() == [] and _notes(ax) == ["no KV evictions"]


def test_eviction_curves_are_drawn_at_bin_centres() -> None:
    ax = _axes()
    runs = [
        RunResult(summary=_summary("fcfs", 4.0, evicted=8)),
        RunResult(summary=_summary("mars", 3.0)),
    ]
    report._draw_evictions(ax, runs, COLOURS)
    fcfs, mars = ax.get_lines()
    assert list(fcfs.get_xdata())[:2] == pytest.approx([0.025, 0.075])
    # 8 blocks at half-way (bin 10 of 20, 0.2 s wide) = 40 blocks/s; mars draws zeros
    assert list(fcfs.get_ydata()) == [0.0] * 10 + [40.0] + [0.0] * 9
    assert set(mars.get_ydata()) == {0.0}


def test_goodput_without_t_ideal_is_a_note() -> None:
    ax = _axes()
    report._draw_goodput(ax, [RunResult(summary=_summary("mars", 3.0, ideal=False))], COLOURS)
    assert ax.get_lines() == [] and _notes(ax) == ["no goodput:\nsummarized without T_ideal"]


def test_goodput_is_drawn_against_alpha() -> None:
    ax = _axes()
    # latency 3 s against T_ideal 2 s: slowdown 1.5, so on time from alpha 2 on, 1 / 3 s
    report._draw_goodput(ax, [RunResult(summary=_summary("mars", 3.0))], COLOURS)
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [1.0, 2.0, 3.0]
    assert list(line.get_ydata()) == pytest.approx([0.0, 1 / 3, 1 / 3])


def test_the_fair_ratios_are_drawn_as_a_cdf() -> None:
    ax = _axes()
    ratios = RunSummary.model_validate(
        _summary("mars", 3.0).to_dict()
        | {"fairness": {"by_agent": {}, "mean": 1, "max": 2, "at_most_1": 0.5, "ratios": [0.5, 2]}}
    )
    report._draw_fairness(ax, [RunResult(summary=ratios)], COLOURS)
    (line,) = [line for line in ax.get_lines() if line.get_label() == "mars"]
    assert list(line.get_xdata()) == [0.5, 2.0]
    assert list(line.get_ydata()) == [0.5, 1.0]
    empty = _axes()
    report._draw_fairness(empty, [RunResult(summary=_summary("mars", 3.0))], COLOURS)
    assert _notes(empty) == ["no VTC run to compare with"]


def test_summary_table_has_a_row_per_run_and_the_key_metrics() -> None:
    summaries = [_summary("fcfs", 4.0, evicted=8), _summary("mars", 3.0, ideal=False)]
    table = summary_table(summaries)
    headers = [str(column.header).replace("\n", " ") for column in table.columns]
    # no prefix lookups and no VTC reference in either run: those columns are left out
    assert headers == [
        "workload",
        "policy",
        "done",
        "latency mean s",
        "latency P95 s",
        "slowdown mean",
        "goodput a=1 1/s",
        "goodput a=2 1/s",
        "goodput a=3 1/s",
        "TTFT P50 s",
        "SLO attain.",
        "evicted blocks",
    ]
    console = Console(record=True, width=200)
    console.print(table)
    rows = [
        dict(zip(headers, line.split(), strict=True))
        for line in console.export_text().splitlines()
        if line.lstrip().startswith("ILR-1")
    ]
    fcfs, mars = rows
    # fcfs: latency 4 s against T_ideal 2 s -> slowdown 2, on time from alpha 2 on, over a
    # 4 s window; both calls' TTFT (1 s) and TPOT (0.5 s) within 5x of alone
    assert fcfs == {
        "workload": "ILR-1",
        "policy": "fcfs",
        "done": "1/1",
        "latency mean s": "4.00",
        "latency P95 s": "4.00",
        "slowdown mean": "2.00",
        "goodput a=1 1/s": "0.0000",
        "goodput a=2 1/s": "0.2500",
        "goodput a=3 1/s": "0.2500",
        "TTFT P50 s": "1.000",
        "SLO attain.": "100%",
        "evicted blocks": "8",
    }
    # mars was summarized without T_ideal: no slowdown, goodput or SLO attainment
    assert [mars[h] for h in headers[3:]] == ["3.00", "3.00", *["-"] * 4, "1.000", "-", "0"]


def test_jct_columns_are_shown_when_a_run_has_agent_instances() -> None:
    # one agent instance of two branches, 0 - 4 s and 0 - 6 s: JCT 6 s; the other run
    # has no instances, so its JCT cells are "-"
    branches = [session(f"t.{i}", 0, end, task_id="t") for i, end in enumerate((4.0, 6.0))]
    summaries = [
        summarize(run(branches, duration_s=6.0, policy="mars")),
        _summary("fcfs", 4.0, workload="toy", ideal=False),
    ]
    table = summary_table(summaries)
    headers = [str(column.header).replace("\n", " ") for column in table.columns]
    assert headers[3:7] == ["latency mean s", "latency P95 s", "JCT mean s", "JCT P90 s"]
    console = Console(record=True, width=200)
    console.print(table)
    rows = [line.split() for line in console.export_text().splitlines() if "toy" in line]
    cells = {row[1]: dict(zip(headers, row, strict=True)) for row in rows}
    assert (cells["mars"]["JCT mean s"], cells["mars"]["JCT P90 s"]) == ("6.00", "6.00")
    assert (cells["mars"]["latency mean s"], cells["mars"]["latency P95 s"]) == ("5.00", "5.90")
    assert (cells["fcfs"]["JCT mean s"], cells["fcfs"]["JCT P90 s"]) == ("-", "-")


def test_jct_against_load_is_drawn_when_runs_have_agent_instances(tmp_path: Path) -> None:
    branches = [session(f"t.{i}", 0, end, task_id="t") for i, end in enumerate((4.0, 6.0))]
    with_jct = RunResult(rate=0.1, summary=summarize(run(branches, duration_s=6.0)))
    files = write_report([with_jct, with_jct.model_copy(update={"rate": 0.2})], tmp_path / "a")
    assert tmp_path / "a" / "jct_vs_load.png" in files
    assert "jct_vs_load.png" in (tmp_path / "a" / "index.html").read_text()
    ax = _axes()
    report._draw_latency_vs_load(ax, [with_jct], {"fcfs": "C0"}, report.JCT)
    mean, p90 = ax.get_lines()
    assert (list(mean.get_ydata()), list(p90.get_ydata())) == ([6.0], [6.0])
    assert not any(p.name == "jct_vs_load.png" for p in write_report(_sweep(), tmp_path / "b"))
