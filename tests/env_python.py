"""The python of an environment the project builds outside the clone (the vLLM CPU,
OpenHands-app and Ray Serve envs), named by the variable ``make test`` sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def env_python(variable: str, what: str, script: str) -> Path:
    """``$variable`` as a path; the test is skipped without it (its env was not built)
    and fails if it names no file."""
    configured = os.environ.get(variable)
    if not configured:
        pytest.skip(f"needs the {what}: {variable}=$({script})")
    python = Path(configured)
    if not python.is_file():
        pytest.fail(f"{variable}={configured} is not a file")
    return python
