"""Loading and saving workloads.

Our format (``agentmars``) is JSON lines: line 1 is a header object with the
``Workload`` fields except ``sessions`` (name, seed, arrival, concurrency), then one
``SessionSpec`` object a line. ``load_workload`` also reads TraceLab round traces
and Mooncake request traces (``importers.py``; gzip-compressed when the name ends
in .gz). docs/workloads.md describes the formats.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from itertools import chain
from pathlib import Path

from agentmars.server.workloads.errors import WorkloadError, error_at
from agentmars.server.workloads.importers import (
    Row,
    from_agentmars,
    from_mooncake,
    from_tracelab,
    read_rows,
)
from agentmars.server.workloads.model import Workload

__all__ = ["FORMATS", "WorkloadError", "load_workload", "save_workload"]

IMPORTERS: dict[str, Callable[[Path, Iterable[Row]], Workload]] = {
    "agentmars": from_agentmars,
    "tracelab": from_tracelab,
    "mooncake": from_mooncake,
}
FORMATS = ("auto", *IMPORTERS)


def load_workload(path: Path, format: str = "auto") -> Workload:
    """The workload in ``path``; ``format`` is one of ``FORMATS`` ("auto": told from
    the first line). Raises ``WorkloadError`` naming the file, line and field of the
    first problem."""
    if format not in FORMATS:
        raise WorkloadError(
            f"unknown workload format {format!r}; expected one of {', '.join(FORMATS)}"
        )
    rows = read_rows(path)
    first = next(rows)
    chosen = detect_format(path, first) if format == "auto" else format
    return IMPORTERS[chosen](path, chain([first], rows))


def detect_format(path: Path, first: Row) -> str:
    line, value = first
    if {"hash_ids", "input_length"} <= value.keys():
        return "mooncake"
    if {"session_id", "round_index"} <= value.keys():
        return "tracelab"
    if "name" in value and "turns" not in value:
        return "agentmars"
    raise error_at(
        path,
        line,
        f"cannot tell the format from this line (keys: "
        f"{', '.join(sorted(value)) or 'none'}); pass one of "
        f"{', '.join(IMPORTERS)}",
    )


def save_workload(workload: Workload, path: Path) -> None:
    """Write ``workload`` in our format, atomically: into a temporary file next to
    ``path``, then renamed over it, so a reader never sees half a file."""
    header = workload.model_dump_json(exclude={"sessions"})
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(header + "\n")
            for session in workload.sessions:
                out.write(session.model_dump_json(exclude_defaults=True) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
