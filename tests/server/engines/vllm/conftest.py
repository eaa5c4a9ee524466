"""The vLLM CPU environment for the real-engine tests, when one is given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment's python from ``$AGENTMARS_VLLM_PYTHON``; skips without it."""
    configured = os.environ.get("AGENTMARS_VLLM_PYTHON")
    if not configured:
        pytest.skip("needs the vLLM CPU env: AGENTMARS_VLLM_PYTHON=$(scripts/vllm-env.sh)")
    python = Path(configured)
    if not python.is_file():
        pytest.fail(f"AGENTMARS_VLLM_PYTHON={configured} is not a file")
    return python
