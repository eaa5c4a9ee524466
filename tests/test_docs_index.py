"""docs/README.md, the index of the docs, names every doc and only docs that exist."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_index_lists_every_doc() -> None:
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w./-]+\.md)\)", index))
    docs = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")} - {"README.md"}
    assert sorted(docs - linked) == [], "docs missing from docs/README.md"
    assert sorted(linked - docs) == [], "docs/README.md links docs that do not exist"
