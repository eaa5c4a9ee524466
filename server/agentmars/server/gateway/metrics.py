"""Prometheus ``/metrics`` of the gateway, in a ``CollectorRegistry`` of its own (two
gateways in one process, as in the tests, do not share figures), read off the
operator's fold (``operator_state``) at scrape time: the gauges are its snapshot, the
histograms and counters its own. Every series carries the ``policy`` and ``model_name``
labels (vLLM's label name for the served model).

A figure that is not known has no sample rather than a stand-in value: the admission
window while the policy has sent none (it has no window), the KV figures while the
engine has sent none. The pins and their releases by reason only come from the vLLM
plugin's side channel (the twin's carry no releases).

The engine's own ``/metrics`` (vLLM's ``vllm:*`` series, or the twin's) is appended to
the gateway's by the route (``app.py``), so one scrape target serves a whole dashboard;
``agentmars_engine_metrics_up`` says whether it was. Behind several replicas each
sample of theirs carries a ``replica`` label (``ReplicaSeries``), and the flag says
whether all answered.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from agentmars.server.gateway.operator_state import OperatorState
from agentmars.server.web.prometheus import by_state, labelled


class GatewayCollector(Collector):
    """The gateway's series, from its operator's fold."""

    def __init__(self, operator: OperatorState) -> None:
        self.operator = operator
        self.engine_up = False
        """The engine's ``/metrics`` was read for the scrape in progress."""

    def collect(self) -> Iterator[Metric]:
        operator = self.operator
        labels = {"policy": operator.policy, "model_name": operator.model_name}
        yield from labelled(self._gauges(), labels)
        yield from labelled(operator.metrics(), labels)

    def _gauges(self) -> Iterator[Metric]:
        snap = self.operator.snapshot()
        window = GaugeMetricFamily(
            "agentmars_admission_window_sessions",
            "Admission window of the policy (no sample: the policy has no window)",
        )
        if snap.window is not None:
            window.add_metric([], snap.window)
        yield window
        yield GaugeMetricFamily(
            "agentmars_admission_queue_sessions",
            "Sessions waiting for admission",
            snap.admission_queue,
        )
        yield by_state(
            "agentmars_sessions",
            "Open sessions by state (waiting for admission, an LLM call in flight, a tool "
            "call queued or running, idle between calls)",
            {},
            snap.sessions,
        )
        yield by_state(
            "agentmars_kv_blocks",
            "Engine KV blocks by state (used excludes pinned; they add up to the pool)",
            {},
            snap.kv_blocks,
        )
        pinned = GaugeMetricFamily("agentmars_kv_pinned_sessions", "Sessions holding pinned KV")
        released = CounterMetricFamily(
            "agentmars_kv_pins_released", "KV pins released, by reason", labels=["reason"]
        )
        if snap.kv_blocks:  # else the engine has sent no KV figures yet
            pinned.add_metric([], snap.kv_pinned_sessions)
            for reason, count in sorted(snap.kv_pins_released.items()):
                released.add_metric([reason], count)
        yield pinned
        yield released
        yield by_state("agentmars_tool_calls", "Tool calls by state", {}, snap.tool_calls)
        yield by_state(
            "agentmars_tool_cores",
            "Cores for tools by state (busy: one a running tool call)",
            {},
            snap.tool_cores,
        )
        yield GaugeMetricFamily(
            "agentmars_engine_metrics_up",
            "1 if the engine's /metrics was read for this scrape and follows",
            float(self.engine_up),
        )


class GatewayMetrics:
    """The registry and its scrape-time collector."""

    def __init__(self, operator: OperatorState) -> None:
        self.registry = CollectorRegistry()
        self.collector = GatewayCollector(operator)
        self.registry.register(self.collector)


class ReplicaSeries(Collector):
    """Several engine replicas' own series as one exposition, each sample labelled with
    its ``replica`` (their names are the same: vLLM's, each with ``engine="0"``)."""

    def __init__(self, expositions: Sequence[str | None]) -> None:
        self._expositions = expositions

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for index, text in enumerate(self._expositions):
            if text is None:
                continue
            for family in text_string_to_metric_families(text):
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                replica = str(index)
                merged.samples.extend(
                    sample._replace(labels={**sample.labels, "replica": replica})
                    for sample in family.samples
                )
        yield from families.values()


def replicas_exposition(expositions: Sequence[str | None]) -> bytes:
    """The engines' series of several replicas, labelled (those that gave none left out)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReplicaSeries(expositions))
    return generate_latest(registry)
