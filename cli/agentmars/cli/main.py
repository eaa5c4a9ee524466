"""``agentmars``: one command, a sub-command per part."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_TOKEN_FILE = Path.home() / ".cache" / "agentmars" / "sandbox.token"

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
sandbox_app = typer.Typer(help="The sandbox pool that runs agents' tools.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(sandbox_app, name="sandbox")
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


@bench_app.command("sandbox")
def bench_sandbox(
    calls: Annotated[int, typer.Option(min=10, help="Calls per dispatch measurement.")] = 300,
    tools: Annotated[int, typer.Option(min=10, help="Short tools for the throughput run.")] = 1000,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Dispatch overhead of the sandbox pool (in process and over HTTP) against a bare
    subprocess.run, and throughput of short tools."""
    from agentmars.bench.sandbox import run

    run(calls, tools, json_out)


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


@sandbox_app.command("serve")
def sandbox_serve(
    host: Annotated[
        str, typer.Option(help="Bind address; loopback unless you mean it.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8765,
    backend: Annotated[str, typer.Option(help="process (bubblewrap) or docker.")] = "process",
    slots: Annotated[
        int | None, typer.Option(min=1, help="Tools at once (default: one per tool core).")
    ] = None,
    tool_cores: Annotated[str | None, typer.Option(help="Cores for tools, e.g. 1-3.")] = None,
    engine_cores: Annotated[
        str | None, typer.Option(help="Cores kept for the engine (default 0).")
    ] = None,
    workspace_root: Annotated[
        Path | None, typer.Option(help="Where session workspaces live.")
    ] = None,
    memory_limit_mb: Annotated[int | None, typer.Option(help="Memory per slot.")] = None,
    pids_limit: Annotated[int | None, typer.Option(help="Processes per slot.")] = None,
    default_timeout_s: Annotated[
        float | None, typer.Option(help="Time limit when a call sets none.")
    ] = None,
    events_url: Annotated[
        str | None,
        typer.Option(help="Send tool events to this collector (token: $AGENTMARS_EVENTS_TOKEN)."),
    ] = None,
    token_file: Annotated[
        Path,
        typer.Option(
            help="Where a generated token is written when $AGENTMARS_SANDBOX_TOKEN is unset."
        ),
    ] = DEFAULT_TOKEN_FILE,
) -> None:
    """Serve the sandbox pool over HTTP (token-protected; bearer token from
    $AGENTMARS_SANDBOX_TOKEN)."""
    from agentmars.cli.sandbox import BadOption, parse_cores, serve

    try:
        options = {
            "backend": backend,
            "slots": slots,
            "tool_cores": parse_cores(tool_cores, "--tool-cores"),
            "engine_cores": parse_cores(engine_cores, "--engine-cores"),
            "workspace_root": workspace_root,
            "memory_limit_mb": memory_limit_mb,
            "pids_limit": pids_limit,
            "default_timeout_s": default_timeout_s,
        }
        serve(host=host, port=port, options=options, token_file=token_file, events_url=events_url)
    except BadOption as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    app()
