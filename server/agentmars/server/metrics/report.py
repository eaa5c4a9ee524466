"""Tables and plots of run summaries: the terminal table, and a static report folder
(PNG plots + ``index.html``) drawn from the ``RunResult``s of a sweep and, when given,
the runs' records.

The page opens with the headline: at each load, the first policy's mean and P95
latency against the others', and how far the simulator's prediction of each
(``results.PREDICTED``) was off. From the records: the CDF of the sessions' latencies
and a timeline of a few sessions. Then seed 000's figures: latency against load
(Fig. 7), TTFT per turn at several percentiles (Fig. 3B), KV evictions over
normalized progress (Fig. 3A) and goodput against the slack factor alpha (Fig. 9),
each only when some run has its data; then the tables and the configuration.
matplotlib is an optional extra (``agentmars[report]``), imported only when a report is
drawn, and always through its Agg canvas (no display, no global pyplot state).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich import box
from rich.table import Table

from agentmars.server.metrics.records import RunRecord, SessionRecord
from agentmars.server.metrics.results import (
    PREDICTED,
    RunResult,
    is_prediction,
    prediction_error,
)
from agentmars.server.metrics.summary import Distribution, RunSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_K = TypeVar("_K")
_T = TypeVar("_T")
_Drawer = Callable[["Axes", list[RunResult], Mapping[str, str]], None]

_TTFT_STATS = ("mean", "p50", "p90", "p99")
# Inches: one panel's plotting area; the gaps between panels (room for the y label,
# for the x label and the next row's title); the left, right (the legend), bottom and
# top (the figure's title) margins.
_AXES_IN = (3.6, 2.4)
_GAP_IN = (0.9, 0.9)
_MARGINS_IN = (0.8, 1.6, 0.6, 0.8)
_TIMELINE_AXES_IN = (11.0, 2.0)
"""A timeline panel: wide, for the spans of a whole run."""
TIMELINE_SESSIONS = 6
"""Sessions the timeline shows per run (ours: enough to see them overlap, few enough
to read each span)."""
_SPAN_COLOURS = {
    "admission wait": "#bbbbbb",
    "LLM: to 1st token": "#ff7f0e",
    "LLM: generating": "#1f77b4",
    "tool: queued": "#c7e9c0",
    "tool: running": "#2ca02c",
}
"""The timeline's spans; "to 1st token" is the wait in the engine (its queue and the
prompt's prefill)."""


_MEASURED_ADMISSION = (
    "In a measured run, a session's admission is when the gateway's event stream showed "
    "its first call leave admission for the engine; the wait for the first token "
    "counts from then."
)


@dataclass(frozen=True, slots=True)
class _Plot:
    """A figure of the page: its caption, its file, what to read it with."""

    caption: str
    path: Path
    note: str = ""


# --- tables ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Column:
    """A column of the summary tables: its header, how to read it, its format spec."""

    header: str
    value: Callable[[RunSummary], object]
    spec: str = ""
    terminal: bool = True
    """Shown in the terminal table too (the HTML table shows every column)."""

    def cell(self, summary: RunSummary) -> str:
        value = self.value(summary)
        if value is None:
            return "-"
        return value if isinstance(value, str) else format(value, self.spec)


def _stat(
    read: Callable[[RunSummary], Distribution | None], stat: str
) -> Callable[[RunSummary], float | None]:
    def value(summary: RunSummary) -> float | None:
        dist = read(summary)
        return None if dist is None else float(getattr(dist, stat))

    return value


def _done(summary: RunSummary) -> str:
    return f"{summary.sessions}/{summary.sessions + summary.unfinished}"


def _goodput_at(summary: RunSummary, alpha: float) -> float | None:
    return None if summary.goodput is None else summary.goodput.get(alpha)


