"""What one proxy hop in front of an engine costs, by what does the forwarding: the
gateway's server stack with its aiohttp session (``passthrough.py``), the same with
httpx's async client, which the gateway used before, and a C byte relay (socat, with
TCP_NODELAY) that parses nothing. The engine is our scripted server, answering at once
or after ``engine_latency_ms``; the calls alternate as in ``agentmars bench gateway``.

Why a gateway's hop costs more in front of an engine that takes a few ms: the proxy
idles while the engine works and its next step runs cold, the more so the more Python
it runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from agentmars.bench.gateway import Hop, measure, phase_table, python_module
from agentmars.bench.report import progress_bars, publish

PASSTHROUGH = "agentmars.bench.passthrough"
SOCAT = (
    'exec socat "TCP-LISTEN:$2,bind=127.0.0.1,reuseaddr,fork,nodelay" "TCP:${0#http://},nodelay"'
)
"""sh -c SOCAT ENGINE_URL --port N: listen on N, relay each connection to the engine."""
HOPS = {
    "aiohttp": python_module(PASSTHROUGH, "--client", "aiohttp"),
    "httpx": python_module(PASSTHROUGH, "--client", "httpx"),
    "socat": Hop(("sh", "-c", SOCAT, "{engine_url}"), health_path="/v1/models"),
}


def run(calls: int, json_out: Path | None, engine_latency_ms: float = 0) -> dict[str, Any]:
    hops = {name: hop for name, hop in HOPS.items() if name != "socat" or shutil.which("socat")}
    with progress_bars() as progress:
        phases = measure(calls, progress, None, engine_latency_ms, hops)
    title = (
        f"one hop: {calls} short completions, alternating "
        f"(scripted engine answering after {engine_latency_ms:g} ms)"
    )
    table, figures = phase_table(title, phases, target_path=None)
    if "socat" not in hops:
        table.caption = "socat is not installed: no byte-relay row"
    figures.update(calls=calls, engine_latency_ms=engine_latency_ms)
    return publish(table, figures, json_out)
