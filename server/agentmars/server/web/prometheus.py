"""Prometheus pieces the gateway and the wall-clock twin share: vLLM's histogram bucket
boundaries, so a latency the gateway measures and the same latency the engine measures
fall in the same buckets on one dashboard, and the labels a whole exposition carries.

The buckets are vLLM 0.32's defaults (``vllm/v1/metrics/buckets.py``); this package
imports no vLLM, so they are written out here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's ``request_latency`` family (``vllm:e2e_request_latency_seconds``)."""
TIME_TO_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ``time_to_first_token`` family (``vllm:time_to_first_token_seconds``)."""
INTER_TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ``inter_token_latency`` family (``vllm:inter_token_latency_seconds``)."""
ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)  # fmt: skip
"""vLLM's ``iteration_tokens`` family (``vllm:iteration_tokens_total``)."""


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``request_tokens`` family (``vllm:request_prompt_tokens`` ...): 1, 2, 5,
    10, 20, 50 ... up to the context."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


def by_state(
    name: str, doc: str, labels: Mapping[str, str], counts: Mapping[str, float]
) -> GaugeMetricFamily:
    """One gauge, a sample for each state (the ``state`` label) beside ``labels``."""
    family = GaugeMetricFamily(name, doc, labels=[*labels, "state"])
    for state, count in counts.items():
        family.add_metric([*labels.values(), state], count)
    return family


def labelled(metrics: Iterable[Metric], labels: Mapping[str, str]) -> Iterator[Metric]:
    """``metrics`` with ``labels`` added to every sample: labels that hold for a whole
    exposition (the policy, the served model), added when it is written, so that what
    was observed before they were known is shown under them too."""
    for metric in metrics:
        out = Metric(metric.name, metric.documentation, metric.type, metric.unit)
        out.samples = [
            sample._replace(labels={**labels, **sample.labels}) for sample in metric.samples
        ]
        yield out
