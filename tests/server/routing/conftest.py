"""The Ray Serve environment for the router's cluster test, when one is given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_python() -> Path:
    """The Ray env's python from ``$AGENTMARS_RAY_PYTHON``; skips without it."""
    configured = os.environ.get("AGENTMARS_RAY_PYTHON")
    if not configured:
        pytest.skip("needs the Ray Serve env: AGENTMARS_RAY_PYTHON=$(scripts/ray-env.sh)")
    python = Path(configured)
    if not python.is_file():
        pytest.fail(f"AGENTMARS_RAY_PYTHON={configured} is not a file")
    return python
