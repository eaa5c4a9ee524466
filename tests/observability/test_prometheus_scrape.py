"""The Grafana dashboard (docs/observability/grafana) on a live stack: a real Prometheus
scrapes a gateway on the twin engine (``agentmars serve --engine sim``) while replay
agents run sessions through it, their tools in the sandbox pool. Every target is scraped
without error, every family is typed and documented, and every query of every panel
answers with data: a panel that shows nothing on a live system is a bug."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agentmars.runtime.replay.agent import ReplayAgents, ReplayOptions, ReplayRun
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.pool import SandboxPool
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.sinks import MemorySink
from agentmars.sdk.sinks.http import HttpSink
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload
from tests.cli.serving import Twin, served_twin
from tests.observability.conftest import JOB, Prometheus, StartPrometheus, poll

GRAFANA = Path(__file__).resolve().parents[2] / "docs" / "observability" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "agentmars.json"
MODEL = "cpu-tiny"
POLICY = "mars-paper"
"""Seed 000's MARS: it has an admission window, so that panel has a line, and it pins
KV over tool calls, so the pin panels have lines (the default ``mars`` sends a parked
session's KV to the twin's CPU tier while nobody waits for the blocks)."""


def _session(index: int) -> SessionSpec:
    # One prefix group whose shared prompt fills two of cpu-tiny's 128-token KV blocks:
    # the engine finds it, and each session's earlier turns, in its prefix cache.
    return SessionSpec(
        session_id=f"s{index}",
        arrival_s=0.1 * index,
        prefix_group="system-prompt",
        shared_prefix_tokens=256,
        turns=(
            TurnSpec(append_tokens=300, output_tokens=6, tool=ToolSpec(kind="read", wall_s=0.2)),
            TurnSpec(
                append_tokens=24, output_tokens=4,
                tool=ToolSpec(kind="test", wall_s=0.3, cpu_s=0.1),
            ),
            TurnSpec(append_tokens=16, output_tokens=3),
        ),
    )  # fmt: skip


# Six sessions, their tools on the pool's one slot (two cores: the engine keeps one), so
# tool calls queue and the tool-state gauges and the queue wait have something to show.
WORKLOAD = Workload(name="scrape", sessions=tuple(_session(i) for i in range(6)))
CALLS = sum(len(spec.turns) for spec in WORKLOAD.sessions)

VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")
WHOLE_RUN = {
    "sum(agentmars_session_duration_seconds_count)": len(WORKLOAD.sessions),
    "sum(agentmars_llm_calls_total)": CALLS,
    "sum(vllm:e2e_request_latency_seconds_count)": CALLS,
}
"""Every session ended, every call done at the gateway and in the engine."""
DROPPED_SAMPLES = (
    "prometheus_target_scrapes_sample_duplicate_timestamp_total",
    "prometheus_target_scrapes_sample_out_of_order_total",
    "prometheus_target_scrapes_sample_out_of_bounds_total",
)
"""Prometheus' own counters of samples a scrape read but could not store."""


async def _replay(twin: Twin, root: Path) -> ReplayRun:
    """The workload's sessions through the gateway, as ``agentmars bench replay`` runs
    them: the pool's tool events and the sessions' ends posted to the gateway."""
    sink = HttpSink(twin.base + "/v1/events", token=twin.token)
    events = MemorySink()
    config = SandboxConfig(workspace_root=root / "workspaces", workspace_quota_mb=None)
    try:
        async with SandboxPool(config, emitter=Emitter([events, sink])) as pool:
            agents = ReplayAgents(twin.base, pool, sink, events, ReplayOptions(model=MODEL))
            try:
                return await agents.run(WORKLOAD)
            finally:
                await agents.close()
    finally:
        sink.close()


def _scrape_targets(twin: Twin) -> list[str]:
    """What an operator scrapes: the gateway, whose ``/metrics`` carries the engine's."""
    return [twin.base.removeprefix("http://")]


def _targets_scraped(prometheus: Prometheus) -> bool:
    """Whether Prometheus has found its targets (its discovery hands them over within
    5 s) and scraped each once."""
    targets = prometheus.targets()
    return bool(targets) and all(target["health"] != "unknown" for target in targets)


def _assert_scraped_cleanly(prometheus: Prometheus, targets: list[str]) -> None:
    """Every target up, its last scrape without error."""
    scraped = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in prometheus.targets()]
    assert scraped == [(f"http://{target}/metrics", "up", "") for target in targets]


def _run_as_scraped(prometheus: Prometheus) -> dict[str, float | None]:
    """What Prometheus holds of the run, by query; the whole run is ``WHOLE_RUN``."""
    return {query: prometheus.value(query) for query in WHOLE_RUN}


