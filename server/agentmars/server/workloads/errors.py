"""The one error a workload file or trace fails with."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError


class WorkloadError(ValueError):
    """A workload file or trace that cannot be read. The message names the file, the
    line and, where there is one, the field."""


def error_at(path: Path, line: int, message: str) -> WorkloadError:
    return WorkloadError(f"{path}:{line}: {message}")


def invalid_at(path: Path, line: int, error: ValidationError) -> WorkloadError:
    """The first problem pydantic found on a line, with the dotted path of its field
    (e.g. ``turns.2.append_tokens``)."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    more = error.error_count() - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return error_at(path, line, f"{field}: {message}{suffix}" if field else message + suffix)