def _key_columns(summaries: Sequence[RunSummary]) -> list[_Column]:
    """The key metrics, shared by the terminal table and the HTML report; a metric no
    summary has (e.g. fairness without a VTC reference) is left out."""
    alphas = sorted({alpha for s in summaries for alpha in (s.goodput or {})})
    columns = [
        _Column("workload", lambda s: s.workload),
        _Column("policy", lambda s: s.policy),
        _Column("done", _done),
        _Column("latency\nmean s", _stat(lambda s: s.latency_s, "mean"), ".2f"),
        _Column("latency\nP95 s", _stat(lambda s: s.latency_s, "p95"), ".2f"),
        _Column("JCT\nmean s", _stat(lambda s: s.jct_s, "mean"), ".2f"),
        _Column("JCT\nP90 s", _stat(lambda s: s.jct_s, "p90"), ".2f"),
        _Column("slowdown\nmean", _stat(lambda s: s.slowdown, "mean"), ".2f"),
        *(
            _Column(f"goodput\na={alpha:g} 1/s", partial(_goodput_at, alpha=alpha), ".4f")
            for alpha in alphas
        ),
        _Column("TTFT\nP50 s", _stat(lambda s: s.ttft_s, "p50"), ".3f"),
        _Column("TPOT\nP50 s", _stat(lambda s: s.tpot_s, "p50"), ".4f", terminal=False),
        _Column("SLO\nattain.", lambda s: s.slo_attainment, ".0%"),
        _Column("output\ntok/s", lambda s: s.output_tokens_per_s, ".1f", terminal=False),
        _Column("evicted\nblocks", lambda s: s.kv.evicted_blocks, "d"),
        _Column("prefix\nhits", lambda s: s.kv.prefix_hit_rate, ".0%", terminal=False),
        _Column(
            "tool queue\nmean s",
            _stat(lambda s: s.cpu.tool_queue_s, "mean"),
            ".3f",
            terminal=False,
        ),
        _Column("core\nutil.", lambda s: s.cpu.core_utilisation, ".0%", terminal=False),
        _Column("fair ratio\nmax", lambda s: s.fairness.max if s.fairness else None, ".2f"),
    ]
    return [c for c in columns if any(c.value(summary) is not None for summary in summaries)]


def summary_table(summaries: Sequence[RunSummary]) -> Table:
    """The key metrics of each run, one row per run, for the terminal (the report's
    HTML table has more)."""
    columns = [column for column in _key_columns(summaries) if column.terminal]
    names, metrics = _split_names(columns)
    table = Table(title="agentmars run summary", box=box.SIMPLE_HEAD)
    for column in names:
        table.add_column(column.header, overflow="fold")
    for column in metrics:
        table.add_column(column.header, justify="right", overflow="fold")
    for summary in summaries:
        table.add_row(*(column.cell(summary) for column in columns))
    return table


# --- report folder ---------------------------------------------------------------


def write_report(
    results: Sequence[RunResult],
    out_dir: Path,
    *,
    config: Mapping[str, Any] | None = None,
    records: Sequence[RunRecord] = (),
) -> list[Path]:
    """Draw the plots of ``results`` (and, from ``records``, the runs' per-session
    figures) into ``out_dir`` (created if needed) with an ``index.html`` that opens
    with the headline and shows them, the tables and ``config`` (the sweep's resolved
    configuration). Returns the files written, ``index.html`` last."""
    if not results:
        raise ValueError("write_report needs at least one run result")
    out_dir.mkdir(parents=True, exist_ok=True)
    ordered = sorted(results, key=lambda r: (r.workload, _rate_key(r.rate), r.policy))
    colours = _colours(sorted({r.policy for r in ordered} | {r.policy for r in records}))
    sections: list[tuple[str, list[_Plot]]] = []
    if records:
        sections.append(("Sessions", _plot_sessions(records, colours, out_dir)))
    sections.append(("Against load", _plot_against_load(ordered, colours, out_dir)))
    by_workload = _group(ordered, lambda r: r.workload)
    for workload, stem in _file_stems(by_workload).items():
        sections.append((workload, _plot_workload(by_workload[workload], colours, out_dir, stem)))
    sections = [(title, plots) for title, plots in sections if plots]
    index = out_dir / "index.html"
    index.write_text(_index_html(results, ordered, config or {}, sections), encoding="utf-8")
    return [*(plot.path for _, plots in sections for plot in plots), index]


