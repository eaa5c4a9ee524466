"""The replayed sessions' repository: made from a seed, its suite passes with the
system's Python (the sandbox's), and an edit grows it by one passing test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from agentmars.runtime.replay.repository import FUNCTIONS, write_repository
from agentmars.runtime.replay.tools import EDIT_SCRIPT

SYSTEM_PYTHON = "/usr/bin/python3"
needs_system_python = pytest.mark.skipif(
    not Path(SYSTEM_PYTHON).exists(), reason="the sandbox's Python is the system's"
)

FILES = {
    "README.md",
    "toolkit/__init__.py",
    "toolkit/numbers.py",
    "toolkit/text.py",
    "tests/__init__.py",
    "tests/test_numbers.py",
    "tests/test_text.py",
}


def _contents(root: Path) -> dict[str, str]:
    return {
        path.relative_to(root).as_posix(): path.read_text()
        for path in root.rglob("*")
        if path.is_file()
    }


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SYSTEM_PYTHON, *args], cwd=repo, capture_output=True, text=True, timeout=60, check=False
    )


def _unittest(repo: Path) -> tuple[int, int]:
    """(exit status, tests run) of the repository's suite."""
    done = _run(repo, "-m", "unittest", "discover", "-s", "tests", "-q")
    ran = re.search(r"^Ran (\d+) tests?", done.stderr, re.MULTILINE)
    assert ran is not None, done.stderr
    return done.returncode, int(ran.group(1))


def test_the_repository_is_the_same_for_a_seed(tmp_path: Path) -> None:
    write_repository(tmp_path / "a", 11)
    write_repository(tmp_path / "b", 11)
    first = _contents(tmp_path / "a")
    assert set(first) == FILES
    assert first == _contents(tmp_path / "b")
    assert first["toolkit/numbers.py"].count("\ndef scale_") == FUNCTIONS
    assert first["toolkit/text.py"].count("\ndef tag_") == FUNCTIONS


def test_seeds_give_different_repositories(tmp_path: Path) -> None:
    write_repository(tmp_path / "a", 1)
    write_repository(tmp_path / "b", 2)
    first, second = _contents(tmp_path / "a"), _contents(tmp_path / "b")
    assert first["toolkit/numbers.py"] != second["toolkit/numbers.py"]
    assert first["toolkit/text.py"] != second["toolkit/text.py"]
    assert first["tests/test_text.py"] != second["tests/test_text.py"]


@needs_system_python
def test_the_suite_passes_with_the_system_python(tmp_path: Path) -> None:
    write_repository(tmp_path, 5)
    assert _unittest(tmp_path) == (0, 2 * FUNCTIONS)


@needs_system_python
def test_an_edit_adds_a_function_and_a_passing_test(tmp_path: Path) -> None:
    write_repository(tmp_path, 5)
    edited = _run(tmp_path, "-c", EDIT_SCRIPT, "5")
    assert edited.returncode == 0, edited.stderr
    assert "def added_5(x: int) -> int:" in (tmp_path / "toolkit/numbers.py").read_text()
    assert "def test_added_5(self)" in (tmp_path / "tests/test_numbers.py").read_text()
    assert _unittest(tmp_path) == (0, 2 * FUNCTIONS + 1)
    checked = _run(tmp_path, "-c", "from toolkit import numbers; print(numbers.added_5(1))")
    assert checked.stdout.strip() == "6"
