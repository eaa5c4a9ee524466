"""``agentmars events``: read JSONL event files, reporting bad lines instead of failing."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from agentmars.cli.render import event_table
from agentmars.sdk.events import DecodedStream, decode_jsonl

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def _read(path: Path) -> DecodedStream | None:
    try:
        return decode_jsonl(path.read_bytes())
    except OSError as exc:
        err_console.print(f"[red]cannot read {path}: {exc.strerror}[/]")
        return None


def _report(path: Path, stream: DecodedStream) -> None:
    for error in stream.errors:
        err_console.print(f"[red]{path}:{error.line}:[/] {error.error}", highlight=False)
    if stream.unknown_versions:
        err_console.print(
            f"[yellow]{len(stream.unknown_versions)} line(s) use an event schema version "
            "this agentmars does not read[/]"
        )


def validate(path: Path) -> int:
    stream = _read(path)
    if stream is None:
        return 2
    _report(path, stream)
    console.print(f"{path}: {len(stream.events)} valid event(s), {len(stream.errors)} bad line(s)")
    return 1 if stream.errors else 0


def show(path: Path) -> int:
    stream = _read(path)
    if stream is None:
        return 2
    console.print(event_table(stream.events))
    _report(path, stream)
    return 1 if stream.errors else 0