def _plot_sessions(
    records: Sequence[RunRecord], colours: Mapping[str, str], out_dir: Path
) -> list[_Plot]:
    """The latency CDF and the timeline, of the runs with finished sessions."""
    finished = [record for record in records if record.sessions]
    if not finished:
        return []
    cdf_png, timeline_png = out_dir / "latency_cdf.png", out_dir / "timeline.png"
    _plot_latency_cdf(finished, colours, cdf_png)
    _plot_timeline(finished, timeline_png)
    measured = any(not is_prediction(record.policy) for record in finished)
    return [
        _Plot("End-to-end latency per session, CDF", cdf_png),
        _Plot(
            f"Timeline of {TIMELINE_SESSIONS} sessions",
            timeline_png,
            _MEASURED_ADMISSION if measured else "",
        ),
    ]


def _plot_against_load(
    ordered: list[RunResult], colours: Mapping[str, str], out_dir: Path
) -> list[_Plot]:
    """Latency (and JCT, when runs have agent instances) against arrival rate, for the
    workloads run at two rates or more: at one rate it would be single dots, which the
    headline says better."""
    plots = []
    for measure, name, caption in (
        (LATENCY, "latency_vs_load", "Latency against arrival rate"),
        (JCT, "jct_vs_load", "Job completion time against arrival rate"),
    ):
        curves = _load_curves(ordered, measure)
        if curves:
            path = out_dir / f"{name}.png"
            _plot_latency_vs_load(curves, colours, path, measure)
            plots.append(_Plot(caption, path))
    return plots


def _load_curves(runs: list[RunResult], measure: _Measure) -> dict[str, list[RunResult]]:
    """Per workload, its open-loop runs with the measure, when they span two rates."""
    with_measure = [r for r in runs if r.rate is not None and measure.read(r.summary) is not None]
    by_workload = _group(with_measure, lambda r: r.workload)
    return {w: rs for w, rs in by_workload.items() if len({r.rate for r in rs}) >= 2}


def _plot_workload(
    runs: list[RunResult], colours: Mapping[str, str], out_dir: Path, stem: str
) -> list[_Plot]:
    """The per-workload figures, one row of panels per arrival rate: (caption, file)."""
    ttft = [partial(_draw_ttft, stat=s) for s in _TTFT_STATS]
    figures: list[tuple[str, str, Sequence[_Drawer], Callable[[RunSummary], object]]] = [
        ("TTFT per turn", "ttft_by_turn", ttft, lambda s: s.ttft_by_turn_s),
        (
            "KV evictions over normalized progress",
            "evictions",
            [_draw_evictions],
            lambda s: s.kv.evicted_blocks,
        ),
        ("Goodput against alpha", "goodput", [_draw_goodput], lambda s: s.goodput),
        (
            "Finish-time fair ratio against VTC, CDF",
            "fairness",
            [_draw_fairness],
            lambda s: s.fairness,
        ),
    ]
    written = []
    for caption, name, drawers, has_data in figures:
        # NOTE: ours — a figure no run has data for is left out rather than drawn as
        # empty panels that each say so.
        if not any(has_data(run.summary) for run in runs):
            continue
        path = out_dir / f"{name}-{stem}.png"
        _plot_per_rate(runs, drawers, colours, path)
        written.append(_Plot(caption, path))
    return written


