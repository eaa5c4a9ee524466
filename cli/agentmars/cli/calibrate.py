"""``agentmars calibrate``: measure a running vLLM server and write a fitted profile."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentmars.server.profiles.calibrate import (
    Fit,
    Recording,
    fit_recording,
    fitted_profile,
    kv_bytes_per_token_from_config,
)
from agentmars.server.profiles.cost_model import EngineLimits, profile_json
from agentmars.server.profiles.measure import (
    CalibrationError,
    ServerFacts,
    design_probes,
    record,
    server_facts,
)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

# vLLM's defaults for the OpenAI server on the CPU platform, one worker
# (vLLM 0.32.0 vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults).
CPU_MAX_NUM_SEQS = 128
CPU_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_VOCAB_BOUND = 500
# PCIe Gen5 x16 at 80%, as in the GPU profiles. NOTE: on the CPU backend the KV already
# lives in host memory, so this tier is modelled, not measured.
DEFAULT_CPU_KV_BANDWIDTH = 64e9 * 0.8


@dataclass(frozen=True)
class CalibrateOptions:
    """The command's options (None: ask the server, else the default)."""

    url: str
    model: str | None
    out: Path
    name: str | None = None
    description: str | None = None
    record_path: Path | None = None
    from_recording: Path | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = CPU_MAX_NUM_SEQS
    max_num_batched_tokens: int = CPU_MAX_NUM_BATCHED_TOKENS
    kv_bytes_per_token: int | None = None
    hf_config: Path | None = None
    repeats: int = 2
    quick: bool = False
    seed: int = 0


class BadOption(ValueError):
    """A command-line value that cannot be used; the message says which and why."""


def run(options: CalibrateOptions) -> int:
    """Measure (or reload a recording), fit, write the profile; the exit code."""
    try:
        recording = (
            _load_recording(options.from_recording) if options.from_recording else _measure(options)
        )
        fit = fit_recording(recording)
        _print_fit(fit)
        cpu_blocks = recording.engine.num_gpu_blocks
        profile = fitted_profile(
            options.name or options.out.stem,
            recording,
            fit,
            cpu_kv_blocks=cpu_blocks,
            cpu_kv_bandwidth_bytes_s=DEFAULT_CPU_KV_BANDWIDTH,
            description=options.description,
        )
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(profile_json(profile))
    except BadOption as exc:
        err.print(f"error: {exc}")
        return 2
    except (CalibrationError, ValueError, OSError) as exc:
        err.print(f"error: {exc}")
        return 1
    out.print(f"profile written to {options.out}")
    return 0


def _measure(options: CalibrateOptions) -> Recording:
    if not options.model:
        raise BadOption("--model is required to measure a server (or give --from-recording)")
    facts = server_facts(options.url, options.model)
    engine = resolve_engine(options, facts)
    plans = design_probes(engine, repeats=options.repeats, quick=options.quick)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=False) as progress:
        task = progress.add_task(f"probing {options.model}", total=len(plans))
        recording = record(
            options.url,
            options.model,
            engine,
            plans,
            vocab_size=_vocab_bound(options),
            seed=options.seed,
            on_probe=lambda probe: progress.update(
                task, advance=1, description=f"probing {options.model} ({probe.kind})"
            ),
        )
    path = options.record_path or options.out.with_name(f"{options.out.stem}.recording.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(recording.model_dump_json() + "\n")
    out.print(f"measurements written to {path}")
    return recording


def resolve_engine(options: CalibrateOptions, facts: ServerFacts) -> EngineLimits:
    """The engine's limits: the options first, then what the server says."""
    block_size = options.block_size or facts.block_size
    blocks = options.num_gpu_blocks or facts.num_gpu_blocks
    max_model_len = options.max_model_len or facts.max_model_len
    missing = [
        flag
        for flag, value in (
            ("--block-size", block_size),
            ("--num-gpu-blocks", blocks),
            ("--max-model-len", max_model_len),
        )
        if value is None
    ]
    if missing:
        raise BadOption(f"the server does not say its {', '.join(missing)}: give them")
    try:
        return EngineLimits(
            block_size=block_size,
            num_gpu_blocks=blocks,
            max_model_len=max_model_len,
            max_num_seqs=options.max_num_seqs,
            max_num_batched_tokens=options.max_num_batched_tokens,
            kv_bytes_per_token=_kv_bytes_per_token(options),
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise BadOption(f"invalid engine limits: {problems}") from None


def _kv_bytes_per_token(options: CalibrateOptions) -> int:
    if options.kv_bytes_per_token:
        return options.kv_bytes_per_token
    if options.hf_config:
        return kv_bytes_per_token_from_config(_read_config(options.hf_config))
    raise BadOption("give --kv-bytes-per-token or --hf-config (the model's config.json)")


def _vocab_bound(options: CalibrateOptions) -> int:
    """Prompt token ids are drawn below this (any id the model knows will do)."""
    if options.hf_config:
        vocab = _read_config(options.hf_config).get("vocab_size")
        if isinstance(vocab, int) and vocab > 1:
            return vocab
    return DEFAULT_VOCAB_BOUND


def _read_config(path: Path) -> dict[str, object]:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadOption(f"--hf-config {path}: not a readable JSON file ({exc})") from None
    if not isinstance(config, dict):
        raise BadOption(f"--hf-config {path}: not a JSON object")
    return config


def _load_recording(path: Path) -> Recording:
    try:
        return Recording.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise BadOption(f"--from-recording {path}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise BadOption(
            f"--from-recording {path}: not a calibration recording ({problems})"
        ) from None


def _print_fit(fit: Fit) -> None:
    cost = fit.cost
    table = Table(title=f"fitted step time (R² {fit.r_squared:.4f})")
    for column in ("probe class", "equations", "mean |error|", "max |error|", "set aside"):
        table.add_column(column, justify="left" if column == "probe class" else "right")
    for kind, error in fit.errors.items():
        table.add_row(
            kind,
            str(error.rows),
            f"{error.mean_abs:.1%}",
            f"{error.max_abs:.1%}",
            str(error.outliers),
        )
    out.print(table)
    out.print(
        f"step = {cost.c0 * 1e3:.3f} ms + {cost.c1 * 1e6:.3f} µs/prefill token "
        f"+ {cost.c2 * 1e9:.4f} ns/attention pair + {cost.c3 * 1e6:.2f} µs/decoding seq "
        f"+ {cost.c4 * 1e9:.3f} ns/context token; request overhead "
        f"{fit.request_overhead_s * 1e3:.2f} ms"
    )
