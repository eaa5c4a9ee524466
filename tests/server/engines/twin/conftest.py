"""A quick twin on loopback for the tests of what its answers say (tool calls, stop,
response formats): the OpenAI client pointed at it, and its base URL."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import FittedCost, load_profile
from agentmars.server.web.serving import serve_in_thread

MODEL = "cpu-tiny"


@pytest.fixture(scope="module")
def twin_url() -> Iterator[str]:
    """cpu-tiny with steps of 0.1 ms: a call of a few tokens takes about a millisecond."""
    profile = load_profile(MODEL).model_copy(
        update={"cost": FittedCost(c0=1e-4, c1=0.0, c2=0.0, c3=0.0, c4=0.0)}
    )
    with serve_in_thread(create_live_app(LiveEngine(profile, make_policy("fcfs")))) as url:
        yield url


@pytest.fixture(scope="module")
def twin(twin_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{twin_url}/v1", api_key="unused", max_retries=0)


def scrape(client: httpx.Client) -> dict[str, float]:
    """The twin's ``/metrics`` samples by name, a state's as ``name[state]``."""
    text = client.get("/metrics").text
    return {
        sample.name + (f"[{sample.labels['state']}]" if "state" in sample.labels else ""): (
            sample.value
        )
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