def _undescribed_series(prometheus: Prometheus) -> list[str]:
    """The ``agentmars_*`` and ``vllm:*`` series whose type and HELP Prometheus did not
    read. In the text format the gateway writes, a TYPE line names its samples' metric
    (a counter's ``_total`` included) or a histogram; a series that another TYPE line
    names, or none, is read as untyped (no counter hints in Grafana)."""
    described = {
        entry["metric"]: entry["type"]
        for entry in prometheus.api("targets/metadata", match_target=f'{{job="{JOB}"}}')
        if entry["type"] != "unknown" and entry["help"]
    }
    histograms = {name for name, kind in described.items() if kind == "histogram"}
    names = prometheus.label_values("__name__", f'{{job="{JOB}"}}')
    ours = [name for name in names if name.startswith(("agentmars_", "vllm:"))]
    assert ours, names
    return [name for name in ours if name not in described and _family(name) not in histograms]


def _family(name: str) -> str:
    """The histogram a ``_bucket``, ``_sum`` or ``_count`` series is part of; else the
    series' own name."""
    for part in ("_bucket", "_sum", "_count"):
        if name.endswith(part):
            return name.removesuffix(part)
    return name


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows too."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _panel_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title and target refId, PromQL) of every panel target."""
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"{panel['title']} / {target['refId']}", target["expr"]


def _substitute(text: str, values: Mapping[str, str]) -> str:
    """``text`` with Grafana's ``$name`` and ``${name}`` replaced by ``values``; a
    variable the dashboard does not define stays and fails the query's check."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))

    return VARIABLE.sub(value, text)


def _variable_values(dashboard: dict[str, Any], prometheus: Prometheus) -> dict[str, list[str]]:
    """Each query variable's options as Grafana lists them, in the dashboard's order (a
    later variable's query may use an earlier one's first value, as Grafana's does)."""
    options: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = LABEL_VALUES.match(variable["query"]["query"])
        assert match, f"{variable['name']}: not a label_values() query"
        selector = _substitute(match.group(1), {k: v[0] for k, v in options.items() if v})
        options[variable["name"]] = prometheus.label_values(match.group(2), selector)
    return options


def _has_data(result: list[dict[str, Any]]) -> bool:
    """Whether a panel would draw something: a sample that is a number (a quantile of
    no observations is NaN, a ratio of zero rates too)."""
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def _dropped_samples(prometheus: Prometheus) -> dict[str, float]:
    text = httpx.get(prometheus.url + "/metrics", timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in DROPPED_SAMPLES
    }


def test_every_dashboard_query_has_data_on_a_live_twin(
    tmp_path: Path, start_prometheus: StartPrometheus
) -> None:
    dashboard = _dashboard()
    with served_twin(args=["--policy", POLICY]) as twin:
        targets = _scrape_targets(twin)
        prometheus = start_prometheus(targets)
        poll(lambda: _targets_scraped(prometheus), 15, "every target scraped")
        _assert_scraped_cleanly(prometheus, targets)
        run = asyncio.run(_replay(twin, tmp_path))
        assert run.failed == []
        poll(
            lambda: _run_as_scraped(prometheus),
            15,
            "the whole run scraped",
            until=lambda seen: seen == WHOLE_RUN,
        )

        _assert_scraped_cleanly(prometheus, targets)
        assert _dropped_samples(prometheus) == dict.fromkeys(DROPPED_SAMPLES, 0.0)
        assert _undescribed_series(prometheus) == []

        options = _variable_values(dashboard, prometheus)
        assert options == {"model_name": [MODEL], "policy": [POLICY]}
        # The dashboard zoomed to the run: its rate windows span the whole run.
        span_s = math.ceil((time.monotonic_ns() - run.start_ns) / 1e9) + 5
        values = {name: first for name, (first, *_) in options.items()}
        values["__rate_interval"] = f"{span_s}s"
        empty: list[str] = []
        for where, expr in _panel_queries(dashboard):
            query = _substitute(expr, values)
            if "$" in query or not _has_data(prometheus.query(query)):
                empty.append(f"{where}: {query}")
        assert empty == []


def test_the_dashboard_is_provisioning_ready() -> None:
    dashboard = _dashboard()
    datasource = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = [p for p in _panels(dashboard["panels"]) if p["type"] != "row"]
    # Every panel and query follows the data source variable: no uid of our Grafana.
    assert all(p["datasource"] == datasource for p in panels)
    assert all(t["datasource"] == datasource for p in panels for t in p["targets"])
    ids = [p["id"] for p in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
    cells = [
        (p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy)
        for p in _panels(dashboard["panels"])
        for dx in range(p["gridPos"]["w"])
        for dy in range(p["gridPos"]["h"])
    ]
    assert len(cells) == len(set(cells)), "panels overlap"
    assert all(0 <= x < 24 for x, _ in cells)

    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/agentmars.yaml").read_text())
    assert sources["apiVersion"] == 1
    assert [s["type"] for s in sources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/agentmars.yaml").read_text())
    assert providers["apiVersion"] == 1
    [provider] = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