def _group(items: Iterable[_T], key: Callable[[_T], _K]) -> dict[_K, list[_T]]:
    """Items by key, keys in order of first appearance."""
    groups: dict[_K, list[_T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def _rate_key(rate: float | None) -> tuple[bool, float]:
    return (rate is None, rate or 0.0)


def _rate_label(rate: float | None) -> str:
    return "closed loop" if rate is None else f"{rate:g} sessions/s"


def _file_stems(by_workload: Mapping[str, object]) -> dict[str, str]:
    """A file-name-safe, distinct stem per workload."""
    stems: dict[str, str] = {}
    for workload in by_workload:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", workload).strip("._") or "workload"
        while stem in stems.values():
            stem += "_"
        stems[workload] = stem
    return stems


# --- plots -----------------------------------------------------------------------


def _colours(policies: Sequence[str]) -> dict[str, str]:
    """A colour per policy, the same in every figure (tab10, or tab20 past ten)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    palette = colormaps["tab10" if len(policies) <= 10 else "tab20"].colors  # type: ignore[attr-defined]
    return {policy: to_hex(palette[i % len(palette)]) for i, policy in enumerate(policies)}


def _figure(rows: int, cols: int, axes_in: tuple[float, float] = _AXES_IN) -> tuple[Figure, Any]:
    """A figure on the Agg canvas and its grid of axes (indexed [row, col]), sized so
    every panel gets the same plotting area (``axes_in``) whatever the grid.

    NOTE: fixed margins rather than matplotlib's constrained or tight layout, which
    measure every text several times and made a report several times slower."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    (axes_w, axes_h), (gap_w, gap_h) = axes_in, _GAP_IN
    left, right, bottom, top = _MARGINS_IN
    width = left + right + cols * axes_w + (cols - 1) * gap_w
    height = bottom + top + rows * axes_h + (rows - 1) * gap_h
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    figure.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        wspace=gap_w / axes_w,
        hspace=gap_h / axes_h,
    )
    return figure, figure.subplots(rows, cols, squeeze=False)


def _save(figure: Figure, title: str, path: Path) -> None:
    """Title the figure, put one legend of every policy drawn in its right margin, and
    write it as a PNG."""
    legend: dict[str, Any] = {}
    for ax in figure.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    if legend:
        figure.legend(list(legend.values()), list(legend), loc="center right", fontsize="small")
    figure.suptitle(title)
    figure.savefig(path, dpi=100)


def _note(ax: Axes, text: str) -> None:
    """An empty panel that says why it is empty."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


@dataclass(frozen=True)
class _Measure:
    title: str
    read: Callable[[RunSummary], Distribution | None]
    upper: str
    """The upper statistic drawn dashed beside the mean."""


LATENCY = _Measure("end-to-end latency", lambda s: s.latency_s, "p95")
JCT = _Measure("job completion time (per agent instance)", lambda s: s.jct_s, "p90")


def _plot_latency_vs_load(
    by_workload: Mapping[str, list[RunResult]],
    colours: Mapping[str, str],
    path: Path,
    measure: _Measure = LATENCY,
) -> None:
    """Seed 000 Fig. 7 (seed 004 Fig. 7 with ``JCT``): one panel per workload."""
    figure, axes = _figure(1, len(by_workload))
    for ax, runs in zip(axes[0], by_workload.values(), strict=True):
        _draw_latency_vs_load(ax, runs, colours, measure)
    title = f"{measure.title}: mean (solid), {measure.upper.upper()} (dashed)"
    _save(figure, title, path)


def _draw_latency_vs_load(
    ax: Axes, runs: list[RunResult], colours: Mapping[str, str], measure: _Measure = LATENCY
) -> None:
    """Mean (solid) and an upper percentile (dashed) against arrival rate, a colour per
    policy; closed-loop runs have no rate and are left out."""
    ax.set(
        title=runs[0].workload, xlabel="arrival rate (sessions/s)", ylabel=f"{measure.title} (s)"
    )
    measured = [
        (r.policy, r.rate, figure)
        for r in runs
        if r.rate is not None and (figure := measure.read(r.summary)) is not None
    ]
    for policy, points in _group(measured, lambda point: point[0]).items():
        rates = [rate for _, rate, _ in points]
        colour = colours[policy]
        ax.plot(rates, [d.mean for _, _, d in points], "-o", color=colour, label=policy)
        ax.plot(rates, [getattr(d, measure.upper) for _, _, d in points], "--s", color=colour)


def _plot_per_rate(
    runs: list[RunResult], drawers: Sequence[_Drawer], colours: Mapping[str, str], path: Path
) -> None:
    """One row of panels per arrival rate, one panel per drawer."""
    by_rate = _group(runs, lambda r: r.rate)
    figure, axes = _figure(len(by_rate), len(drawers))
    for row, (rate, rate_runs) in enumerate(by_rate.items()):
        for col, draw in enumerate(drawers):
            draw(axes[row, col], rate_runs, colours)
            axes[row, col].set_title(f"{axes[row, col].get_title()} ({_rate_label(rate)})")
    _save(figure, runs[0].workload, path)


def _draw_ttft(ax: Axes, runs: list[RunResult], colours: Mapping[str, str], stat: str) -> None:
    """Seed 000 Fig. 3B: a TTFT statistic per turn index."""
    from matplotlib.ticker import MaxNLocator

    ax.set(title=f"TTFT {stat}", xlabel="turn", ylabel="TTFT (s)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    drawn = [r for r in runs if r.summary.ttft_by_turn_s]
    for run in drawn:
        by_turn = run.summary.ttft_by_turn_s
        turns = sorted(by_turn)
        values = [getattr(by_turn[turn], stat) for turn in turns]
        ax.plot(turns, values, "-o", markersize=3, color=colours[run.policy], label=run.policy)
    if not drawn:
        _note(ax, "no LLM calls recorded")


def _draw_evictions(ax: Axes, runs: list[RunResult], colours: Mapping[str, str]) -> None:
    """Seed 000 Fig. 3A: evicted blocks per second over normalized progress."""
    ax.set(title="KV evictions", xlabel="normalized progress", ylabel="evicted blocks/s")
    evicted = any(r.summary.kv.evicted_blocks for r in runs)
    drawn = [r for r in runs if r.summary.kv.eviction_rate_by_progress] if evicted else []
    for run in drawn:
        curve = run.summary.kv.eviction_rate_by_progress
        centres = [(i + 0.5) / len(curve) for i in range(len(curve))]
        ax.plot(centres, curve, "-o", markersize=3, color=colours[run.policy], label=run.policy)
    if not drawn:
        _note(ax, "no KV evictions")


def _draw_fairness(ax: Axes, runs: list[RunResult], colours: Mapping[str, str]) -> None:
    """Seed 004 Fig. 8: the CDF of the agent instances' finish-time fair ratios."""
    ax.set(title="fair ratio", xlabel="JCT / JCT under VTC", ylabel="CDF of agent instances")
    ax.set_xscale("log")
    drawn = [(r, r.summary.fairness.ratios) for r in runs if r.summary.fairness]
    for run, ratios in drawn:
        cdf = [(i + 1) / len(ratios) for i in range(len(ratios))]
        ax.step(ratios, cdf, where="post", color=colours[run.policy], label=run.policy)
    ax.axvline(1.0, color="grey", linewidth=0.8)
    if not drawn:
        _note(ax, "no VTC run to compare with")


def _draw_goodput(ax: Axes, runs: list[RunResult], colours: Mapping[str, str]) -> None:
    """Seed 000 Fig. 9: goodput against the slack factor alpha."""
    ax.set(title="goodput", xlabel="alpha (x T_ideal)", ylabel="goodput (sessions/s)")
    drawn = [(r, r.summary.goodput) for r in runs if r.summary.goodput]
    for run, goodput in drawn:
        alphas = sorted(goodput)
        ax.plot(
            alphas, [goodput[a] for a in alphas], "-o", color=colours[run.policy], label=run.policy
        )
    if not drawn:
        _note(ax, "no goodput:\nsummarized without T_ideal")


def _plot_latency_cdf(records: Sequence[RunRecord], colours: Mapping[str, str], path: Path) -> None:
    """One panel per workload: the CDF of each run's session latencies, predictions
    dashed."""
    by_workload = _group(records, lambda r: r.workload)
    figure, axes = _figure(1, len(by_workload))
    for ax, (workload, runs) in zip(axes[0], by_workload.items(), strict=True):
        ax.set(title=workload, xlabel="end-to-end latency (s)", ylabel="CDF of sessions")
        for run in runs:
            style = "--" if is_prediction(run.policy) else "-"
            latencies = [session.latency_s for session in run.sessions]
            ax.ecdf(latencies, linestyle=style, color=colours[run.policy], label=run.policy)
    _save(figure, "end-to-end latency per session", path)


def _plot_timeline(records: Sequence[RunRecord], path: Path) -> None:
    """One panel per run, the same few sessions in each, on one time axis: a row per
    session, a coloured span for each wait and each call."""
    shown = _timeline_sessions(records)
    figure, axes = _figure(len(records), 1, _TIMELINE_AXES_IN)
    for ax, run in zip(axes[:, 0], records, strict=True):
        sessions = {session.session_id: session for session in run.sessions}
        ax.set(title=f"{run.policy} ({run.workload})", xlabel="time since the run began (s)")
        for row, session_id in enumerate(shown):
            if session_id in sessions:
                _draw_session(ax, row, sessions[session_id])
        ax.set_yticks(range(len(shown)), shown, fontsize="small")
        ax.set_ylim(len(shown) - 0.5, -0.5)
    end = max(session.end_s for run in records for session in run.sessions)
    for ax in axes[:, 0]:
        ax.set_xlim(0, end * 1.02)
    _save(figure, "what a few sessions spent their time on", path)


def _timeline_sessions(records: Sequence[RunRecord]) -> list[str]:
    """``TIMELINE_SESSIONS`` sessions spread over the first run's arrivals, finished in
    as many runs as can be (the same sessions in every panel, to compare them)."""
    finished = [{s.session_id for s in run.sessions} for run in records]
    first = sorted(records[0].sessions, key=lambda session: session.arrival_s)
    everywhere = [s.session_id for s in first if all(s.session_id in ids for ids in finished)]
    pool = everywhere if len(everywhere) >= TIMELINE_SESSIONS else [s.session_id for s in first]
    if len(pool) <= TIMELINE_SESSIONS:
        return pool
    step = (len(pool) - 1) / (TIMELINE_SESSIONS - 1)
    return [pool[round(i * step)] for i in range(TIMELINE_SESSIONS)]


def _draw_session(ax: Axes, row: int, session: SessionRecord) -> None:
    spans: dict[str, list[tuple[float, float]]] = {
        "admission wait": [(session.arrival_s, session.admitted_s)],
        # A session's first call waits for its admission before the engine sees it.
        "LLM: to 1st token": [
            (max(c.submit_s, session.admitted_s), c.first_token_s) for c in session.calls
        ],
        "LLM: generating": [(c.first_token_s, c.end_s) for c in session.calls],
        "tool: queued": [(t.enqueue_s, t.start_s) for t in session.tools],
        "tool: running": [(t.start_s, t.end_s) for t in session.tools],
    }
    for kind, intervals in spans.items():
        widths = [(start, end - start) for start, end in intervals if end > start]
        ax.broken_barh(widths, (row - 0.35, 0.7), color=_SPAN_COLOURS[kind], label=kind)


# --- index.html ------------------------------------------------------------------

_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:120em}"
    "#headline .lead{font-size:1.4em}"
    "table{border-collapse:collapse;margin:1em 0}"
    "th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right}"
    "th{background:#f4f4f4}td.text{text-align:left}img{max-width:100%}"
)


