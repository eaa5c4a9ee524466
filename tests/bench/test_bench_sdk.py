"""The SDK benchmarks produce complete, sane figures (speed targets are not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmars.bench.report import percentiles_us
from agentmars.bench.sdk import bench_emission, bench_http_sink, realistic_events, run
from agentmars.sdk.events import SessionEvent


def _check_percentiles(figures: dict[str, float]) -> None:
    assert set(figures) == {"p50", "p90", "p99", "mean"}
    assert 0 < figures["p50"] <= figures["p90"] <= figures["p99"]
    assert figures["mean"] > 0


def test_percentiles_use_the_nearest_rank() -> None:
    figures = percentiles_us([i * 1000 for i in range(1, 101)])
    assert figures == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "mean": 50.5}


def test_emission_figures_are_sane() -> None:
    result = bench_emission(2000)
    assert result["events"] >= 2000
    _check_percentiles(result["sdk_us"])
    _check_percentiles(result["baseline_us"])
    assert result["ratio_p50"] == pytest.approx(
        result["sdk_us"]["p50"] / result["baseline_us"]["p50"]
    )
    assert result["passed"] == (result["sdk_us"]["p50"] <= result["target_p50_us"])


def test_realistic_events_are_whole_sessions_of_calls() -> None:
    events = realistic_events(100)
    assert len(events) == 100
    assert all(isinstance(e, SessionEvent) for e in events)
    kinds = {e.kind for e in events}
    assert {"session_start", "llm_submit", "llm_end", "tool_start", "session_end"} <= kinds


def test_http_sink_figures_are_sane() -> None:
    result = bench_http_sink(2000, batch_size=200)
    assert result["delivered_all"]
    assert (result["sent"], result["acknowledged"], result["dropped"]) == (2000, 2000, 0)
    assert result["events_per_s"] > 0 and result["baseline_events_per_s"] > 0
    assert result["ratio"] == pytest.approx(
        result["events_per_s"] / result["baseline_events_per_s"]
    )
    assert 0 < result["emit_s"] <= result["elapsed_s"]


def test_run_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sdk.json"
    results = run(2000, 2000, out)
    assert json.loads(out.read_text()) == results
    assert set(results) == {"emission", "http_sink"}
    printed = capsys.readouterr().out
    assert "emission p50" in printed
    assert "HttpSink throughput" in printed
