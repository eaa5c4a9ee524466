"""What the benchmarks that run vLLM share: finding the vLLM environment's python and
the tiny model."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

VLLM_PYTHON_ENV = "AGENTMARS_VLLM_PYTHON"


class BenchSetupError(ValueError):
    """A benchmark cannot run as asked; the message says what to change."""


def find_vllm_python(given: Path | None) -> Path:
    """``given``, else ``$AGENTMARS_VLLM_PYTHON``; it must be a file."""
    python = given or Path(os.environ.get(VLLM_PYTHON_ENV) or "")
    if str(python) in ("", "."):
        raise BenchSetupError(
            f"give --vllm-python or ${VLLM_PYTHON_ENV} (scripts/vllm-env.sh prints it)"
        )
    if not python.is_file():
        raise BenchSetupError(
            f"the vLLM python {python} does not exist; make it with scripts/vllm-env.sh"
        )
    return python


def tiny_model(python: Path) -> Path:
    """The tiny model's directory (made in the vLLM environment if need be)."""
    done = subprocess.run(
        [str(python), "-m", "agentmars.server.engines.vllm.tiny_model"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the tiny model could not be made: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])
