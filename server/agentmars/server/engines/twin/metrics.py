"""The twin's ``/metrics``: vLLM 0.32's series wherever the twin has the same figure —
their names, HELP texts, types, labels (``model_name``, ``engine``) and histogram
buckets, as ``vllm/v1/metrics/loggers.py`` defines them, so a dashboard made for vLLM
reads the twin unchanged — and ``agentmars_sim_*`` series for what only the modelled
block pool and step loop have.

As in vLLM: a call's first token is counted in ``vllm:time_to_first_token_seconds``
(from its arrival) and its prompt in ``vllm:prompt_tokens_total`` (cached tokens
included); each later token in ``vllm:inter_token_latency_seconds``; a call that
generated its last token in ``vllm:request_success_total{finished_reason}``,
``vllm:e2e_request_latency_seconds``, its phases' ``vllm:request_queue_time_seconds``
(arrival to first step), ``_prefill_time_`` (first step to first token),
``_decode_time_`` (first to last token) and ``_inference_time_seconds`` (first step to
last token), and its tokens' ``vllm:request_prompt_tokens`` and
``vllm:request_generation_tokens``; an aborted call in none of them. Each step's tokens
go to ``vllm:iteration_tokens_total``. A call that ends in a tool call finished with
``stop`` (the model's end of turn: its ``tool_calls`` is the API's reading of the
text).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agentmars.server.engines.twin.engine import CallObserver, CallTimes, LiveEngine
from agentmars.server.sim.entities import Call
from agentmars.server.web.prometheus import (
    INTER_TOKEN_LATENCY_BUCKETS,
    ITERATION_TOKENS_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    by_state,
    request_tokens_buckets,
)

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's ``FinishReason`` names: every one has a ``vllm:request_success_total`` series."""
ENGINE_LABELS = ["model_name", "engine"]


class TwinMetrics(CallObserver):
    """The twin engine's registry: histograms and counters observed as calls run
    (the engine's ``observer``), gauges and totals read off the engine when scraped."""

    def __init__(self, engine: LiveEngine, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model, "engine": "0"}

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, doc, ENGINE_LABELS, buckets=buckets, registry=self.registry)
            return metric.labels(**labels)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.phases = {
            phase: histogram(
                f"vllm:request_{phase}_time_seconds",
                f"Histogram of time spent in {state} phase for request.",
                REQUEST_LATENCY_BUCKETS,
            )
            for phase, state in (
                ("queue", "WAITING"),
                ("inference", "RUNNING"),
                ("prefill", "PREFILL"),
                ("decode", "DECODE"),
            )
        }
        request_tokens = request_tokens_buckets(engine.profile.max_model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", request_tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            request_tokens,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        prompt = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", ENGINE_LABELS,
            registry=self.registry,
        )  # fmt: skip
        self.prompt_tokens = prompt.labels(**labels)
        success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            [*ENGINE_LABELS, "finished_reason"], registry=self.registry,
        )  # fmt: skip
        self.success = {
            reason: success.labels(**labels, finished_reason=reason) for reason in FINISH_REASONS
        }
        self.registry.register(EngineCollector(engine, model))
        engine.observer = self

    def first_token(self, call: Call, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(call.prompt_tokens)

    def next_token(self, call: Call, itl_s: float) -> None:
        self.itl.observe(itl_s)

    def stepped(self, tokens: int) -> None:
        self.iteration_tokens.observe(tokens)

    def finished(self, call: Call, finish_reason: str, times: CallTimes) -> None:
        reason = "stop" if finish_reason == "tool_calls" else finish_reason
        self.success[reason].inc()
        self.e2e.observe(times.e2e_s)
        self.phases["queue"].observe(times.queue_s)
        self.phases["inference"].observe(times.inference_s)
        self.phases["prefill"].observe(times.prefill_s)
        self.phases["decode"].observe(times.decode_s)
        self.request_prompt_tokens.observe(call.prompt_tokens)
        self.request_generation_tokens.observe(call.output_tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class EngineCollector(Collector):
    """The engine's figures read when scraped."""

    def __init__(self, engine: LiveEngine, model: str) -> None:
        self.engine = engine
        self.model = model

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        vllm = {"model_name": self.model, "engine": "0"}
        sim = {"model_name": self.model}
        kv = engine.kv_stats()
        counters = engine.counters
        yield _one(
            GaugeMetricFamily, "vllm:num_requests_running",
            "Number of requests in model execution batches.", vllm, len(engine.running),
        )  # fmt: skip
        yield _one(
            GaugeMetricFamily, "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.", vllm, len(engine.waiting),
        )  # fmt: skip
        yield _one(
            GaugeMetricFamily, "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.", vllm, kv.used_blocks / kv.total_blocks,
        )  # fmt: skip
        yield _one(
            CounterMetricFamily, "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.", vllm,
            engine.scheduler.prefix_queries,
        )  # fmt: skip
        yield _one(
            CounterMetricFamily, "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.", vllm,
            engine.scheduler.prefix_hits,
        )  # fmt: skip
        yield _one(
            CounterMetricFamily, "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.", vllm, counters.preemptions,
        )  # fmt: skip
        yield _one(
            CounterMetricFamily, "vllm:generation_tokens",
            "Number of generation tokens processed.", vllm, counters.generation_tokens,
        )  # fmt: skip
        profile = engine.profile
        config = {
            "block_size": str(profile.block_size),
            "num_gpu_blocks": str(profile.num_gpu_blocks),
        }
        yield _one(
            GaugeMetricFamily, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            {**config, "engine": "0"}, 1,
        )  # fmt: skip
        for name, doc, value in (
            ("prefill_tokens", "Prompt tokens computed in prefill (recomputation included)",
             counters.prompt_tokens),
            ("steps", "Engine steps run", counters.steps),
            ("requests_finished", "Calls that generated their last token", counters.finished),
            ("requests_aborted", "Calls aborted", counters.aborted),
            ("evicted_blocks", "KV blocks evicted from the prefix cache", counters.evicted_blocks),
        ):  # fmt: skip
            yield _one(CounterMetricFamily, f"agentmars_sim_{name}", doc, sim, value)
        pinned = kv.pinned_blocks
        used = kv.total_blocks - kv.free_blocks - pinned
        yield by_state(
            "agentmars_sim_kv_blocks",
            "KV blocks by state (used excludes pinned; they add up to the pool)",
            sim,
            {"free": kv.free_blocks, "used": used, "pinned": pinned},
        )
        yield _one(
            GaugeMetricFamily, "agentmars_sim_kv_pinned_sessions", "Sessions holding pinned KV",
            sim, kv.pins,
        )  # fmt: skip
        yield by_state(
            "agentmars_sim_tool_calls",
            "Tool calls by state, as the engine follows them from the stream",
            sim,
            {"queued": engine.queued_tools, "running": engine.active_tools},
        )


def _one(
    kind: type[GaugeMetricFamily | CounterMetricFamily],
    name: str,
    doc: str,
    labels: Mapping[str, str],
    value: float,
) -> Metric:
    family = kind(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family
