"""The gateway benchmark produces complete, sane figures (its target is not asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmars.bench.gateway import run


def test_gateway_figures_are_complete_and_the_gateway_path_is_the_longer(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    result = run(30, out)
    assert json.loads(out.read_text()) == result
    assert result["calls"] == 30
    for path in ("direct_ms", "gateway_ms"):
        figures = result[path]
        assert 0 < figures["p50"] <= figures["p90"] <= figures["p99"]
    # One more loopback hop and a proxy cannot be faster than going straight there.
    assert result["gateway_ms"]["p50"] > result["direct_ms"]["p50"]
    added = result["gateway_ms"]["p50"] - result["direct_ms"]["p50"]
    assert result["added_p50_ms"] == pytest.approx(added)
