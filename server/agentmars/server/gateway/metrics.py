"""Prometheus ``/metrics`` of the gateway, in a ``CollectorRegistry`` of its own (two
gateways in one process, as in the tests, do not share figures).

Gauges are read at scrape time from the admission and the view; every series has a
``policy`` label. ``agentmars_window`` is the admission half's window as its newest
``window_update`` event says, else -1 (the policy has no window: it admits
everything). KV figures are the view's newest ``kv_stats`` (0 while unknown); the pins
and their releases by reason only come from the plugin's side channel.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentmars.sdk.events import AnyEvent, KVStats
from agentmars.server.gateway.admission import Admission


class GatewayCollector(Collector):
    """Scrape-time gauges of one gateway."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.policy = admission.policy_name
        self.last_window: int | None = None

    def observe(self, event: AnyEvent) -> None:
        if event.kind == "window_update":
            self.last_window = event.window

    def window(self) -> int:
        return self.last_window if self.last_window is not None else -1

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(name, doc, labels=["policy"])
        gauge.add_metric([self.policy], value)
        return gauge

    def collect(self) -> Iterator[Metric]:
        view = self.admission.view
        kv = view.kv or KVStats(total_blocks=0, free_blocks=0, used_blocks=0)
        yield self._gauge("agentmars_window", "Admission window (-1: none)", self.window())
        yield self._gauge(
            "agentmars_admission_queue",
            "Sessions waiting for admission",
            len(self.admission.waiting),
        )
        yield self._gauge("agentmars_active_sessions", "Admitted sessions", view.active_sessions)
        yield self._gauge("agentmars_active_tools", "Tool calls running", view.active_tools)
        yield self._gauge("agentmars_queued_tools", "Tool calls queued", view.queued_tools)
        yield self._gauge("agentmars_kv_total_blocks", "KV blocks in the pool", kv.total_blocks)
        yield self._gauge("agentmars_kv_free_blocks", "KV blocks free", kv.free_blocks)
        yield self._gauge("agentmars_kv_used_blocks", "KV blocks in use", kv.used_blocks)
        yield self._gauge("agentmars_kv_pinned_blocks", "KV blocks pinned", kv.pinned_blocks)
        yield self._gauge("agentmars_kv_pins", "Sessions holding pinned KV", kv.pins)
        released = CounterMetricFamily(
            "agentmars_kv_pins_released", "Pins released, by reason", labels=["policy", "reason"]
        )
        for reason, count in sorted(kv.released.items()):
            released.add_metric([self.policy, reason], count)
        yield released


class GatewayMetrics:
    """The registry, the scrape-time collector and the call counter."""

    def __init__(self, admission: Admission) -> None:
        self.registry = CollectorRegistry()
        self.collector = GatewayCollector(admission)
        self.registry.register(self.collector)
        self.calls = Counter(
            "agentmars_llm_calls",
            "LLM calls the gateway forwarded, by outcome",
            ["policy", "status"],
            registry=self.registry,
        )

    def count_call(self, status: str) -> None:
        self.calls.labels(self.collector.policy, status).inc()
