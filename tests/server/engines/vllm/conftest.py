"""The vLLM CPU environment for the real-engine tests, when one is given, and the vLLM
0.33 environment for the plugin's scheduler-level tests on 0.33."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.env_python import env_python


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment's python from ``$AGENTMARS_VLLM_PYTHON``; skips without it."""
    return env_python("AGENTMARS_VLLM_PYTHON", "vLLM CPU env", "scripts/vllm-env.sh")


@pytest.fixture(scope="session")
def vllm033_python() -> Path:
    """The vLLM 0.33 environment's python from ``$AGENTMARS_VLLM033_PYTHON`` (vLLM's
    scheduler, no engine: scripts/vllm033-env.sh); skips without it."""
    return env_python("AGENTMARS_VLLM033_PYTHON", "vLLM 0.33 env", "scripts/vllm033-env.sh")


@pytest.fixture(scope="session", params=["0.32", "0.33"], ids=["vllm0.32", "vllm0.33"])
def scheduler_vllm_python(request: pytest.FixtureRequest) -> Path:
    """The python of each vLLM series the plugin runs on at the scheduler level (vLLM's
    own ``Scheduler`` in-process, no model): the tests that take it run on both."""
    fixture = "vllm_python" if request.param == "0.32" else "vllm033_python"
    python: Path = request.getfixturevalue(fixture)
    return python
