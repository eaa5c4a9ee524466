"""Debian's chromium (scripts/apt-packages.txt), headless, driven by Playwright: the
dashboard's browser test and its screenshots use it. Never a browser Playwright
downloads; each launch gets a fresh profile (Playwright's own temporary
``--user-data-dir``), removed when the browser closes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",  # as root, chromium refuses to start with its sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # the machine is offline: no update or sync calls
    "--disable-component-update",
    "--disable-sync",
]
MISSING = f"needs Debian's chromium at {CHROMIUM} (scripts/apt-packages.txt installs it)"


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless chromium, closed when the block ends."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def shown(page: Page) -> dict[str, str]:
    """The text the dashboard shows in each of its fields (``data-field``: a path into
    the snapshot, ``sessions.engine``)."""
    fields: dict[str, str] = page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll("[data-field]")]
            .map((node) => [node.dataset.field, node.textContent]))"""
    )
    return fields
