"""``agentmars``: one command, a sub-command per part."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="agentmars",
    help="Co-schedule GPU inference and CPU tool execution for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(
    help="Benchmarks: each prints its figure beside a baseline measured in the same run.",
    no_args_is_help=True,
)
events_app = typer.Typer(help="Inspect event-stream files (JSONL).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(events_app, name="events")


@app.command()
def demo(
    out: Annotated[
        Path | None, typer.Option(help="Also write the event stream to this JSONL file.")
    ] = None,
) -> None:
    """Run instrumented agent sessions against a local OpenAI-compatible server and
    print the event stream they produce."""
    from agentmars.cli.demo import run_demo

    run_demo(out)


@bench_app.command("sdk")
def bench_sdk(
    events: Annotated[
        int, typer.Option(min=1000, help="Events for the emission benchmark.")
    ] = 200_000,
    http_events: Annotated[
        int, typer.Option(min=1000, help="Events for the HTTP sink benchmark.")
    ] = 200_000,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Per-event emission overhead and HTTP sink throughput, against bare baselines."""
    from agentmars.bench.sdk import run

    run(events, http_events, json_out)


@events_app.command("validate")
def events_validate(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
) -> None:
    """Check a JSONL event file; list every bad line (exit 1 if any)."""
    from agentmars.cli.event_files import validate

    raise typer.Exit(validate(path))


@events_app.command("show")
def events_show(
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
) -> None:
    """Print a JSONL event file as a table (bad lines are reported, not fatal)."""
    from agentmars.cli.event_files import show

    raise typer.Exit(show(path))


if __name__ == "__main__":
    app()