def _index_html(
    results: Sequence[RunResult],
    ordered: Sequence[RunResult],
    config: Mapping[str, Any],
    sections: Sequence[tuple[str, Sequence[_Plot]]],
) -> str:
    """The headline, the figures, then the details: the runs table and the
    configuration."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>agentmars report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>agentmars report</h1>",
        _headline_html(results),
    ]
    for title, plots in sections:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        for plot in plots:
            parts += [f"<h3>{html.escape(plot.caption)}</h3>", _image(plot.path, plot.caption)]
            if plot.note:
                parts.append(f"<p>{html.escape(plot.note)}</p>")
    parts += [
        "<h2>Details</h2>",
        "<h3>Runs</h3>",
        _runs_table(ordered),
        "<p>Definitions of every metric: <code>docs/metrics.md</code>.</p>",
        "<h3>Configuration</h3>",
        _config_table(config),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _headline_html(results: Sequence[RunResult]) -> str:
    """At each (workload, rate): a sentence comparing the first policy's latency with
    each other's, and a table of every policy's mean and P95 latency beside the
    simulator's prediction of it, when there is one."""
    parts = ['<section id="headline">']
    for (workload, rate), runs in _group(results, lambda r: (r.workload, r.rate)).items():
        measured = [r for r in runs if not is_prediction(r.policy) and r.summary.latency_s]
        if not measured:
            continue
        predictions = {r.policy: r.summary for r in runs if is_prediction(r.policy)}
        parts.append(f"<h2>{html.escape(workload)} at {html.escape(_rate_label(rate))}</h2>")
        parts += [_comparison(measured[0], other) for other in measured[1:]]
        parts.append(_headline_table(measured, predictions))
    parts.append("</section>")
    return "\n".join(parts)


