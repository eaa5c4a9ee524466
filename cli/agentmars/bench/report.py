"""What every benchmark shares: percentiles, progress bars, the verdict, output."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

ProgressFn = Callable[[str, int, int], None]
"""Progress report: (phase, done, total)."""


def ignore_progress(phase: str, done: int, total: int) -> None:
    """Progress sink for callers that show none."""


def percentiles_us(samples_ns: list[int]) -> dict[str, float]:
    """p50 / p90 / p99 (nearest rank) and mean of nanosecond samples, in microseconds."""
    ordered = sorted(samples_ns)
    figures = {
        f"p{q}": ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] / 1000 for q in (50, 90, 99)
    }
    figures["mean"] = sum(ordered) / len(ordered) / 1000
    return figures


def verdict(passed: bool) -> str:
    return "[green]pass[/green]" if passed else "[red]FAIL[/red]"


class RichProgress:
    """Maps benchmark phases onto rich progress bars, one per phase."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase not in self._tasks:
            self._tasks[phase] = self._progress.add_task(phase, total=total)
        self._progress.update(self._tasks[phase], completed=done, total=total)


@contextlib.contextmanager
def progress_bars() -> Iterator[ProgressFn]:
    """Rich progress bars, one per phase, for the duration of the block."""
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console()) as progress:
        yield RichProgress(progress)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it,
    then renamed over it, so that a reader or a crash never finds half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_json(path: Path, results: dict[str, Any]) -> None:
    """The figures as indented JSON in ``path``, written atomically."""
    write_atomically(path, json.dumps(results, indent=2) + "\n")


def publish(table: Table, results: dict[str, Any], json_out: Path | None) -> dict[str, Any]:
    """Print the table and write the figures as JSON when asked."""
    Console().print(table)
    if json_out is not None:
        write_json(json_out, results)
    return results


def short_error(error: BaseException, limit: int = 300) -> str:
    """An exception as one short line (its type and message, at most ``limit``
    characters, the middle cut out): why a run failed, for a table and a JSON entry."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + " ... " + text[-(limit - head - 5) :]
