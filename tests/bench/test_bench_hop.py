"""``agentmars bench hop``: each forwarder's figures, in front of a slow engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentmars.bench.hop import HOPS, run


def test_every_forwarder_is_measured_behind_the_engine_latency(tmp_path: Path) -> None:
    out = tmp_path / "hop.json"
    result = run(20, out, engine_latency_ms=2)
    assert json.loads(out.read_text()) == result
    assert (result["calls"], result["engine_latency_ms"]) == (20, 2)
    # socat where it is installed (scripts/apt-packages.txt asks for it).
    measured = [name for name in HOPS if name != "socat" or shutil.which("socat")]
    assert [name for name in HOPS if name in result] == measured
    for name in measured:
        phase = result[name]
        assert phase["direct_ms"]["p50"] >= 2
        assert phase["through_ms"]["p50"] >= 2
    # A Python proxy parses and forwards: it cannot beat going straight there.
    for name in ("aiohttp", "httpx"):
        assert result[name]["added_p50_ms"] > 0
