"""The simulator against the real engine (issue 11): one replayed mix of agent sessions
on the real stack and in the simulator, side by side, with the relative error.

Per load (an arrival rate) and policy, the same mix (``session_mix.build_mix``: a
registered workload cut to the tiny model) runs three ways:

- real: ``agentmars serve --engine vllm`` (gateway, vLLM CPU with the plugin and the
  policy, engine on its own core) with agents replaying the mix over HTTP
  (``session_mix.run_policy``);
- sim: the discrete-event simulator (``sim.engine.SimEngine``) with the profile
  fitted to this engine, the same KV blocks, and the tools as pure waits of the
  replayed durations;
- twin: ``agentmars serve --engine sim``, the simulated engine paced to the wall
  clock from the same profile, behind the same gateway and agents.

The profile is fitted here first unless one is given: ``agentmars calibrate`` against
vLLM started with the run's model, blocks, context and cores, so the simulator
predicts the engine of this host, whatever its speed (a profile fitted on another
machine is off by that machine's speed; docs/cost-model.md).

Figures (as ``session_mix.summarize`` computes them): mean and P95 session latency
(the first call's submit to the last call's end), mean time to first token of the
calls that follow a tool, and the prefix-cache hit rate; each model's error is
``model / real - 1``. Target: within 10% on mean and P95 latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentmars.bench.report import progress_bars, publish
from agentmars.bench.session_mix import FIGURES as SESSION_MIX_FIGURES
from agentmars.bench.session_mix import (
    EngineShape,
    Figure,
    MixShape,
    ReplaySession,
    SessionResult,
    build_mix,
    check_fits,
    pinned,
    run_policy,
    summarize,
)
from agentmars.cli.calibrate import CalibrateOptions
from agentmars.cli.calibrate import run as calibrate
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME, VllmServerConfig, serve_vllm
from agentmars.server.metrics.records import RunRecord, SessionRecord
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import Profile, load_profile
from agentmars.server.sim.engine import SimConfig, SimEngine
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload

TARGET_ERROR = 0.10
"""On mean and P95 session latency (Vidur, the reference LLM-serving simulator,
reports under 9%)."""
MODELS = ("sim", "twin")
console = Console(stderr=True)
_READ = dict(SESSION_MIX_FIGURES)
FIGURES: tuple[tuple[str, Figure], ...] = (
    ("mean latency s", _READ["session latency mean s"]),
    ("P95 latency s", _READ["session latency p95 s"]),
    ("mean TTFT after tool s", _READ["TTFT after a tool, mean s"]),
    ("prefix hit rate", _READ["prefix-cache hit rate"]),
)
"""session_mix's figures, under the comparison's names."""


class FidelityError(ValueError):
    """The benchmark cannot run as asked; the message says what to change."""


@dataclass(frozen=True)
class Load:
    """One operating point: a name for the table and the arrival rate."""

    name: str
    rate: float


def parse_loads(text: str) -> list[Load]:
    """``light=0.2,saturated=0.6`` (or bare rates, named by their value)."""
    loads = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, rate = item.rpartition("=")
        try:
            value = float(rate)
        except ValueError:
            raise FidelityError(f"--loads: {item!r} is not NAME=RATE or a rate") from None
        if not (math.isfinite(value) and value > 0):
            raise FidelityError(f"--loads: the rate of {item!r} must be a positive number")
        loads.append(Load(name or f"{value:g}/s", value))
    if not loads:
        raise FidelityError("--loads: give at least one rate")
    return loads


# --- the simulator's side -----------------------------------------------------------


def mix_workload(mix: Sequence[ReplaySession], name: str) -> Workload:
    """The replayed mix as the simulator's workload: the same appends, outputs and
    arrival times; each tool a pure wait of its replayed duration (the agents sleep,
    so the tools use no CPU)."""
    sessions = [
        SessionSpec(
            session_id=session.session_id,
            arrival_s=session.arrival_s,
            turns=tuple(
                TurnSpec(
                    append_tokens=len(turn.append),
                    output_tokens=turn.output_tokens,
                    tool=None
                    if turn.tool is None
                    else ToolSpec(kind=turn.tool, wall_s=turn.tool_s),
                )
                for turn in session.turns
            ),
        )
        for session in mix
    ]
    return Workload(name=name, sessions=tuple(sessions))


def simulate(
    mix: Sequence[ReplaySession], policy: str, profile: Profile, engine: EngineShape
) -> dict[str, Any]:
    """The mix under ``policy`` in the simulator, summarised as the real replay is."""
    config = SimConfig(num_gpu_blocks=engine.num_blocks)
    record = SimEngine(mix_workload(mix, "fidelity"), make_policy(policy), profile, config).run()
    return summarize_record(policy, record)


def summarize_record(policy: str, record: RunRecord) -> dict[str, Any]:
    """``session_mix.summarize``'s figures from a simulated run."""
    if record.unfinished:
        raise FidelityError(f"{policy}: the simulation left {len(record.unfinished)} unfinished")
    results = [SessionResult(s.session_id, s.latency_s, _ttfts(s)) for s in record.sessions]
    counters = {
        "prefix_cache_queries": float(record.prefix_queries),
        "prefix_cache_hits": float(record.prefix_hits),
        "num_preemptions": float(record.preemptions),
    }
    return summarize(policy, results, counters, startup_s=0.0, replay_s=record.duration_s)


