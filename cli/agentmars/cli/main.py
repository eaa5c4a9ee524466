"""``agentmars``: one command, a sub-command per part."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from agentmars.sdk.auth import GATEWAY_TOKEN_ENV

DEFAULT_TOKEN_FILE = Path.home() / ".cache" / "agentmars" / "sandbox.token"

app = typer.Typer(
    name="agentmars",
    help="Co-schedule GPU inference and CPU tool execution for LLM agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def load_policy_modules() -> None:
    """Import the policy modules ``AGENTMARS_POLICY_MODULES`` names before any command,
    so that a module that does not import stops every command with one clear error."""
    from agentmars.server.policies.registry import (
        PolicyModuleError,
        extra_policy_modules,
        policy_names,
    )

    try:
        if extra_policy_modules():
            policy_names()
    except PolicyModuleError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


bench_app = typer.Typer(
    help="Benchmarks: each prints its figure beside a baseline measured in the same run.",
    no_args_is_help=True,
)
events_app = typer.Typer(help="Inspect event-stream files (JSONL).", no_args_is_help=True)
sandbox_app = typer.Typer(help="The sandbox pool that runs agents' tools.", no_args_is_help=True)
sim_app = typer.Typer(
    help="Scheduling policies on the simulated engine: runs, sweeps, what is registered.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(events_app, name="events")
app.add_typer(sim_app, name="sim")


Choice = TypeVar("Choice", bound=StrEnum)


def one_of(choices: type[Choice]) -> Callable[[str], Choice]:
    """An enum option's parser, whose refusal reads "'foo' is not one of 'vllm', 'sim'."
    (typer 0.29's own starts "Value error, ")."""

    def parse(value: str) -> Choice:
        try:
            return choices(value)
        except ValueError:
            named = ", ".join(repr(choice.value) for choice in choices)
            raise typer.BadParameter(f"{value!r} is not one of {named}.") from None

    return parse


class DemoEngine(StrEnum):
    twin = "twin"
    vllm = "vllm"


def _demo_engine_files(
    engine: DemoEngine, vllm_python: Path | None
) -> tuple[Path, Path] | tuple[None, None]:
    """The vLLM python and the tiny model for ``--engine vllm`` (None for the twin)."""
    from agentmars.bench.vllm_env import BenchSetupError, find_vllm_python
    from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by

    if engine is DemoEngine.vllm:
        python = find_vllm_python(vllm_python)
        return python, tiny_model_made_by(python)
    if vllm_python is not None:
        raise BenchSetupError("--vllm-python is for --engine vllm")
    return None, None


@app.command()
def demo(
    engine: Annotated[
        DemoEngine,
        typer.Option(
            parser=one_of(DemoEngine),
            help="twin: the simulated engine, paced (no GPU); vllm: vLLM CPU.",
        ),
    ] = DemoEngine.twin,
    out: Annotated[Path, typer.Option(help="Folder for results.json and the report.")] = Path(
        "out/demo"
    ),
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="--engine vllm: the vLLM environment's python ($AGENTMARS_VLLM_PYTHON)."),
    ] = None,
) -> None:
    """The whole system at work: the gateway and an engine, agents replaying coding
    sessions with real tools in the sandbox pool, MARS against FCFS; tables and an HTML
    report (make demo; make demo ENGINE=vllm for vLLM CPU)."""
    from agentmars.bench.replay import ReplayBenchError
    from agentmars.bench.vllm_env import BenchSetupError
    from agentmars.cli.demo import demo_engine, run_demo
    from agentmars.cli.serve import stop_on_sigterm

    try:
        vllm_files = _demo_engine_files(engine, vllm_python)
        stop_on_sigterm()  # SIGTERM unwinds like Ctrl-C: every server it started stops
        code = run_demo(demo_engine(out, vllm_files), out)
    except (BenchSetupError, ReplayBenchError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@events_app.command("demo")
def events_demo(
    out: Annotated[
        Path | None, typer.Option(help="Also write the event stream to this JSONL file.")
    ] = None,
) -> None:
    """Two instrumented agent sessions against a scripted local server, and the event
    stream they produce, printed as it happens."""
    from agentmars.cli.events_demo import run_demo

    run_demo(out)


@app.command()
def calibrate(
    out: Annotated[Path, typer.Option(help="Write the profile JSON here.")],
    url: Annotated[str, typer.Option(help="The running vLLM server.")] = "http://127.0.0.1:8000",
    model: Annotated[str | None, typer.Option(help="Served model id (see /v1/models).")] = None,
    name: Annotated[str | None, typer.Option(help="Profile name (default: --out's stem).")] = None,
    description: Annotated[
        str | None, typer.Option(help="Profile description (default: model, server, date).")
    ] = None,
    record: Annotated[
        Path | None, typer.Option(help="Raw measurements file (default: next to --out).")
    ] = None,
    from_recording: Annotated[
        Path | None, typer.Option(help="Fit this recording again instead of measuring.")
    ] = None,
    block_size: Annotated[int | None, typer.Option(min=1, help="Default: the server's.")] = None,
    num_gpu_blocks: Annotated[
        int | None, typer.Option(min=1, help="Default: the server's.")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(min=1, help="Default: the server's.")] = None,
    max_num_seqs: Annotated[int, typer.Option(min=1, help="The server's setting.")] = 128,
    max_num_batched_tokens: Annotated[
        int, typer.Option(min=1, help="The server's setting.")
    ] = 2048,
    kv_bytes_per_token: Annotated[int | None, typer.Option(min=1)] = None,
    hf_config: Annotated[
        Path | None, typer.Option(help="The model's config.json (KV bytes, vocabulary).")
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Runs of each probe.")] = 2,
    quick: Annotated[bool, typer.Option(help="A few probes of each kind only.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts.")] = 0,
) -> None:
    """Measure a running vLLM server (prefill, decode, batched and mixed probes), fit the
    simulator's step-time model and write a profile (defaults: vLLM's CPU settings)."""
    from agentmars.cli.calibrate import CalibrateOptions, run

    options = CalibrateOptions(
        url=url,
        model=model,
        out=out,
        name=name,
        description=description,
        record_path=record,
        from_recording=from_recording,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        hf_config=hf_config,
        repeats=repeats,
        quick=quick,
        seed=seed,
    )
    raise typer.Exit(run(options))


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


@bench_app.command("gateway")
def bench_gateway(
    calls: Annotated[int, typer.Option(min=10, help="Completions on each path.")] = 500,
    vllm_python: Annotated[
        Path | None,
        typer.Option(
            help="Measure over vLLM CPU (tiny model) run by this python, not the scripted engine."
        ),
    ] = None,
    engine_latency_ms: Annotated[
        float,
        typer.Option(min=0, help="The scripted engine answers after this long (not with vLLM)."),
    ] = 0,
    fresh_connections: Annotated[
        bool,
        typer.Option(help="A new connection per call, not one kept alive per path (the default)."),
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Latency the gateway adds to a short completion (target p50 <= 2 ms)."""
    from agentmars.bench.gateway import run
    from agentmars.bench.vllm_env import BenchSetupError, find_vllm_python

    try:
        python = find_vllm_python(vllm_python) if vllm_python is not None else None
        run(calls, json_out, python, engine_latency_ms, fresh_connections)
    # ValueError: a latency with vLLM; RuntimeError: vLLM did not start.
    except (BenchSetupError, ValueError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("hop")
def bench_hop(
    calls: Annotated[int, typer.Option(min=10, help="Completions on each path.")] = 500,
    engine_latency_ms: Annotated[
        float, typer.Option(min=0, help="The scripted engine answers after this long.")
    ] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """What one proxy hop costs, by what forwards: aiohttp (the gateway's), httpx, socat."""
    from agentmars.bench.hop import run

    try:
        run(calls, json_out, engine_latency_ms)
    except RuntimeError as exc:  # a proxy did not start
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("plugin")
def bench_plugin(
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="The vLLM environment's python (default: $AGENTMARS_VLLM_PYTHON)."),
    ] = None,
    sessions: Annotated[int, typer.Option(min=1, help="Sessions in the queue.")] = 64,
    turns: Annotated[int, typer.Option(min=1, help="Calls per session.")] = 4,
    reps: Annotated[int, typer.Option(min=1, help="Runs of each scheduler.")] = 10,
    kv_blocks: Annotated[int, typer.Option(min=16, help="KV blocks of 16 tokens.")] = 1024,
    seed: Annotated[int, typer.Option(help="Seed of the queue.")] = 0,
    policies: Annotated[
        str,
        typer.Option(
            help="The plugin's policies, comma-separated, each against stock vLLM "
            "(e.g. MARS's ablations)."
        ),
    ] = "fcfs,continuum,mars",
    instructions: Annotated[
        bool,
        typer.Option(
            help="Count schedule()'s instructions under valgrind's callgrind, one run of "
            "each scheduler on a virtual clock, instead of timing it (--reps unused)."
        ),
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Cost of the plugin's schedule() against stock vLLM's on the same synthetic queue
    (target <= 10% more); vLLM's real scheduler, no model."""
    from agentmars.bench.plugin import PluginBenchOptions, run, run_count
    from agentmars.bench.vllm_env import BenchSetupError, find_vllm_python
    from agentmars.cli.serve import stop_on_sigterm
    from agentmars.server.engines.vllm.bench_schedule import policy_list

    try:
        chosen = policy_list(policies)
        python = find_vllm_python(vllm_python)
        stop_on_sigterm()  # SIGTERM unwinds like Ctrl-C: the measurement's group stops
        options = PluginBenchOptions(python, sessions, turns, reps, kv_blocks, seed, chosen)
        (run_count if instructions else run)(options, json_out)
    except (BenchSetupError, RuntimeError, ValueError) as exc:
        # RuntimeError: the measurement failed; ValueError: --policies
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("replay")
def bench_replay(
    engine: Annotated[
        DemoEngine,
        typer.Option(
            parser=one_of(DemoEngine), help="twin: the simulated engine, paced; vllm: vLLM CPU."
        ),
    ] = DemoEngine.twin,
    policies: Annotated[str, typer.Option(help="Comma-separated; the first is the base.")] = (
        "mars,fcfs,continuum"
    ),
    workload: Annotated[str, typer.Option(help="Registered workload generator.")] = "ilr-1",
    sessions: Annotated[int, typer.Option(min=1)] = 16,
    rate: Annotated[
        float | None, typer.Option(help="Session arrivals per second (open loop).")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Sessions at once (closed loop).")
    ] = None,
    seed: Annotated[int, typer.Option(min=0)] = 1,
    max_context: Annotated[
        int, typer.Option(help="The engine's context: the workload's tokens are scaled to it.")
    ] = 4096,
    max_turns: Annotated[int, typer.Option(min=1, help="Calls per session, at most.")] = 8,
    tool_scale: Annotated[float, typer.Option(help="Factor on the tools' time.")] = 1.0,
    agents: Annotated[
        str,
        typer.Option(
            help="replay: trace-replay agents (token-id prompts); openhands: OpenHands "
            "conversations in replay mode (the openhands extra)."
        ),
    ] = "replay",
    num_blocks: Annotated[int, typer.Option(min=1, help="KV blocks of the engine.")] = 48,
    profile: Annotated[
        str | None,
        typer.Option(
            help="The twin's pacing, the plugin's costs, the prediction's model (default: "
            "cpu-tiny on the twin; on vLLM, a profile fitted on this host first)."
        ),
    ] = None,
    tool_slots: Annotated[int, typer.Option(min=1, help="Tools at once in the sandbox pool.")] = 4,
    cores: Annotated[str, typer.Option(help="CPUs for the engine.")] = "0",
    agent_cores: Annotated[str, typer.Option(help="CPUs for the agents and their tools.")] = "1",
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="--engine vllm: the vLLM environment's python ($AGENTMARS_VLLM_PYTHON)."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for results.json, the report, the logs.")] = (
        Path("out/bench-replay")
    ),
) -> None:
    """Replayed agents on the real stack: a workload's sessions through the SDK, the
    gateway and an engine, real tools in the sandbox pool; each policy served in turn,
    the simulator's prediction beside it. The simulator's metrics, table and report."""
    from agentmars.bench.replay import (
        ReplayBenchError,
        ReplayPlan,
        engine_shape,
        failed_runs_line,
        fitted_here_unless_given,
        publish_output,
        run_with_progress,
    )
    from agentmars.bench.session_mix import SandboxShape, SessionMixError
    from agentmars.bench.vllm_env import BenchSetupError
    from agentmars.cli.serve import stop_on_sigterm

    names = tuple(name.strip() for name in policies.split(",") if name.strip())
    if rate is None and concurrency is None:
        rate = 0.4
    plan = ReplayPlan(
        workload, sessions, rate, concurrency, max_turns, max_context, tool_scale, seed, names,
        agents,
    )  # fmt: skip
    try:
        plan.check()
        sandbox = SandboxShape(tool_slots=tool_slots)
        sandbox.check(agent_cores)
        shape = engine_shape(
            _demo_engine_files(engine, vllm_python),
            num_blocks=num_blocks,
            max_context=max_context,
            cores=cores,
            agent_cores=agent_cores,
            log_dir=out / "logs",
            profile=profile,
        )
        stop_on_sigterm()
        output = run_with_progress(plan, fitted_here_unless_given(shape), sandbox, out)
    except (BenchSetupError, ReplayBenchError, SessionMixError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    publish_output(output, out)
    failed = [run for run in output.runs if run.failed]
    for run in failed:
        typer.echo(f"error: {len(run.failed)} sessions failed under {run.policy}", err=True)
    failed_runs = failed_runs_line(output)
    if failed_runs is not None:
        typer.echo(f"error: {failed_runs}", err=True)
    raise typer.Exit(1 if failed or failed_runs is not None else 0)


@bench_app.command("session-mix")
def bench_session_mix(
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="The vLLM environment's python (default: $AGENTMARS_VLLM_PYTHON)."),
    ] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated; the first is the base.")] = (
        "fcfs,continuum"
    ),
    workload: Annotated[str, typer.Option(help="Registered workload generator.")] = "react",
    sessions: Annotated[int, typer.Option(min=1)] = 16,
    rate: Annotated[float, typer.Option(help="Session arrivals per second.")] = 1.0,
    seed: Annotated[int, typer.Option(min=0)] = 1,
    max_context: Annotated[int, typer.Option(help="Tokens a session's context may reach.")] = (
        4096
    ),
    max_turns: Annotated[int, typer.Option(min=1, help="Calls per session, at most.")] = 4,
    tool_scale: Annotated[float, typer.Option(help="Factor on the tools' durations.")] = 1.0,
    num_blocks: Annotated[int, typer.Option(min=1, help="vLLM's KV blocks (128 tokens).")] = 64,
    cores: Annotated[str | None, typer.Option(help="CPUs for vLLM.")] = "0",
    agent_cores: Annotated[
        str | None, typer.Option(help="CPUs for the gateway and the agents.")
    ] = "1",
    profile: Annotated[
        str, typer.Option(help="The plugin's cost profile (name or file).")
    ] = "cpu-tiny",
    model: Annotated[
        Path | None,
        typer.Option(
            help="vLLM's model directory (default: the tiny model); e.g. a deeper "
            "random one from the tiny_model module, to slow the engine down (docs/results/mars.md)."
        ),
    ] = None,
    log_dir: Annotated[Path, typer.Option(help="Logs of each run.")] = Path(
        "out/bench-session-mix"
    ),
    runs: Annotated[
        int,
        typer.Option(
            min=1, help="Serve and replay each policy this often, the policies interleaved."
        ),
    ] = 1,
    twin: Annotated[
        bool,
        typer.Option(
            help="Serve the wall-clock twin paced from --profile (the simulator's engine "
            "behind the real gateway) instead of vLLM; no vLLM environment needed."
        ),
    ] = False,
    sandbox: Annotated[
        bool,
        typer.Option(
            help="Run the tools for real (sleep) in the sandbox pool on the agent cores, "
            "at the gateway's tool priority."
        ),
    ] = False,
    tool_slots: Annotated[
        int | None,
        typer.Option(min=1, help="With --sandbox: tools at once (default: one per agent core)."),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Policies on vLLM CPU with the plugin and the gateway: a replayed mix of agent
    sessions, the policies one after the other, --runs times interleaved (session latency,
    TTFT after tools, prefix-cache hit rate, throughput; per run and their means).
    Several minutes: vLLM starts once per policy and run."""
    from agentmars.bench.session_mix import (
        EngineShape,
        MixShape,
        SandboxShape,
        SessionMixError,
        check_fits,
        failed_runs_line,
        run,
        served_model,
    )
    from agentmars.bench.vllm_env import BenchSetupError, find_vllm_python
    from agentmars.cli.serve import stop_on_sigterm
    from agentmars.server.policies.registry import UnknownPolicy, policy_class
    from agentmars.server.workloads.errors import WorkloadError

    names = [name.strip() for name in policies.split(",") if name.strip()]
    shape = MixShape(workload, sessions, rate, seed, max_context, max_turns, tool_scale)
    try:
        if twin and model is not None:
            raise SessionMixError("--model is vLLM's; the twin serves --profile's engine")
        python = Path(os.devnull) if twin else find_vllm_python(vllm_python)
        for name in names or [""]:
            policy_class(name)
        shape.check()
        check_fits(num_blocks, max_context)
        if tool_slots is not None and not sandbox:
            raise SessionMixError("--tool-slots needs --sandbox")
        tools = SandboxShape(tool_slots) if sandbox else None
        if tools is not None:
            tools.check(agent_cores)
        engine = EngineShape(
            python, python if twin else served_model(python, model), num_blocks, max_context,
            cores, agent_cores, log_dir, profile, twin=twin,
        )  # fmt: skip
        stop_on_sigterm()  # SIGTERM unwinds like Ctrl-C: every server it started stops
        figures = run(engine, shape, names, json_out, runs=runs, sandbox=tools)
    except (BenchSetupError, SessionMixError, UnknownPolicy, WorkloadError, RuntimeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    # A run with failed sessions (a call refused, the engine dead) measured something
    # else than the policy: its figures are printed, but the command fails; so does a
    # run that failed as a whole (the others' figures are printed and written).
    failed = [(r["policy"], r["failed"]) for r in figures["policies"] if r["failed"]]
    for policy, errors in failed:
        typer.echo(f"error: {len(errors)} sessions failed under {policy}: {errors[0]}", err=True)
    failed_runs = failed_runs_line(figures)
    if failed_runs is not None:
        typer.echo(f"error: {failed_runs}", err=True)
    if failed or failed_runs is not None:
        raise typer.Exit(1)


@bench_app.command("fidelity")
def bench_fidelity(
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="The vLLM environment's python (default: $AGENTMARS_VLLM_PYTHON)."),
    ] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated.")] = "fcfs,continuum",
    loads: Annotated[
        str, typer.Option(help="Operating points as NAME=RATE (sessions/s), comma-separated.")
    ] = "light=0.15,heavy=0.6,near-saturation=0.9",
    profile: Annotated[
        str | None,
        typer.Option(help="Cost profile (name or file); default: fit one here first."),
    ] = None,
    twin: Annotated[bool, typer.Option(help="Also replay on the wall-clock twin.")] = True,
    model: Annotated[
        Path | None, typer.Option(help="vLLM's model directory (default: the tiny model).")
    ] = None,
    workload: Annotated[str, typer.Option(help="Registered workload generator.")] = "react",
    sessions: Annotated[int, typer.Option(min=1)] = 40,
    seed: Annotated[int, typer.Option(min=0)] = 1,
    max_context: Annotated[int, typer.Option(help="Tokens a session's context may reach.")] = (
        4096
    ),
    max_turns: Annotated[int, typer.Option(min=1, help="Calls per session, at most.")] = 4,
    num_blocks: Annotated[int, typer.Option(min=1, help="vLLM's KV blocks (128 tokens).")] = 64,
    cores: Annotated[str | None, typer.Option(help="CPUs for the engine.")] = "0",
    agent_cores: Annotated[
        str | None, typer.Option(help="CPUs for the gateway and the agents.")
    ] = "1",
    log_dir: Annotated[Path, typer.Option(help="Logs and the fitted profile.")] = Path(
        "out/bench-fidelity"
    ),
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Plot the real engine's queue and KV over time here.")
    ] = None,
) -> None:
    """The simulator (and the twin) against vLLM CPU on the same replayed mix: mean / P95
    session latency, TTFT after tools, prefix-hit rate, and the relative error, per load
    and policy. Tens of minutes: vLLM starts once per load and policy."""
    from agentmars.bench.fidelity import FidelityError, parse_loads, plot_engine_load, run
    from agentmars.bench.session_mix import (
        EngineShape,
        MixShape,
        SessionMixError,
        check_fits,
        served_model,
    )
    from agentmars.bench.vllm_env import BenchSetupError, find_vllm_python
    from agentmars.cli.serve import stop_on_sigterm
    from agentmars.server.policies.registry import UnknownPolicy, policy_class
    from agentmars.server.profiles.cost_model import ProfileError, load_profile
    from agentmars.server.workloads.errors import WorkloadError

    names = [name.strip() for name in policies.split(",") if name.strip()]
    try:
        points = parse_loads(loads)
        shape = MixShape(workload, sessions, points[0].rate, seed, max_context, max_turns)
        shape.check()
        check_fits(num_blocks, max_context)
        for name in names:
            policy_class(name)
        if profile is not None:
            load_profile(profile)
        python = find_vllm_python(vllm_python)
        engine = EngineShape(
            python, served_model(python, model), num_blocks, max_context, cores,
            agent_cores, log_dir, profile,
        )  # fmt: skip
        stop_on_sigterm()  # SIGTERM unwinds like Ctrl-C: every server it started stops
        figures = run(engine, shape, points, names, twin=twin, json_out=json_out)
        if plot is not None:
            plot_engine_load(figures, plot)
    except (
        BenchSetupError, FidelityError, SessionMixError, UnknownPolicy, ProfileError,
        WorkloadError, RuntimeError,
    ) as exc:  # fmt: skip
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    failed = [
        (p["policy"], run_["failed"])
        for p in figures["points"]
        for run_ in (p["real"], *p["models"].values())
        if run_["failed"]
    ]
    for policy, errors in failed:
        typer.echo(f"error: {len(errors)} sessions failed under {policy}: {errors[0]}", err=True)
    if failed:
        raise typer.Exit(1)


@bench_app.command("sim")
def bench_sim(
    workload: Annotated[str, typer.Option(help="Registered workload.")] = "ilr-4",
    sessions: Annotated[int, typer.Option(min=1)] = 200,
    rate: Annotated[float, typer.Option(min=0.001, help="Arrival rate (sessions/s).")] = 0.3,
    policies: Annotated[str, typer.Option(help="Comma-separated.")] = "fcfs,continuum",
    profile: Annotated[str, typer.Option()] = "h100-qwen3-coder-30b",
    baseline: Annotated[
        bool, typer.Option(help="Also run step by step (decode jumps off) for the ratio.")
    ] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Wall time of a simulated run (target: 200 ILR-4 sessions in <= 30 s on one core)."""
    from agentmars.bench.sim import run

    run(
        workload,
        sessions,
        rate,
        [p.strip() for p in policies.split(",")],
        profile,
        baseline,
        json_out,
    )


@bench_app.command("admission")
def bench_admission(
    calls: Annotated[int, typer.Option(min=100, help="Measured calls per row.")] = 2000,
    policies: Annotated[
        str | None, typer.Option(help="Comma-separated (default: every registered policy).")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Admission's cost per call at 10, 1,000 and 10,000 idle sessions (target: flat
    within 2x); exit 1 if a policy's is not."""
    from agentmars.bench.admission import run
    from agentmars.server.policies.registry import policy_names

    chosen = [p.strip() for p in policies.split(",")] if policies else None
    unknown = sorted(set(chosen or ()) - set(policy_names()))
    if unknown:
        typer.echo(f"error: unknown policies {unknown}; known: {policy_names()}", err=True)
        raise typer.Exit(2)
    raise typer.Exit(0 if run(calls, json_out, chosen)["flat"] else 1)


@bench_app.command("justitia-predictor")
def bench_justitia_predictor(
    train: Annotated[int, typer.Option(min=2, help="Training agents per type (paper: 100).")] = 100,
    test: Annotated[int, typer.Option(min=2, help="Held-out agents per type.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the agents and the models.")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Justitia's cost predictor (seed 004 §4.2) against its Table 1: 53.0% average
    relative error, 2.16 ms a prediction."""
    from agentmars.bench.justitia_predictor import run

    run(train, test, seed, json_out)


@bench_app.command("starvation")
def bench_starvation(
    mice: Annotated[
        str, typer.Option(help="Counts of mice agents, comma-separated (one run each).")
    ] = "10,20,40,80,160",
    policies: Annotated[str, typer.Option(help="Policies, comma-separated.")] = "justitia,srjf",
    profile: Annotated[str, typer.Option(help="Cost-model profile of the simulator.")] = (
        "a100-gptj-6b"
    ),
    seed: Annotated[int, typer.Option(min=0, help="Seed of the workload.")] = 1,
    mice_per_s: Annotated[
        float, typer.Option(min=0.001, max=1000.0, help="Mice arriving per second (paper: 1).")
    ] = 1.0,
    out: Annotated[Path | None, typer.Option(help="Folder for the plot.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    """Seed 004 §5.3 (Fig. 9) on the simulator: the elephant agent's JCT as mice keep
    arriving, per policy (SRJF starves it; Justitia bounds its delay)."""
    from agentmars.bench.report import progress_bars
    from agentmars.bench.starvation import run
    from agentmars.server.policies.registry import UnknownPolicy, policy_class
    from agentmars.server.profiles.cost_model import load_profile

    try:
        counts = sorted({int(part) for part in mice.split(",")})
        chosen = [name.strip() for name in policies.split(",") if name.strip()]
        for name in chosen:
            policy_class(name)
        load_profile(profile)
    except (ValueError, UnknownPolicy, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not counts or counts[0] < 1 or not chosen:
        typer.echo("error: give mice counts >= 1 and at least one policy", err=True)
        raise typer.Exit(2)
    with progress_bars() as progress:
        run(counts, chosen, profile, seed, mice_per_s, out, json_out, progress)


@bench_app.command("capacity")
def bench_capacity(
    policies: Annotated[
        str, typer.Option(help="Policies, comma-separated; the first is the one compared.")
    ] = (
        "mars,fcfs,autellix,infercept,continuum,continuum-dy,thunderagent,thunderagent-cpu,"
        "mori,justitia"
    ),
    workloads: Annotated[
        str, typer.Option(help="Registered workloads, comma-separated (`agentmars sim workloads`).")
    ] = "ilr-1",
    profile: Annotated[str, typer.Option(help="Cost-model profile name or JSON file.")] = (
        "h100-qwen3-coder-30b"
    ),
    sessions: Annotated[int, typer.Option(min=1, help="Sessions per workload.")] = 200,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the workload generator.")] = 1,
    slowdown: Annotated[
        float, typer.Option(help="The bound on the P95 slowdown (latency / T_ideal).")
    ] = 3.0,
    low: Annotated[float, typer.Option(help="Low end of the initial bracket (sessions/s).")] = 0.05,
    high: Annotated[
        float, typer.Option(help="High end of the initial bracket (sessions/s); doubled while met.")
    ] = 1.0,
    max_rate: Annotated[
        float, typer.Option(help="Stop doubling the high end here (sessions/s).")
    ] = 16.0,
    tolerance: Annotated[
        float, typer.Option(help="Stop when the bracket's width / its low end is at most this.")
    ] = 0.05,
    jobs: Annotated[int, typer.Option(min=1, help="Runs in parallel (worker processes).")] = 1,
    out: Annotated[Path, typer.Option(help="Folder for results.json.")] = Path(
        "out/bench-capacity"
    ),
) -> None:
    """How many agents one node holds: per policy, the highest Poisson arrival rate at
    which the P95 slowdown stays within --slowdown, by bisection on the simulator
    (deterministic: the same options give the same capacities); the first policy's
    capacity over the best other's. Exit 1 if a run failed."""
    from agentmars.bench.capacity import CapacityError, Search, Setting, parse_names, run
    from agentmars.bench.report import progress_bars
    from agentmars.server.policies.registry import make_policy
    from agentmars.server.profiles.cost_model import ProfileError, load_profile
    from agentmars.server.workloads.registry import workload_names

    try:
        chosen = parse_names(policies, "--policies")
        for name in chosen:
            make_policy(name)  # unknown names, or settings a policy does not take
        names = parse_names(workloads, "--workloads", workload_names())
        search = Search(low=low, high=high, cap=max_rate, tolerance=tolerance, bound=slowdown)
        setting = Setting(load_profile(profile), sessions, seed)
    except (CapacityError, ProfileError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    with progress_bars() as progress:
        results = run(setting, names, chosen, search, out, jobs=jobs, progress=progress)
    failed = any(
        capacity["status"] == "error"
        for workload in results["workloads"].values()
        for capacity in workload["capacity"].values()
    )
    raise typer.Exit(1 if failed else 0)


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
    workspace_quota_mb: Annotated[
        int | None, typer.Option(help="Disk per workspace, MB (default 4096; docs/sandbox.md).")
    ] = None,
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
    import signal

    from agentmars.cli.sandbox import BadOption, parse_cores, serve

    listener = _listen(host, port, "the sandbox service")
    # SIGTERM unwinds as Ctrl-C does: the server stops (killing the running tools),
    # then the events are sent.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        options = {
            "backend": backend,
            "slots": slots,
            "tool_cores": parse_cores(tool_cores, "--tool-cores"),
            "engine_cores": parse_cores(engine_cores, "--engine-cores"),
            "workspace_root": workspace_root,
            "memory_limit_mb": memory_limit_mb,
            "pids_limit": pids_limit,
            "workspace_quota_mb": workspace_quota_mb,
            "default_timeout_s": default_timeout_s,
        }
        serve(
            host=host, port=port, options=options, token_file=token_file,
            events_url=events_url, listener=listener,
        )  # fmt: skip
    except BadOption as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass


def _sim(
    workloads: str,
    rates: str | None,
    concurrency: int | None,
    policies: str,
    profile: str,
    sessions: int,
    seed: int,
    tool_cores: int,
    cpu_tier_ratio: float | None,
    replicas: int,
    out: Path,
    jobs: int,
    report: bool,
) -> None:
    from agentmars.cli.sim import BadInput, BadOption, parse_list, parse_rates, run_plan
    from agentmars.server.sim.engine import SimConfig
    from agentmars.server.sim.sweep import SweepPlan

    try:
        plan = SweepPlan(
            workloads=parse_list(workloads, "--workload"),
            policies=parse_list(policies, "--policies"),
            profile=profile,
            rates=parse_rates(rates, "--rate"),
            concurrency=concurrency,
            sessions=sessions,
            seed=seed,
            config=SimConfig(
                tool_cores=tool_cores, cpu_tier_ratio=cpu_tier_ratio, replicas=replicas
            ),
        )
        code = run_plan(plan, out, jobs=jobs, report=report)
    except (BadOption, *BadInput) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


SimWorkloads = Annotated[
    str,
    typer.Option(
        "--workload", "--workloads", help="Registered names or workload files, comma-separated."
    ),
]
SimRates = Annotated[
    str | None,
    typer.Option("--rate", "--rates", help="Poisson arrival rates (sessions/s), comma-separated."),
]
SimConcurrency = Annotated[
    int | None,
    typer.Option(min=1, help="Closed loop with this many sessions at once (instead of --rate)."),
]
SimPolicies = Annotated[
    str, typer.Option(help="Policies, comma-separated (see `agentmars sim policies`).")
]
SimProfile = Annotated[str, typer.Option(help="Cost-model profile name or JSON file.")]
SimSessions = Annotated[int, typer.Option(min=1, help="Sessions per generated workload.")]
SimSeed = Annotated[int, typer.Option(help="Seed of the workload generator.")]
SimToolCores = Annotated[
    int,
    typer.Option(
        min=1,
        help="Host cores for tools (default 16: one GPU's share of an 8-GPU server's "
        "cores; docs/workloads.md).",
    ),
]
SimCpuTierRatio = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        help="The CPU KV tier's size as a multiple of the GPU KV (default: the profile's; "
        "seed 003 runs 1 and 2).",
    ),
]
SimReplicas = Annotated[
    int,
    typer.Option(
        min=1,
        help="Engine replicas behind the gateway, each a whole engine of the profile "
        "(seed 003's DP=3); each session stays on the one the policy places it on.",
    ),
]
SimOut = Annotated[Path, typer.Option(help="Folder for results.json and the report.")]
SimJobs = Annotated[int, typer.Option(min=1, help="Runs in parallel (worker processes).")]
SimReport = Annotated[bool, typer.Option(help="Draw the PNG plots and index.html.")]


class Engine(StrEnum):
    vllm = "vllm"
    sim = "sim"


VLLM_MAX_MODEL_LEN = 32768
VLLM_NUM_BLOCKS = 512


@app.command("serve")
def serve(
    model: Annotated[
        Path | None, typer.Option(help="Model directory (vllm; e.g. the tiny model's).")
    ] = None,
    engine: Annotated[
        Engine, typer.Option(parser=one_of(Engine), help="The engine behind the gateway.")
    ] = Engine.vllm,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Cost-model profile (name or JSON file): the simulated engine's (sim, "
            "required) or the plugin's time estimates (vllm, for policies that need costs)."
        ),
    ] = None,
    policy: Annotated[
        str, typer.Option(help="Scheduling policy (agentmars sim policies).")
    ] = "mars",
    host: Annotated[str, typer.Option(help="Gateway address; loopback unless you mean it.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=1, max=65535, help="Gateway port.")] = 8080,
    vllm_python: Annotated[
        Path | None,
        typer.Option(help="The vLLM environment's python (default: $AGENTMARS_VLLM_PYTHON)."),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=1, help=f"Context limit (vllm: {VLLM_MAX_MODEL_LEN}; sim: the profile's)."
        ),
    ] = None,
    num_blocks: Annotated[
        int | None,
        typer.Option(min=1, help=f"KV blocks (vllm: {VLLM_NUM_BLOCKS}; sim: the profile's)."),
    ] = None,
    cores: Annotated[
        str | None,
        typer.Option(help="CPUs for vLLM, e.g. 0 (several replicas: shared out among them)."),
    ] = None,
    replicas: Annotated[
        int,
        typer.Option(
            min=1,
            help="vllm: engine replicas behind the gateway, each session kept on the one "
            "the policy places it on (each with its own CPUs and --num-blocks).",
        ),
    ] = 1,
    cpu_kv_blocks: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="vllm: the CPU KV tier's size in KV blocks (0: none; default: as many as "
            "--num-blocks for a policy that needs or uses a CPU tier, else none).",
        ),
    ] = None,
    session_idle_s: Annotated[
        float,
        typer.Option(
            min=0.001,
            max=1e9,
            help="A session with nothing in flight and no tool open this long is ended "
            '(its seat goes back after its gap, well before: docs/gateway.md "Seats").',
        ),
    ] = 300.0,
    log: Annotated[Path, typer.Option(help="vLLM's output.")] = Path("out/vllm.log"),
    vllm_arg: Annotated[
        list[str] | None, typer.Option(help="One more vLLM argument (repeatable).")
    ] = None,
) -> None:
    """Run an engine with the agentmars scheduler in it and the gateway in front of it
    (token for the event endpoints: $AGENTMARS_GATEWAY_TOKEN; on loopback, made and
    printed when unset); Ctrl-C stops both.
    --engine vllm: vLLM with the plugin (--model); --engine sim: the simulated engine
    paced to the wall clock (--profile), no GPU needed."""
    import os

    token = _gateway_token(os.environ.get(GATEWAY_TOKEN_ENV, ""), host)
    listener = _listen(host, port, "the gateway")
    if engine is Engine.sim:
        vllm_only = [name for name, value in (("--model", model), ("--vllm-python", vllm_python),
                     ("--cores", cores), ("--vllm-arg", vllm_arg), ("--replicas", replicas > 1),
                     ("--cpu-kv-blocks", cpu_kv_blocks is not None)) if value]  # fmt: skip
        _serve_sim(
            profile, vllm_only, policy, host, port, token, num_blocks, max_model_len,
            session_idle_s, listener,
        )  # fmt: skip
    if model is None:
        typer.echo("error: --engine vllm needs --model (vllm serves a model directory)", err=True)
        raise typer.Exit(2)
    from agentmars.cli.serve import VLLM_PYTHON_ENV, ServeError, ServeOptions
    from agentmars.cli.serve import serve as run_serve

    python = vllm_python or Path(os.environ.get(VLLM_PYTHON_ENV, ""))
    try:
        if not str(python) or str(python) == ".":
            raise ServeError(f"give --vllm-python or ${VLLM_PYTHON_ENV} (scripts/vllm-env.sh)")
        log.parent.mkdir(parents=True, exist_ok=True)
        options = ServeOptions(
            model=model,
            policy=policy,
            profile=profile,
            host=host,
            port=port,
            token=token,
            vllm_python=python,
            log_path=log,
            max_model_len=max_model_len or VLLM_MAX_MODEL_LEN,
            num_blocks=num_blocks or VLLM_NUM_BLOCKS,
            cores=cores,
            vllm_args=tuple(vllm_arg or ()),
            cpu_kv_blocks=cpu_kv_blocks,
            replicas=replicas,
            session_idle_s=session_idle_s,
        )
        code = run_serve(options, listener)
    except (ServeError, RuntimeError) as exc:  # RuntimeError: vLLM did not start
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _gateway_token(token: str, host: str) -> str:
    """The event endpoints' bearer token: ``$AGENTMARS_GATEWAY_TOKEN``, or on loopback a
    new one, printed once (as notebook servers do: only this machine can reach it, and
    whoever started it reads the token here)."""
    import secrets

    from agentmars.server.web.serving import is_loopback

    if token:
        return token
    if not is_loopback(host):
        typer.echo(
            f"error: --host {host} is reachable from other machines: set "
            "$AGENTMARS_GATEWAY_TOKEN (the event endpoints' bearer token)",
            err=True,
        )
        raise typer.Exit(2)
    token = secrets.token_urlsafe(24)
    typer.echo(
        f"agentmars: no $AGENTMARS_GATEWAY_TOKEN, so this gateway's token is {token} "
        "(set the variable to choose it)",
        err=True,
    )
    return token


def _listen(host: str, port: int, server: str) -> socket.socket:
    """``server``'s socket, bound before anything slow starts (vLLM takes a minute, a
    sandbox pool a probe) and before any banner: a busy port is refused at once, with
    exit status 2, and nothing started later can take it."""
    from agentmars.server.web.serving import CannotListen, listening_socket

    try:
        return listening_socket(host, port)
    except CannotListen as exc:
        typer.echo(f"error: {server} cannot listen on {host}:{port}: {exc}", err=True)
        raise typer.Exit(2) from None


def _serve_sim(
    profile: str | None,
    vllm_only: list[str],
    policy: str,
    host: str,
    port: int,
    token: str,
    num_blocks: int | None,
    max_model_len: int | None,
    session_idle_s: float,
    listener: socket.socket,
) -> None:
    from agentmars.cli.serve_sim import SimServeError, SimServeOptions, serve_sim
    from agentmars.server.profiles.cost_model import profile_names

    try:
        if profile is None:
            raise SimServeError(f"--engine sim needs --profile: {', '.join(profile_names())}")
        if vllm_only:
            raise SimServeError(f"{', '.join(vllm_only)}: only for --engine vllm")
        options = SimServeOptions(
            profile=profile,
            policy=policy,
            host=host,
            port=port,
            token=token,
            num_blocks=num_blocks,
            max_model_len=max_model_len,
            session_idle_s=session_idle_s,
        )
        code = serve_sim(options, listener)
    except SimServeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@sim_app.command("run")
def sim_run(
    workload: SimWorkloads,
    policies: SimPolicies = "mars,fcfs,autellix,infercept,continuum,continuum-dy",
    rate: SimRates = None,
    concurrency: SimConcurrency = None,
    profile: SimProfile = "h100-qwen3-coder-30b",
    sessions: SimSessions = 200,
    seed: SimSeed = 1,
    tool_cores: SimToolCores = 16,
    cpu_tier_ratio: SimCpuTierRatio = None,
    replicas: SimReplicas = 1,
    out: SimOut = Path("out/sim"),
    jobs: SimJobs = 1,
    report: SimReport = True,
) -> None:
    """Run policies on one workload at one load; table, results.json and plots."""
    _sim(
        workload,
        rate,
        concurrency,
        policies,
        profile,
        sessions,
        seed,
        tool_cores,
        cpu_tier_ratio,
        replicas,
        out,
        jobs,
        report,
    )


@sim_app.command("sweep")
def sim_sweep(
    workloads: SimWorkloads = "ilr-1,ilr-2,ilr-3,ilr-4",
    rates: SimRates = "0.1,0.2,0.3,0.4,0.5",
    policies: SimPolicies = "mars,fcfs,autellix,infercept,continuum,continuum-dy",
    concurrency: SimConcurrency = None,
    profile: SimProfile = "h100-qwen3-coder-30b",
    sessions: SimSessions = 200,
    seed: SimSeed = 1,
    tool_cores: SimToolCores = 16,
    cpu_tier_ratio: SimCpuTierRatio = None,
    replicas: SimReplicas = 1,
    out: SimOut = Path("out/sweep"),
    jobs: SimJobs = 1,
    report: SimReport = True,
) -> None:
    """Run policies over every (workload, rate) pair; tables, results.json and plots."""
    if concurrency is not None:
        rates = None
    _sim(
        workloads,
        rates,
        concurrency,
        policies,
        profile,
        sessions,
        seed,
        tool_cores,
        cpu_tier_ratio,
        replicas,
        out,
        jobs,
        report,
    )


@sim_app.command("speedup")
def sim_speedup(
    results: Annotated[Path, typer.Argument(help="A sweep's results.json.")],
    policy: Annotated[str, typer.Option(help="The policy compared.")] = "mars",
    against: Annotated[
        str, typer.Option(help="Comma-separated: the others; the strongest at each point counts.")
    ] = "fcfs,autellix,infercept,continuum,continuum-dy",
    variants: Annotated[
        str, typer.Option(help="Comma-separated variants shown as slowdowns of the policy.")
    ] = "",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the rows here.")] = None,
) -> None:
    """One policy against the others of a sweep, point by point: speed-up over the
    strongest, P90 / P95, goodput, and variants (ablations) as slowdowns."""
    import json

    from agentmars.cli.sim import console, err_console, parse_list, speedup_tables
    from agentmars.server.metrics.speedup import compare

    try:
        data = json.loads(results.read_text(encoding="utf-8"))
        others = parse_list(against, "--against")
        extra = parse_list(variants, "--variants") if variants else ()
        rows = compare(data, policy, others, extra)
    except (OSError, ValueError) as error:  # SpeedupError, BadOption, bad JSON
        err_console.print(f"error: {error}")
        raise typer.Exit(2) from None
    for table in speedup_tables(rows, policy):
        console.print(table)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([row.as_dict() for row in rows], indent=2) + "\n")


@sim_app.command("policies")
def sim_policies() -> None:
    """The registered scheduling policies."""
    from agentmars.cli.sim import list_rows
    from agentmars.server.policies.registry import describe_policy, policy_names

    list_rows("policies", ((name, describe_policy(name)) for name in policy_names()))


@sim_app.command("workloads")
def sim_workloads() -> None:
    """The registered workload generators."""
    from agentmars.cli.sim import list_rows
    from agentmars.server.workloads.registry import describe_workload, workload_names

    list_rows("workloads", ((name, describe_workload(name)) for name in workload_names()))


if __name__ == "__main__":
    app()
