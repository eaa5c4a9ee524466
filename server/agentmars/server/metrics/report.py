"""Tables and plots of run summaries: the terminal table, and a static report folder
(PNG plots + ``index.html``) drawn from the ``RunResult``s of a sweep.

The plots follow seed 000's figures: latency against load (Fig. 7), TTFT per turn at
several percentiles (Fig. 3B), KV evictions over normalized progress (Fig. 3A) and
goodput against the slack factor alpha (Fig. 9). matplotlib is an optional extra
(``agentmars[report]``), imported only when a report is drawn, and always through its
Agg canvas (no display, no global pyplot state).
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

from agentmars.server.metrics.results import RunResult
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


def _goodput_at(summary: RunSummary, alpha: float) -> float | None:
    return None if summary.goodput is None else summary.goodput.get(alpha)


def _key_columns(summaries: Sequence[RunSummary]) -> list[_Column]:
    """The key metrics, shared by the terminal table and the HTML report; a metric no
    summary has (e.g. fairness without a VTC reference) is left out."""
    alphas = sorted({alpha for s in summaries for alpha in (s.goodput or {})})
    columns = [
        _Column("workload", lambda s: s.workload),
        _Column("policy", lambda s: s.policy),
        _Column("done", lambda s: f"{s.sessions}/{s.sessions + s.unfinished}"),
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
    results: Sequence[RunResult], out_dir: Path, *, config: Mapping[str, Any] | None = None
) -> list[Path]:
    """Draw the plots of ``results`` into ``out_dir`` (created if needed) with an
    ``index.html`` that shows them, the tables and ``config`` (the sweep's resolved
    configuration). Returns the files written, ``index.html`` last."""
    if not results:
        raise ValueError("write_report needs at least one run result")
    out_dir.mkdir(parents=True, exist_ok=True)
    ordered = sorted(results, key=lambda r: (r.workload, _rate_key(r.rate), r.policy))
    colours = _colours(sorted({r.policy for r in ordered}))
    by_workload = _group(ordered, lambda r: r.workload)
    latency_png = out_dir / "latency_vs_load.png"
    _plot_latency_vs_load(by_workload, colours, latency_png)
    sections: list[tuple[str, list[tuple[str, Path]]]] = []
    if any(r.summary.jct_s for r in ordered):
        jct_png = out_dir / "jct_vs_load.png"
        _plot_latency_vs_load(by_workload, colours, jct_png, JCT)
        sections.append(("job completion time", [("JCT against arrival rate", jct_png)]))
    for workload, stem in _file_stems(by_workload).items():
        sections.append((workload, _plot_workload(by_workload[workload], colours, out_dir, stem)))
    index = out_dir / "index.html"
    index.write_text(_index_html(ordered, config or {}, latency_png, sections), encoding="utf-8")
    return [latency_png, *(png for _, plots in sections for _, png in plots), index]


def _plot_workload(
    runs: list[RunResult], colours: Mapping[str, str], out_dir: Path, stem: str
) -> list[tuple[str, Path]]:
    """The per-workload figures, one row of panels per arrival rate: (caption, file)."""
    figures: list[tuple[str, str, Sequence[_Drawer]]] = [
        ("TTFT per turn", "ttft_by_turn", [partial(_draw_ttft, stat=s) for s in _TTFT_STATS]),
        ("KV evictions over normalized progress", "evictions", [_draw_evictions]),
        ("Goodput against alpha", "goodput", [_draw_goodput]),
    ]
    if any(run.summary.fairness for run in runs):
        figures.append(("Finish-time fair ratio against VTC, CDF", "fairness", [_draw_fairness]))
    written = []
    for caption, name, drawers in figures:
        path = out_dir / f"{name}-{stem}.png"
        _plot_per_rate(runs, drawers, colours, path)
        written.append((caption, path))
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


def _figure(rows: int, cols: int) -> tuple[Figure, Any]:
    """A figure on the Agg canvas and its grid of axes (indexed [row, col]), sized so
    every panel gets the same plotting area whatever the grid.

    NOTE: fixed margins rather than matplotlib's constrained or tight layout, which
    measure every text several times and made a report several times slower."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    (axes_w, axes_h), (gap_w, gap_h) = _AXES_IN, _GAP_IN
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
    if not measured:
        _note(ax, "no open-loop run\nwith finished sessions")


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


# --- index.html ------------------------------------------------------------------

_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:120em}"
    "table{border-collapse:collapse;margin:1em 0}"
    "th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right}"
    "th{background:#f4f4f4}td.text{text-align:left}img{max-width:100%}"
)


def _index_html(
    runs: Sequence[RunResult],
    config: Mapping[str, Any],
    latency_png: Path,
    sections: Sequence[tuple[str, Sequence[tuple[str, Path]]]],
) -> str:
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>agentmars report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>agentmars report</h1>",
        "<h2>Configuration</h2>",
        _config_table(config),
        "<h2>Runs</h2>",
        _runs_table(runs),
        "<p>Definitions of every metric: <code>docs/metrics.md</code>.</p>",
        "<h2>Latency against load</h2>",
        _image(latency_png, "latency against arrival rate"),
    ]
    for workload, plots in sections:
        parts.append(f"<h2>{html.escape(workload)}</h2>")
        for caption, png in plots:
            parts += [f"<h3>{html.escape(caption)}</h3>", _image(png, caption)]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _image(png: Path, alt: str) -> str:
    return f'<img src="{html.escape(png.name)}" alt="{html.escape(alt)}">'


def _config_table(config: Mapping[str, Any]) -> str:
    if not config:
        return "<p>(none recorded)</p>"
    rows = [(str(key), json.dumps(value, sort_keys=True)) for key, value in config.items()]
    return _html_table(["key", "value"], rows, text_columns=2)


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