def _ttfts(session: SessionRecord) -> list[float]:
    return [call.ttft_s for call in session.calls if call.turn > 0]


# --- the comparison -----------------------------------------------------------------


def relative_error(model: float, real: float) -> float:
    return model / real - 1.0 if real and not math.isnan(real) else math.nan


def compare(real: dict[str, Any], models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each figure of the real run, each model's, and the model's error."""
    rows = {}
    for name, read in FIGURES:
        row: dict[str, float] = {"real": read(real)}
        for model, figures in models.items():
            row[model] = read(figures)
            row[f"{model} error"] = relative_error(row[model], row["real"])
        rows[name] = row
    return rows


def calibrated_profile(engine: EngineShape, out_dir: Path) -> Path:
    """Fit a profile to vLLM as the runs will start it (model, blocks, context, cores)."""
    config = VllmServerConfig(
        python=engine.vllm_python,
        model=engine.model,
        max_model_len=engine.max_model_len,
        num_blocks=engine.num_blocks,
        cores=engine.cores,
    )
    out = out_dir / "cpu-host.json"
    with serve_vllm(config, out_dir / "vllm-calibrate.log") as url:
        code = calibrate(
            CalibrateOptions(
                url=url,
                model=SERVED_MODEL_NAME,
                out=out,
                name="cpu-host",
                hf_config=engine.model / "config.json",
                repeats=2,
            )
        )
    if code != 0:
        raise RuntimeError(f"agentmars calibrate failed (exit {code}); see above")
    return out.resolve()


def run(
    engine: EngineShape,
    shape: MixShape,
    loads: Sequence[Load],
    policies: Sequence[str],
    *,
    twin: bool,
    json_out: Path | None,
) -> dict[str, Any]:
    """Every load and policy, real and modelled; print the table, write the JSON."""
    if not policies:
        raise FidelityError("--policies: give at least one policy")
    check_fits(engine.num_blocks, shape.max_context)
    engine.log_dir.mkdir(parents=True, exist_ok=True)
    with pinned(engine.agent_cores):
        if engine.profile is None:
            engine = replace(engine, profile=str(calibrated_profile(engine, engine.log_dir)))
        assert engine.profile is not None
        profile = load_profile(engine.profile)
        points: list[dict[str, Any]] = []
        total = len(loads) * len(policies)
        with progress_bars() as show:
            phase = f"load x policy (real{' + twin' if twin else ''} + sim)"
            for load in loads:
                mix = build_mix(replace(shape, rate=load.rate))
                for policy in policies:
                    show(phase, len(points), total)
                    points.append(_point(engine, profile, load, policy, mix, twin=twin))
                    console.log(_point_line(points[-1]))
            show(phase, total, total)
    figures = {
        "mix": asdict(shape),
        "loads": [asdict(load) for load in loads],
        "profile": engine.profile,
        "engine": {"num_blocks": engine.num_blocks, "max_model_len": engine.max_model_len,
                   "cores": engine.cores, "agent_cores": engine.agent_cores},
        "target_error": TARGET_ERROR,
        "points": points,
    }  # fmt: skip
    return publish(table(figures), figures, json_out)


def _point(
    engine: EngineShape,
    profile: Profile,
    load: Load,
    policy: str,
    mix: list[ReplaySession],
    *,
    twin: bool,
) -> dict[str, Any]:
    real = run_policy(engine, policy, mix)
    models = {"sim": simulate(mix, policy, profile, engine)}
    if twin:
        models["twin"] = run_policy(replace(engine, twin=True), policy, mix)
    return {
        "load": load.name,
        "rate": load.rate,
        "policy": policy,
        "calls": sum(len(s.turns) for s in mix),
        "real": real,
        "models": models,
        "comparison": compare(real, models),
    }


def _point_line(point: dict[str, Any]) -> str:
    """One finished point, while the others run."""
    row = point["comparison"]["mean latency s"]
    models = ", ".join(f"{m} {row[m]:.2f} s ({row[f'{m} error']:+.1%})" for m in MODELS if m in row)
    return f"{point['load']} {point['policy']}: mean latency real {row['real']:.2f} s, {models}"


def worst_latency_error(figures: dict[str, Any], model: str = "sim") -> float:
    """The largest |error| on mean or P95 latency over every point."""
    errors = [
        abs(point["comparison"][name][f"{model} error"])
        for point in figures["points"]
        for name in ("mean latency s", "P95 latency s")
        if f"{model} error" in point["comparison"][name]
    ]
    return max(errors, default=math.nan)


def table(figures: dict[str, Any]) -> Table:
    mix = figures["mix"]
    points = figures["points"]
    models = [m for m in MODELS if points and m in points[0]["models"]]
    out = Table(
        title=(
            f"simulator vs vLLM CPU: {mix['sessions']} {mix['workload']} sessions, "
            f"<= {mix['max_turns']} calls, contexts <= {mix['max_context']} tokens, "
            f"{figures['engine']['num_blocks']} KV blocks; profile {figures['profile']}"
        )
    )
    out.caption = (
        ", ".join(
            f"worst {m} error on latency {worst_latency_error(figures, m):.1%}" for m in models
        )
        + f" (target {TARGET_ERROR:.0%})"
    )
    for column in ("load", "policy", "figure"):
        out.add_column(column)
    for column in ("real", *models, *(f"{m} error" for m in models)):
        out.add_column(column, justify="right")
    for point in points:
        for name, _ in FIGURES:
            row = point["comparison"][name]
            out.add_row(
                f"{point['load']} ({point['rate']:g}/s)",
                point["policy"],
                name,
                f"{row['real']:.3f}",
                *(f"{row[m]:.3f}" for m in models),
                *(_error_cell(row[f"{m} error"], name) for m in models),
            )
        busy = point["real"]["engine_load"].get("busy_fraction", math.nan)
        waiting = point["real"]["engine_load"].get("waiting_mean", math.nan)
        out.add_row("", "", f"real engine busy {busy:.2f}, waiting {waiting:.1f}", end_section=True)
    return out


def _error_cell(error: float, figure: str) -> str:
    text = f"{error:+.1%}"
    if "latency" in figure and not math.isnan(error):
        return f"[green]{text}[/green]" if abs(error) <= TARGET_ERROR else f"[red]{text}[/red]"
    return text


def plot_engine_load(figures: dict[str, Any], path: Path) -> None:
    """The real engine's load over each replay: calls waiting and KV in use, one
    column per load, one line per policy (the operating point's evidence)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    loads = list(dict.fromkeys(point["load"] for point in figures["points"]))
    figure = Figure(figsize=(4.5 * len(loads), 5.0))
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, len(loads), squeeze=False, sharex="col")
    for column, load in enumerate(loads):
        for point in (p for p in figures["points"] if p["load"] == load):
            series = point["real"]["engine_load"].get("series", [])
            seconds = [sample[0] for sample in series]
            busy = point["real"]["engine_load"].get("busy_fraction", math.nan)
            label = f"{point['policy']} (busy {busy:.2f})"
            axes[0][column].plot(seconds, [sample[2] for sample in series], label=label)
            axes[1][column].plot(seconds, [100 * sample[3] for sample in series], label=label)
        axes[0][column].set_title(f"{load}: {point['rate']:g} sessions/s")
        axes[0][column].set_ylabel("calls waiting")
        axes[1][column].set_ylabel("KV in use, %")
        axes[1][column].set_xlabel("seconds into the replay")
        axes[0][column].legend(fontsize="small")
    figure.suptitle("vLLM CPU under the replayed mix (agentmars bench fidelity)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