def _comparison(subject: RunResult, other: RunResult) -> str:
    """``mars: 1.25x lower mean latency than fcfs (2.63 s against 3.28 s), 1.20x lower
    P95 (3.39 s against 4.07 s).``"""
    ours, theirs = subject.summary.latency_s, other.summary.latency_s
    assert ours is not None and theirs is not None
    mean = _ratio(ours.mean, theirs.mean)
    p95 = _ratio(ours.p95, theirs.p95)
    text = (
        f"<strong>{html.escape(subject.policy)}</strong>: {mean} mean latency than "
        f"{html.escape(other.policy)} ({ours.mean:.2f} s against {theirs.mean:.2f} s), "
        f"{p95} P95 ({ours.p95:.2f} s against {theirs.p95:.2f} s)."
    )
    return f'<p class="lead">{text}</p>'


def _ratio(ours: float, theirs: float) -> str:
    if ours == theirs:
        return "the same"
    if ours < theirs:
        return f"{theirs / ours:.2f}x lower"
    return f"{ours / theirs:.2f}x higher"


def _headline_table(measured: list[RunResult], predictions: Mapping[str, RunSummary]) -> str:
    headers = ["policy", "sessions done", "mean latency s", "P95 latency s"]
    predicted = any(run.policy + PREDICTED in predictions for run in measured)
    if predicted:
        headers += ["predicted mean s", "its error", "predicted P95 s", "its error"]
    rows = []
    for run in measured:
        latency = run.summary.latency_s
        assert latency is not None
        row = [run.policy, _done(run.summary), f"{latency.mean:.2f}", f"{latency.p95:.2f}"]
        if predicted:
            prediction = predictions.get(run.policy + PREDICTED)
            row += _predicted_cells(prediction.latency_s if prediction else None, latency)
        rows.append(row)
    return _html_table(headers, rows, text_columns=1)


