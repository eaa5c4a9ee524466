"""The Ray Serve environment for the router's cluster test, when one is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.env_python import env_python


@pytest.fixture(scope="session")
def ray_python() -> Path:
    """The Ray env's python from ``$AGENTMARS_RAY_PYTHON``; skips without it."""
    return env_python("AGENTMARS_RAY_PYTHON", "Ray Serve env", "scripts/ray-env.sh")
