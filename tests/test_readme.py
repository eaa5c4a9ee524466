"""The README's SDK snippet names only what the SDK has."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from agentmars import sdk

README = Path(__file__).resolve().parents[1] / "README.md"


def _sdk_snippet() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## The SDK in three lines", 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_every_sdk_name_in_the_readme_snippet_exists() -> None:
    snippet = _sdk_snippet()
    names = set(re.findall(r"(?<![\w.])sdk\.([A-Za-z_]\w*)", snippet))
    assert {"configure", "JsonlSink", "MemorySink", "HttpSink", "OTelSink"} <= names
    assert [name for name in sorted(names) if not hasattr(sdk, name)] == []
    for module, imported in re.findall(r"^from (agentmars[\w.]*) import (\w+)", snippet, re.M):
        assert hasattr(importlib.import_module(module), imported), f"{module}.{imported}"
