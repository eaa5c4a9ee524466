"""The small Python repository each replayed session works on: a package of plain
functions with their unit tests (standard library only, so the sandbox's Python runs
them), made from a seed, so a session's reads, greps, edits and test runs act on real
files.

``toolkit/numbers.py`` and ``toolkit/text.py`` hold ``FUNCTIONS`` functions each;
``tests/`` tests every one of them; an edit (``tools.EDIT_SCRIPT``) appends a function
and its test, so the suite keeps passing and grows with the session.
"""

from __future__ import annotations

import random
from pathlib import Path

PACKAGE = "toolkit"
FUNCTIONS = 24
"""Functions per module (ours: enough for a grep to find a screenful and a test run to
import and check something, small enough to write in a millisecond)."""
MODULES = ("numbers", "text")


def _numbers(rng: random.Random) -> tuple[str, str]:
    source, tests = ['"""Arithmetic helpers."""\n'], []
    for i in range(FUNCTIONS):
        factor, offset = rng.randrange(2, 9), rng.randrange(0, 50)
        source.append(
            f"\n\ndef scale_{i}(x: int) -> int:\n"
            f'    """x times {factor}, plus {offset}."""\n'
            f"    return x * {factor} + {offset}\n"
        )
        tests.append(
            f"    def test_scale_{i}(self) -> None:\n"
            f"        self.assertEqual(numbers.scale_{i}(3), {3 * factor + offset})\n"
        )
    return "".join(source), _test_module("numbers", tests)


def _text(rng: random.Random) -> tuple[str, str]:
    source, tests = ['"""String helpers."""\n'], []
    for i in range(FUNCTIONS):
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
        source.append(
            f"\n\ndef tag_{i}(text: str) -> str:\n"
            f'    """text with the tag {word!r} around it."""\n'
            f'    return "{word}:" + text + ":{word}"\n'
        )
        tests.append(
            f"    def test_tag_{i}(self) -> None:\n"
            f'        self.assertEqual(text.tag_{i}("x"), "{word}:x:{word}")\n'
        )
    return "".join(source), _test_module("text", tests)


def _test_module(module: str, tests: list[str]) -> str:
    header = (
        "import unittest\n\n"
        f"from {PACKAGE} import {module}\n\n\n"
        f"class Test{module.title()}(unittest.TestCase):\n"
    )
    return header + "\n".join(tests)


def write_repository(root: Path, seed: int) -> None:
    """Write the repository into ``root`` (an empty session workspace)."""
    rng = random.Random(seed)
    package, tests = root / PACKAGE, root / "tests"
    package.mkdir(parents=True)
    tests.mkdir()
    (package / "__init__.py").write_text('"""A small library the agent works on."""\n')
    (tests / "__init__.py").write_text("")
    for module, make in zip(MODULES, (_numbers, _text), strict=True):
        source, test = make(rng)
        (package / f"{module}.py").write_text(source)
        (tests / f"test_{module}.py").write_text(test)
    (root / "README.md").write_text(
        f"# {PACKAGE}\n\nRun the tests with `python3 -m unittest discover -s tests`.\n"
    )
