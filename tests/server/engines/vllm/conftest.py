"""The vLLM CPU environment for the real-engine tests, when one is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.env_python import env_python


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment's python from ``$AGENTMARS_VLLM_PYTHON``; skips without it."""
    return env_python("AGENTMARS_VLLM_PYTHON", "vLLM CPU env", "scripts/vllm-env.sh")
