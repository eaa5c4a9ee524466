"""Each part imports in a fresh interpreter without loading what it must not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = [
    "fastapi",
    "uvicorn",
    "litellm",
    "openai",
    "opentelemetry",
    "vllm",
    "torch",
    "httpx",
    "matplotlib",
]


def _loaded_after(statement: str) -> dict[str, object]:
    probe = (
        "import sys, time, json\n"
        "t = time.process_time()\n"
        f"{statement}\n"
        "took = time.process_time() - t\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps({'took': took, 'loaded': [m for m in heavy if m in sys.modules]}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("statement", "allowed"),
    [
        ("import agentmars.sdk", set()),
        ("from agentmars.sdk.sinks import MemorySink, JsonlSink", set()),
        ("import agentmars.sdk.sinks.http", {"httpx"}),
        ("import agentmars.sdk.integrations.openai", {"openai", "httpx"}),
        ("import agentmars.cli.main", set()),
        # The policies and the simulator also install into the vLLM environment.
        ("import agentmars.server.sim.sweep", set()),
        ("import agentmars.server.engines.twin.engine", set()),  # the web layer is live_app's
        ("from agentmars.server.policies.registry import policy_names; policy_names()", set()),
    ],
)
def test_part_loads_only_what_it_needs(statement: str, allowed: set[str]) -> None:
    result = _loaded_after(statement)
    assert set(result["loaded"]) <= allowed, f"{statement} loaded {result['loaded']}"


def test_sdk_import_is_fast() -> None:
    # A budget, not a benchmark: the SDK sits in every agent process. In CPU time, which
    # other work on the host does not stretch as it does the wall clock.
    assert _loaded_after("import agentmars.sdk")["took"] < 1.0


def test_cli_help_does_not_load_parts() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "agentmars.cli.main", "--help"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    imported = done.stderr
    for heavy in ("fastapi", "litellm", "openai", "uvicorn"):
        assert f" {heavy}\n" not in imported and f" {heavy}." not in imported
    assert "demo" in done.stdout and "bench" in done.stdout
