"""How events look on a terminal: one short line of the fields that matter."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from agentmars.sdk.events import Event

_HIDDEN = {"v", "kind", "event_id", "mono_ns", "wall_ns", "source", "session_id", "call_id", "turn"}


def details(event: Event) -> str:
    fields = event.model_dump(exclude_none=True, exclude=_HIDDEN)
    return " ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
        for k, v in fields.items()
        if v not in ({}, False, "")
    )


def event_table(events: Sequence[Event], *, t0_ns: int | None = None) -> Table:
    table = Table(show_lines=False, header_style="bold")
    for column in ("t+ms", "kind", "session", "turn", "call", "details"):
        table.add_column(column)
    start = t0_ns if t0_ns is not None else min((e.mono_ns for e in events), default=0)
    for event in events:
        table.add_row(
            f"{(event.mono_ns - start) / 1e6:8.1f}",
            event.kind,
            str(getattr(event, "session_id", "-"))[:8],
            str(getattr(event, "turn", "") if getattr(event, "turn", None) is not None else ""),
            str(getattr(event, "call_id", "") or "")[:8],
            details(event),
        )
    return table
