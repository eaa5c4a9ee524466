"""The twin's ``vllm:*`` series are vLLM's own, as vLLM's source defines them: the
same type, HELP text, labels and histogram buckets (read in the vLLM environment from
``vllm/v1/metrics/loggers.py`` and ``buckets.py``), so a dashboard made for vLLM reads
the twin unchanged."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.web.serving import serve_in_thread

READ_VLLM = """
import ast, json, pathlib, sys
from vllm.v1.metrics import buckets
source = pathlib.Path(buckets.__file__).with_name("loggers.py").read_text()
kinds = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
series = {}
for node in ast.walk(ast.parse(source)):
    if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) in kinds):
        continue
    given = {keyword.arg: keyword.value for keyword in node.keywords}
    name = given.get("name")
    if not (isinstance(name, ast.Constant) and str(name.value).startswith("vllm:")):
        continue
    labels = given.get("labelnames")
    extra = labels.right.elts if isinstance(labels, ast.BinOp) else []
    family = given.get("buckets")
    series[name.value] = {
        "type": kinds[node.func.attr],
        "help": ast.literal_eval(given["documentation"]),
        "extra_labels": [label.value for label in extra],
        "buckets": family.id.removesuffix("_buckets") if family is not None else None,
    }
families = ("request_latency", "time_to_first_token", "inter_token_latency", "iteration_tokens")
found = {family: buckets.histogram_buckets(family) for family in families}
# The token counts' buckets go up to the context (argv[1]: the twin's).
context = int(sys.argv[1])
found["request_tokens"] = buckets.histogram_buckets("request_tokens", max_model_len=context)
print(json.dumps({"series": series, "buckets": found}))
"""
PROFILE = "cpu-tiny"


@pytest.fixture(scope="module")
def vllm_series(vllm_python: Path) -> dict[str, Any]:
    context = str(load_profile(PROFILE).max_model_len)
    done = subprocess.run(
        [str(vllm_python), "-c", READ_VLLM, context], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    read: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return read


@pytest.fixture
def twin_families() -> Iterator[dict[str, Any]]:
    engine = LiveEngine(load_profile(PROFILE), make_policy("fcfs"))
    with serve_in_thread(create_live_app(engine)) as url:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    yield {family.name: family for family in text_string_to_metric_families(text)}


def test_the_twins_vllm_series_are_defined_as_vllm_defines_them(
    vllm_series: dict[str, Any], twin_families: dict[str, Any]
) -> None:
    defined = vllm_series["series"]
    # *_created: prometheus_client's creation times, in vLLM's exposition too.
    ours = [n for n in twin_families if n.startswith("vllm:") and not n.endswith("_created")]
    ours.remove("vllm:cache_config_info")  # vLLM's info gauge: labels of its own
    assert len(ours) >= 12
    for name in ours:
        family, vllm = twin_families[name], defined[name]
        assert (family.type, family.documentation) == (vllm["type"], vllm["help"]), name
        labels = {"model_name", "engine", *vllm["extra_labels"]}
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample)
        if vllm["buckets"] is not None:
            bounds = [float(s.labels["le"]) for s in family.samples if "le" in s.labels]
            assert bounds == [*vllm_series["buckets"][vllm["buckets"]], float("inf")], name
