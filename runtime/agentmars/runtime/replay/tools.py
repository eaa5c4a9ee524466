"""A workload's tool call as a real command in the session's sandbox.

The action follows the tool's kind (``workloads.tool_kinds.canonical_kind``): a read
shows a module, a search greps the package, an edit appends a function and its test
(``EDIT_SCRIPT``), a test run or a bash command runs the repository's tests, a build
byte-compiles it; a tool that waits off the host (an API, the web, a human) has none.
``pad.py`` then brings the call to the tool's size: its CPU demand (``cpu_s``, over
``ceil(cores)`` processes) and its duration (``wall_s``), both times ``scale``. So the
host's CPUs see the work the workload describes, on the files of a real repository.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from agentmars.runtime.replay.repository import PACKAGE
from agentmars.sandbox.spec import ExecSpec
from agentmars.server.workloads.model import ToolSpec
from agentmars.server.workloads.tool_kinds import canonical_kind

PYTHON = "python3"
"""The sandbox's Python (the system's: the sandbox sees /usr, not the project's venv)."""
TIMEOUT_MARGIN_S = 60.0
"""A tool is killed this long past its size: a stuck one fails its session, not the run."""
UNITTEST = [PYTHON, "-m", "unittest", "discover", "-s", "tests", "-q"]

EDIT_SCRIPT = f"""
import sys
n = int(sys.argv[1])
with open("{PACKAGE}/numbers.py", "a") as module:
    module.write(f"\\n\\ndef added_{{n}}(x: int) -> int:\\n    return x + {{n}}\\n")
with open("tests/test_numbers.py", "a") as tests:
    tests.write(f"\\n    def test_added_{{n}}(self) -> None:\\n"
                f"        self.assertEqual(numbers.added_{{n}}(1), {{n + 1}})\\n")
"""
"""Appends ``added_<turn>`` to the package and its test to the suite."""


def action(kind: str, turn: int) -> list[str]:
    """The real command a tool of ``kind`` runs on the session's repository (empty: a
    tool that only waits)."""
    canonical = canonical_kind(kind)
    if canonical == "read":
        return ["cat", f"{PACKAGE}/text.py"]
    if canonical == "search":
        return ["grep", "-rn", "return", PACKAGE, "tests"]
    if canonical == "edit":
        return [PYTHON, "-c", EDIT_SCRIPT, str(turn)]
    if canonical in ("test", "test-suite", "bash"):
        return UNITTEST
    if canonical == "build":
        return [PYTHON, "-m", "compileall", "-q", PACKAGE]
    if canonical in ("math", "ve", "env"):
        return [PYTHON, "-c", "import toolkit.numbers as n; print(n.scale_0(7))"]
    return []


@cache
def _pad_source() -> str:
    return Path(__file__).with_name("pad.py").read_text(encoding="utf-8")


def tool_exec(tool: ToolSpec, turn: int, *, scale: float = 1.0) -> ExecSpec:
    """The sandbox command replaying ``tool`` (the call after turn ``turn``)."""
    wall_s, cpu_s = tool.wall_s * scale, tool.cpu_s * scale
    processes = max(math.ceil(tool.cores), 1)
    command = [PYTHON, "-c", _pad_source(), f"{wall_s:.6f}", f"{cpu_s:.6f}", str(processes)]
    if steps := action(tool.kind, turn):
        command += ["--", *steps]
    return ExecSpec(command=command, timeout_s=wall_s + TIMEOUT_MARGIN_S)


@dataclass(frozen=True)
class ToolCost:
    """What a replayed tool call costs the host beyond the tool's figures, measured on
    the host (``agentmars bench replay`` runs empty calls through the pool first): the
    sandbox's start with the padding's interpreter (``start``), and per tool kind an
    empty call of that kind, its action included (``by_kind``). Each is (wall s, CPU s).
    The simulator's prediction of a replay applies it to every tool: on a host whose
    tool cores are near saturation (the demo's one), a tenth of a second per call moves
    the queueing a lot."""

    start: tuple[float, float] = (0.0, 0.0)
    by_kind: dict[str, tuple[float, float]] = field(default_factory=dict)

    def apply(self, tool: ToolSpec) -> ToolSpec:
        """``tool`` as the host runs it: the start, then the action or the padding to
        the tool's size, whichever is longer (``pad.py`` counts the action's CPU in the
        tool's; a tool whose kind was not measured pays the start only)."""
        start_wall, start_cpu = self.start
        wall, cpu = self.by_kind.get(canonical_kind(tool.kind), self.start)
        return tool.model_copy(
            update={
                "wall_s": start_wall + max(tool.wall_s, wall - start_wall),
                "cpu_s": start_cpu + max(tool.cpu_s, cpu - start_cpu),
            }
        )