def _predicted_cells(predicted: Distribution | None, measured: Distribution) -> list[str]:
    """The predicted mean and P95, each with its error against the measured one."""
    if predicted is None:
        return ["-"] * 4
    return [
        f"{predicted.mean:.2f}",
        f"{prediction_error(predicted.mean, measured.mean):+.0%}",
        f"{predicted.p95:.2f}",
        f"{prediction_error(predicted.p95, measured.p95):+.0%}",
    ]


def _image(png: Path, alt: str) -> str:
    return f'<img src="{html.escape(png.name)}" alt="{html.escape(alt)}">'


def _config_table(config: Mapping[str, Any]) -> str:
    """One row per setting, nested ones named by their path (``plan.sessions``)."""
    if not config:
        return "<p>(none recorded)</p>"
    return _html_table(["setting", "value"], _flattened(config), text_columns=2)


def _flattened(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            rows += _flattened(value, name + ".")
        else:
            rows.append((name, _setting(value)))
    return rows


def _setting(value: Any) -> str:
    """A setting as a person writes it: lists of plain values comma-separated, nothing
    as ``-``; anything deeper as JSON."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return ", ".join(_setting(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(value, sort_keys=True)


def _runs_table(runs: Sequence[RunResult]) -> str:
    """The key columns with the arrival rate after workload and policy."""
    names, metrics = _split_names(_key_columns([run.summary for run in runs]))
    headers = [*(c.header for c in names), "rate (1/s)", *(c.header for c in metrics)]
    rows = [
        [
            *(c.cell(run.summary) for c in names),
            "-" if run.rate is None else f"{run.rate:g}",
            *(c.cell(run.summary) for c in metrics),
        ]
        for run in runs
    ]
    return _html_table(headers, rows, text_columns=len(names))


def _split_names(columns: list[_Column]) -> tuple[list[_Column], list[_Column]]:
    """(workload and policy, the metrics)."""
    return columns[:2], columns[2:]


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[str]], text_columns: int) -> str:
    """A table whose first ``text_columns`` columns are left-aligned text."""
    head = "".join(f"<th>{html.escape(h).replace(chr(10), '<br>')}</th>" for h in headers)
    body = [
        "<tr>" + "".join(_td(cell, text=i < text_columns) for i, cell in enumerate(row)) + "</tr>"
        for row in rows
    ]
    return "\n".join(["<table>", f"<tr>{head}</tr>", *body, "</table>"])


def _td(cell: str, *, text: bool) -> str:
    return f'<td class="text">{html.escape(cell)}</td>' if text else f"<td>{html.escape(cell)}</td>"
