"""The runtime in the OpenHands application's environment (openhands-ai 1.11, built on
openhands-sdk 1.34, ``scripts/openhands-env.sh``): a scripted conversation runs there on
AgentmarsRuntime, its terminal commands pinned in the sandbox, state and exit codes kept
(``app_conversation.py``, run with that environment's Python)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.env_python import env_python

SCRIPT = Path(__file__).with_name("app_conversation.py")


@pytest.fixture(scope="module")
def app_python() -> Path:
    """The application environment's python from ``$AGENTMARS_OPENHANDS_PYTHON``."""
    return env_python("AGENTMARS_OPENHANDS_PYTHON", "OpenHands app env", "scripts/openhands-env.sh")


@pytest.mark.slow
def test_a_conversation_of_the_openhands_app_runs_on_agentmars(
    app_python: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [str(app_python), str(SCRIPT), str(tmp_path / "ws")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["sdk"].startswith("1.34."), seen["sdk"]
    assert seen["status"] == "finished"
    first, second = seen["observations"]
    lines = first["text"].split()
    assert lines[:2] == ["Cpus_allowed_list:", str(seen["core"])]
    assert lines[2].startswith("pid:[") and lines[2] != seen["host_pid_namespace"]
    assert first["exit_code"] == 0
    assert second == {"text": seen["workspace"] + "/sub\n", "exit_code": 3}
    assert seen["tools"] == [["terminal", 0, True], ["terminal", 1, True]]
