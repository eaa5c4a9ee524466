"""What the benchmarks that run vLLM share: finding the vLLM environment's python."""

from __future__ import annotations

import os
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
