"""What the real-engine tests share: the tiny model, the plugin's KV status file and
vLLM's Prometheus counters."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import httpx

from agentmars.sdk.events import EventError, KVStats, decode_event
from agentmars.server.engines.vllm.smoke import metric_total

PLUGIN = "agentmars.server.engines.vllm.plugin.AgentmarsScheduler"
"""``--scheduler-cls`` of the agentmars plugin (the CPU backend's synchronous one)."""


def kv_status(path: Path, newer_than: float | None = None) -> KVStats:
    """The plugin's KV figures (the ``kv_stats`` event in its status file), sampled
    after ``newer_than`` (wall-clock seconds; default: now)."""
    newer_than = time.time() if newer_than is None else newer_than
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, EventError):
            figures = decode_event(path.read_bytes())
            assert isinstance(figures, KVStats), figures
            if figures.wall_ns / 1e9 > newer_than:
                return figures
        time.sleep(0.02)
    raise AssertionError(f"no fresh KV status in {path}")


def blocks(figures: KVStats) -> tuple[int, int, int]:
    """Free and pinned blocks, and pins: what most checks compare at once."""
    return figures.free_blocks, figures.pinned_blocks, figures.pins


def released(figures: KVStats, before: KVStats) -> dict[str, int]:
    """Pins released between two status samples, by reason (reasons with none left out)."""
    counts = {reason: n - before.released.get(reason, 0) for reason, n in figures.released.items()}
    return {reason: n for reason, n in counts.items() if n}


def labelled_total(exposition: str, name: str, **labels: str) -> float:
    """Like ``metric_total``, over the samples carrying all of ``labels`` only."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    lines = [line for line in exposition.splitlines() if all(w in line for w in wanted)]
    return metric_total("\n".join(lines), name)


def engine_metric(base_url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` with ``labels`` on ``base_url/metrics``."""
    return labelled_total(httpx.get(f"{base_url}/metrics", timeout=10.0).text, name, **labels)


def wait_for_metric(base_url: str, name: str, value: float, timeout_s: float = 30.0) -> None:
    """Wait until vLLM's ``name`` reads ``value``."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = engine_metric(base_url, name)
        if seen == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} stayed {seen}, not {value}")
