"""The twin's ``/metrics`` as a Prometheus client parses it: every family typed and
documented, vLLM's standard series under vLLM's labels, and figures that follow the
calls the twin served (how vLLM's own definitions compare:
``tests/server/engines/vllm/test_twin_series_match_vllm.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import FittedCost, load_profile
from agentmars.server.web.serving import serve_in_thread
from tests.server.engines.twin.conftest import MODEL

VLLM_SERIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:cache_config_info": "gauge",
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "fix the bug"}]


@pytest.fixture
def twin_url() -> Iterator[str]:
    """A fresh twin (its counters start at zero) with steps of 1 ms."""
    profile = load_profile(MODEL).model_copy(
        update={"cost": FittedCost(c0=1e-3, c1=0.0, c2=0.0, c3=0.0, c4=0.0)}
    )
    with serve_in_thread(create_live_app(LiveEngine(profile, make_policy("fcfs")))) as url:
        yield url


def _families(url: str) -> dict[str, Any]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    families = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"{family.name} written twice"
        families[family.name] = family
    return families


def _samples(url: str, name: str) -> list[Sample]:
    """The samples whose name is ``name``."""
    return [s for f in _families(url).values() for s in f.samples if s.name == name]


def _value(url: str, name: str, **labels: str) -> float:
    (sample,) = [s for s in _samples(url, name) if labels.items() <= s.labels.items()]
    return sample.value


def test_every_family_is_typed_and_documented_with_vllms_labels(twin_url: str) -> None:
    families = _families(twin_url)
    for name, family in families.items():
        assert family.documentation, f"{name} has no HELP"
        assert family.type in ("gauge", "counter", "histogram"), (name, family.type)
    for name, kind in VLLM_SERIES.items():
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert sample.labels["engine"] == "0", sample
            if name != "vllm:cache_config_info":
                assert sample.labels["model_name"] == MODEL, sample
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert {"stop", "length", "abort", "error", "repetition"} <= reasons
    states = {s.labels["state"]: s.value for s in families["agentmars_sim_kv_blocks"].samples}
    assert states == {"free": 512, "used": 0, "pinned": 0}


def test_the_series_follow_the_calls_served(twin_url: str) -> None:
    client = openai.OpenAI(base_url=f"{twin_url}/v1", api_key="unused", max_retries=0)
    usages = []
    for _ in range(3):  # each runs to max_tokens: "length"
        chunks = client.completions.create(
            model=MODEL,
            prompt="hello there",
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages.append(next(c.usage for c in chunks if c.usage))
    # A stop string, and a tool call: both "stop" in vLLM's terms.
    stopped = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stop=["sit am"], max_tokens=20
    )
    assert stopped.choices[0].finish_reason == "stop"
    tool = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=200
    )
    assert tool.choices[0].finish_reason == "tool_calls"
    usages += [stopped.usage, tool.usage]
    assert all(usage is not None for usage in usages)
    calls = len(usages)
    output = sum(u.completion_tokens for u in usages if u is not None)
    prompt = sum(u.prompt_tokens for u in usages if u is not None)

    assert _value(twin_url, "vllm:time_to_first_token_seconds_count") == calls
    assert _value(twin_url, "vllm:e2e_request_latency_seconds_count") == calls
    # One inter-token latency per token after each call's first.
    assert _value(twin_url, "vllm:inter_token_latency_seconds_count") == output - calls
    assert _value(twin_url, "vllm:request_success_total", finished_reason="length") == 3
    assert _value(twin_url, "vllm:request_success_total", finished_reason="stop") == 2
    assert _value(twin_url, "vllm:request_success_total", finished_reason="abort") == 0
    assert _value(twin_url, "vllm:prompt_tokens_total") == prompt
    assert _value(twin_url, "vllm:generation_tokens_total") == output
    ttft = _value(twin_url, "vllm:time_to_first_token_seconds_sum")
    assert 0 < ttft < _value(twin_url, "vllm:e2e_request_latency_seconds_sum")
    # A call lasts at least its modelled steps: 1 ms each, one a token.
    assert _value(twin_url, "vllm:e2e_request_latency_seconds_sum") >= output * 1e-3
    buckets = _samples(twin_url, "vllm:e2e_request_latency_seconds_bucket")
    assert [s.value for s in buckets if s.labels["le"] == "+Inf"] == [calls]
    # Each call's phases, as vLLM splits them: waiting, then prefill and decode, which
    # make up its running time; with the queue they make up its latency.
    phases = {
        phase: _value(twin_url, f"vllm:request_{phase}_time_seconds_sum")
        for phase in ("queue", "prefill", "decode", "inference")
    }
    for phase in phases:
        assert _value(twin_url, f"vllm:request_{phase}_time_seconds_count") == calls, phase
    assert phases["inference"] == pytest.approx(phases["prefill"] + phases["decode"])
    e2e = _value(twin_url, "vllm:e2e_request_latency_seconds_sum")
    assert phases["queue"] + phases["inference"] == pytest.approx(e2e)
    assert phases["decode"] >= (output - calls) * 1e-3  # a step a token after the first
    assert _value(twin_url, "vllm:request_prompt_tokens_sum") == prompt
    assert _value(twin_url, "vllm:request_generation_tokens_sum") == output
    prompt_buckets = _samples(twin_url, "vllm:request_prompt_tokens_bucket")
    assert [s.labels["le"] for s in prompt_buckets][:4] == ["1.0", "2.0", "5.0", "10.0"]
    # Every step's tokens: the prompts' (nothing cached here: less than a block each),
    # whose last step samples the first token, then one a step for each later token.
    assert _value(twin_url, "vllm:iteration_tokens_total_sum") == prompt + output - calls


def test_an_aborted_call_is_no_success(twin_url: str) -> None:
    body = {"model": MODEL, "prompt": "q" * 400, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{twin_url}/v1/completions", json=body) as response:
        next(response.iter_lines())  # the call runs; leave without reading on
    deadline = time.monotonic() + 5
    while _value(twin_url, "agentmars_sim_requests_aborted_total") < 1:
        assert time.monotonic() < deadline, "the call was not aborted"
        time.sleep(0.02)
    assert _value(twin_url, "vllm:e2e_request_latency_seconds_count") == 0
    assert sum(s.value for s in _samples(twin_url, "vllm:request_success_total")) == 0
    assert _value(twin_url, "vllm:num_requests_running") == 0
