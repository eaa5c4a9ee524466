"""Calibration: equations from probes, the fit, a real recording, and the HTTP prober
and command against loopback servers."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel

from agentmars.server.profiles.calibrate import (
    ProbeRecord,
    Recording,
    Row,
    StreamRecord,
    decode_rows,
    fit_recording,
    fit_rows,
    fitted_profile,
    kv_bytes_per_token_from_config,
    mixed_rows,
    nnls,
    prefill_features,
    recording_rows,
    resume_rows,
)
from agentmars.server.profiles.cost_model import (
    CostModel,
    EngineLimits,
    FittedCost,
    StepShape,
    fitted_step_time,
    load_profile,
)
from agentmars.server.profiles.measure import (
    CalibrationError,
    ProbePlan,
    design_probes,
    host_cpu_description,
    record,
    server_facts,
)
from agentmars.server.web.serving import serve_in_subprocess, serve_in_thread
from tests.server.profiles.paced_engine import COST, ENGINE, MODEL

DATA = Path(__file__).with_name("data")
PACED_ENGINE = [sys.executable, str(Path(__file__).with_name("paced_engine.py"))]
CLI = [sys.executable, "-m", "agentmars.cli.main", "calibrate"]


# --- equations from probes, by hand --------------------------------------------------------


def test_a_chunked_prompt_is_the_sum_of_its_chunks() -> None:
    # 5000 tokens, budget 2048: chunks 2048, 2048, 904 with attention
    # 2048*1024.5 + 2048*(2048+1024.5) + 904*(4096+452.5) = 12,502,500 pairs.
    assert prefill_features(5000, 2048) == (3.0, 5000.0, 12_502_500.0, 0.0, 0.0)


def test_decode_gaps_become_windows_of_steps() -> None:
    stream = StreamRecord(prompt_tokens=100, sent_s=0.0, token_s=[0.5, 1.0, 2.0, 3.0, 4.0])
    rows = decode_rows(ProbeRecord(kind="decode", streams=[stream]), window=2)
    # The first gap is left out; the three others form one window (the tail joins it).
    # Contexts: 100 + 2, 100 + 3, 100 + 4 tokens so far.
    assert rows == [Row("decode", 3.0, (3.0, 0.0, 0.0, 3.0, 309.0))]


def test_a_mixed_step_is_the_gap_that_ends_with_the_injected_first_token() -> None:
    decoders = [
        StreamRecord(prompt_tokens=10, sent_s=0.0, token_s=[0.1, 0.2, 0.3, 0.5, 0.6]),
        StreamRecord(prompt_tokens=20, sent_s=0.0, token_s=[0.1, 0.2, 0.3, 0.5, 0.6]),
    ]
    injected = StreamRecord(prompt_tokens=50, sent_s=0.25, token_s=[0.501])
    probe = ProbeRecord(kind="mixed", streams=[*decoders, injected])
    # Gap 0.3 -> 0.5; each decoder had 3 tokens: context 13 + 23; attention 50*51/2.
    (row,) = mixed_rows(probe, budget=100)
    assert row.kind == "mixed" and row.seconds == pytest.approx(0.2)
    assert row.features == (1.0, 50.0, 1275.0, 2.0, 36.0)
    assert mixed_rows(probe, budget=51) == []  # 50 + 2 would not fit in one step


def test_a_resume_is_its_uncached_tokens_attending_to_the_cached() -> None:
    first = StreamRecord(prompt_tokens=300, sent_s=0.0, token_s=[0.05])
    second = StreamRecord(prompt_tokens=700, cached_tokens=256, sent_s=0.1, token_s=[0.16])
    (row,) = resume_rows(ProbeRecord(kind="resume", streams=[first, second]), budget=2048)
    # 444 new tokens after 256 cached: 444 * (2 * 256 + 444 + 1) / 2 = 212,454 pairs.
    assert row == Row("resume", pytest.approx(0.06), (1.0, 444.0, 212_454.0, 0.0, 0.0), 1)
    # Chunked: 3000 new after 1000 cached, budget 2048: 2048 * (2000 + 2049) / 2 +
    # 952 * (2 * 3048 + 953) / 2.
    assert prefill_features(3000, 2048, before=1000) == (
        2.0, 3000.0, 2048 * 4049 // 2 + 952 * 7049 // 2, 0.0, 0.0,
    )  # fmt: skip


# --- solving -------------------------------------------------------------------------------


def test_nnls_clamps_what_least_squares_would_make_negative() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = np.array([2.0, -1.0, 1.0])
    # Unconstrained: x = (2, -1). With x >= 0: x2 = 0, x1 minimises (x1-2)^2 + (x1-1)^2.
    assert nnls(a, b) == pytest.approx([1.5, 0.0])


def test_nnls_agrees_with_scipy() -> None:
    from scipy import optimize  # a dev dependency, there only as this reference

    generator = np.random.default_rng(7)
    for _ in range(20):
        a = generator.normal(size=(30, 6))
        b = generator.normal(size=30)
        assert nnls(a, b) == pytest.approx(optimize.nnls(a, b)[0], abs=1e-8)


def synthetic_rows(cost: FittedCost, overhead: float, noise: float, seed: int) -> list[Row]:
    """Rows of every probe class from a known model, with multiplicative noise."""
    step = fitted_step_time(cost)
    generator = random.Random(seed)
    rows = []

    def add(kind: Any, shape: StepShape, steps: int = 1, requests: int = 0) -> None:
        seconds = (step(shape) * steps + overhead * requests) * (1 + generator.gauss(0, noise))
        features = (
            float(steps),
            float(shape.prefill_tokens * steps),
            float(shape.prefill_attention * steps),
            float(shape.decode_seqs * steps),
            float(shape.decode_context * steps),
        )
        rows.append(Row(kind, seconds, features, requests))

    for tokens in (64, 128, 256, 512, 1024, 2048, 4096) * 3:
        add("prefill", StepShape(tokens, tokens * (tokens + 1) // 2), requests=1)
    for context in range(50, 4000, 150):
        add("decode", StepShape(decode_seqs=1, decode_context=context), steps=4)
    for seqs in (2, 4, 8, 16, 32, 64):
        for context in (200, 1000):
            add("batch", StepShape(decode_seqs=seqs, decode_context=seqs * context), steps=4)
    for tokens in (128, 512, 1000) * 2:
        add("mixed", StepShape(tokens, tokens * (tokens + 1) // 2, 8, 8 * 300))
    return rows


def test_the_fit_recovers_known_coefficients_from_noisy_rows() -> None:
    truth = FittedCost(c0=0.02, c1=3e-5, c2=1e-8, c3=5e-4, c4=1e-6)
    fit = fit_rows(synthetic_rows(truth, overhead=0.004, noise=0.02, seed=3))
    got = fit.cost
    assert got.c0 == pytest.approx(truth.c0, rel=0.05)
    assert got.c1 == pytest.approx(truth.c1, rel=0.1)
    assert got.c2 == pytest.approx(truth.c2, rel=0.25)
    assert got.c3 == pytest.approx(truth.c3, rel=0.1)
    assert got.c4 == pytest.approx(truth.c4, rel=0.1)
    assert fit.request_overhead_s == pytest.approx(0.004, rel=0.3)
    assert fit.r_squared > 0.99
    assert set(fit.errors) == {"prefill", "decode", "batch", "mixed"}
    assert all(error.mean_abs < 0.04 for error in fit.errors.values())


def test_a_probe_slowed_by_another_process_is_set_aside() -> None:
    truth = FittedCost(c0=0.02, c1=3e-5, c2=1e-8, c3=5e-4, c4=1e-6)
    rows = synthetic_rows(truth, overhead=0.004, noise=0.01, seed=5)
    slowed = rows[20]  # the third 4096-token prompt, three times slower
    assert slowed.kind == "prefill" and slowed.features[1] == 4096
    rows[20] = Row(slowed.kind, 3 * slowed.seconds, slowed.features, slowed.requests)
    fit = fit_rows(rows)
    assert fit.errors["prefill"].outliers == 1
    assert fit.errors["prefill"].rows == 20
    assert fit.cost.c2 == pytest.approx(truth.c2, rel=0.1)
    assert fit.errors["prefill"].max_abs < 0.05


def test_the_fit_refuses_too_few_or_impossible_rows() -> None:
    row = Row("decode", 0.01, (1.0, 0.0, 0.0, 1.0, 10.0))
    with pytest.raises(ValueError, match="cannot determine"):
        fit_rows([row] * 3)
    with pytest.raises(ValueError, match="positive"):
        fit_rows([Row("decode", 0.0, (1.0, 0.0, 0.0, 1.0, 10.0))] * 8)


# --- a real recording ------------------------------------------------------------------------


def test_the_recorded_paced_engine_gives_back_its_coefficients() -> None:
    """tests/server/profiles/data/paced-engine-recording.json: ``agentmars calibrate`` run
    against paced_engine.py (full grid, 2 repeats). The engine's steps last exactly
    COST, plus asyncio's timer overshoot (~1 ms on this machine) in c0."""
    recording = Recording.model_validate_json((DATA / "paced-engine-recording.json").read_text())
    fit = fit_recording(recording)
    got = fit.cost
    assert COST.c0 <= got.c0 < COST.c0 + 0.003
    assert got.c1 == pytest.approx(COST.c1, rel=0.1)
    assert got.c2 == pytest.approx(COST.c2, rel=0.25)
    assert got.c3 == pytest.approx(COST.c3, rel=0.1)
    assert got.c4 == pytest.approx(COST.c4, rel=0.15)
    assert fit.r_squared > 0.99
    assert all(error.mean_abs < 0.1 for error in fit.errors.values())
    profile = fitted_profile(
        "paced", recording, fit, cpu_kv_blocks=1024, cpu_kv_bandwidth_bytes_s=51.2e9
    )
    assert profile.num_gpu_blocks == ENGINE.num_gpu_blocks
    assert profile.cost == got
    assert "R^2" in profile.sources[0]


def assert_same_fit(shipped: object, fitted: object) -> None:
    """The shipped profile is this recording's fit: the same coefficients to the last
    few bits (a least-squares fit on another CPU's BLAS kernels rounds differently)."""
    assert isinstance(shipped, BaseModel) and isinstance(fitted, BaseModel)
    numbers, fitted_numbers = (
        {k: v for k, v in fit.model_dump().items() if isinstance(v, float)}
        for fit in (shipped, fitted)
    )
    assert shipped.model_dump().keys() == fitted.model_dump().keys()
    assert numbers == pytest.approx(fitted_numbers, rel=1e-9)


def test_the_vllm_cpu_recording_fits_and_is_the_shipped_cpu_tiny() -> None:
    """tests/server/profiles/data/cpu-tiny-recording.json: ``agentmars calibrate`` against
    vLLM 0.32.0's CPU engine serving the tiny Llama (docs/cost-model.md)."""
    recording = Recording.model_validate_json((DATA / "cpu-tiny-recording.json").read_text())
    assert recording.engine.block_size == 128  # vLLM's CPU block size
    fit = fit_recording(recording)
    assert fit.r_squared > 0.95
    # A step of the tiny model costs milliseconds, and more context costs more.
    assert 0.001 < fit.cost.c0 < 0.02
    assert fit.cost.c4 > 0 and fit.cost.c3 > 0
    assert set(fit.errors) == {"prefill", "decode", "batch", "mixed"}
    shipped = load_profile("cpu-tiny")
    assert_same_fit(shipped.cost, fit.cost)
    assert shipped.model_dump(include=set(EngineLimits.model_fields)) == (
        recording.engine.model_dump()
    )


def test_the_operating_point_recording_fits_and_is_the_shipped_cpu_tiny_avx2() -> None:
    """tests/server/profiles/data/cpu-tiny-avx2-recording.json: the calibration that
    ``agentmars bench fidelity`` made on this project's current machine (docs/benchmarks.md,
    "Simulator fidelity and the real-stack operating point"), resume probes included."""
    recording = Recording.model_validate_json((DATA / "cpu-tiny-avx2-recording.json").read_text())
    assert recording.host is not None and "avx2" in recording.host
    fit = fit_recording(recording)
    assert fit.r_squared > 0.99
    assert set(fit.errors) == {"prefill", "decode", "batch", "mixed", "resume"}
    assert fit.errors["resume"].mean_abs < 0.05
    shipped = load_profile("cpu-tiny-avx2")
    assert_same_fit(shipped.cost, fit.cost)
    assert shipped.request_overhead_s == pytest.approx(fit.request_overhead_s, rel=1e-9)
    assert fit.request_overhead_s > 0
    assert recording.host in shipped.description
    # The operating point's engine: 64 blocks, contexts up to 4,096 tokens.
    assert (shipped.num_gpu_blocks, shipped.max_model_len) == (64, 4096)


def test_the_amx_hosts_recording_fits_and_is_the_shipped_cpu_tiny_amx() -> None:
    """tests/server/profiles/data/cpu-tiny-amx-recording.json: the calibration the
    OpenHands evaluation made on the project's 2026-11-28 machine (an Intel Xeon with
    AVX-512 and AMX; docs/openhands.md, "Evaluation"), where prefill is 41 times
    faster than on the AVX2 host of ``cpu-tiny-avx2``."""
    recording = Recording.model_validate_json((DATA / "cpu-tiny-amx-recording.json").read_text())
    assert recording.host is not None and "amx_bf16" in recording.host
    fit = fit_recording(recording)
    assert fit.r_squared > 0.99
    assert set(fit.errors) == {"prefill", "decode", "batch", "mixed", "resume"}
    shipped = load_profile("cpu-tiny-amx")
    assert_same_fit(shipped.cost, fit.cost)
    assert shipped.request_overhead_s == pytest.approx(fit.request_overhead_s, rel=1e-9)
    assert recording.host in shipped.description
    assert shipped.cost.c1 * 40 < load_profile("cpu-tiny-avx2").cost.c1
    assert (shipped.num_gpu_blocks, shipped.max_model_len) == (320, 32768)


def test_the_deep_models_recording_fits_and_is_the_shipped_cpu_deep_amx() -> None:
    """tests/server/profiles/data/cpu-deep-amx-recording.json: a 16-layer random model
    (``tiny_model --layers 16 --hidden 256 --mlp 512``) on the AMX host, the shape that
    gives this host's engine the AVX2 host's prefill time per token again, so the
    real-stack point of docs/results/mars.md is contended here too."""
    recording = Recording.model_validate_json((DATA / "cpu-deep-amx-recording.json").read_text())
    assert recording.host is not None and "amx_bf16" in recording.host
    fit = fit_recording(recording)
    assert fit.r_squared > 0.95
    shipped = load_profile("cpu-deep-amx")
    assert_same_fit(shipped.cost, fit.cost)
    assert shipped.request_overhead_s == pytest.approx(fit.request_overhead_s, rel=1e-9)
    assert recording.host in shipped.description
    assert shipped.cost.c1 == pytest.approx(load_profile("cpu-tiny-avx2").cost.c1, rel=0.15)
    # 16 layers of 256 dimensions, keys and values in bfloat16.
    assert shipped.kv_bytes_per_token == 16 * 2 * 256 * 2


def test_every_probe_of_the_recording_gives_equations() -> None:
    recording = Recording.model_validate_json((DATA / "paced-engine-recording.json").read_text())
    kinds = {row.kind for row in recording_rows(recording)}
    assert kinds == {"prefill", "decode", "batch", "mixed"}


# --- the probe grid -------------------------------------------------------------------------


@pytest.mark.parametrize("quick", [False, True])
def test_probes_stay_inside_the_engine_limits(quick: bool) -> None:
    engine = EngineLimits(
        block_size=128,
        num_gpu_blocks=200,
        max_model_len=8192,
        max_num_seqs=128,
        max_num_batched_tokens=2048,
        kv_bytes_per_token=1024,
    )
    plans = design_probes(engine, repeats=2, quick=quick)
    assert {plan.kind for plan in plans} == {"prefill", "decode", "batch", "mixed", "resume"}
    for plan in plans:
        assert len(plan.prompt_tokens) <= engine.max_num_seqs
        assert sum(plan.prompt_tokens) + sum(plan.max_tokens) <= 200 * 128
        assert max(plan.prompt_tokens) + max(plan.max_tokens) <= engine.max_model_len
        if plan.kind == "mixed":
            assert plan.prompt_tokens[-1] + len(plan.prompt_tokens) - 1 <= 2048
        if plan.kind == "resume":  # the second prompt extends the first
            cached, whole = plan.prompt_tokens
            assert 0 < cached < whole
    prefill = sorted({plan.prompt_tokens[0] for plan in plans if plan.kind == "prefill"})
    assert prefill[-1] > 2048  # some prompts are chunked
    assert plans.count(plans[0]) == 2


def test_a_tiny_kv_cache_cannot_be_probed() -> None:
    engine = EngineLimits(
        block_size=16,
        num_gpu_blocks=4,
        max_model_len=64,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        kv_bytes_per_token=1,
    )
    with pytest.raises(CalibrationError, match="too small"):
        design_probes(engine)


def test_kv_bytes_per_token_from_a_model_config() -> None:
    tiny = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128}
    # 2 (K, V) x 2 layers x 4 KV heads x 32 head_dim x 2 bytes.
    assert kv_bytes_per_token_from_config(tiny) == 1024
    assert kv_bytes_per_token_from_config({**tiny, "num_key_value_heads": 1}) == 256
    with pytest.raises(ValueError, match="num_hidden_layers"):
        kv_bytes_per_token_from_config({"num_attention_heads": 4, "hidden_size": 128})


# --- measuring a loopback server -------------------------------------------------------------


@pytest.fixture(scope="module")
def paced_url() -> Iterator[str]:
    with serve_in_subprocess(PACED_ENGINE) as url:
        yield url


def test_the_server_says_its_limits(paced_url: str) -> None:
    facts = server_facts(paced_url, MODEL)
    assert (facts.max_model_len, facts.block_size, facts.num_gpu_blocks) == (4096, 16, 1024)
    with pytest.raises(CalibrationError, match="does not serve 'other'; it serves: paced-tiny"):
        server_facts(paced_url, "other")


def test_measuring_the_paced_engine_recovers_its_coefficients(paced_url: str) -> None:
    """End to end over HTTP: probes, timings, equations, fit (few probes, so loose)."""
    plans = design_probes(ENGINE, repeats=2, quick=True)
    seen: list[str] = []
    recording = record(
        paced_url, MODEL, ENGINE, plans, vocab_size=500, on_probe=lambda p: seen.append(p.kind)
    )
    assert seen == [plan.kind for plan in plans]
    for plan, probe in zip(plans, recording.probes, strict=True):
        assert [s.prompt_tokens for s in probe.streams] == list(plan.prompt_tokens)
        assert [len(s.token_s) for s in probe.streams] == list(plan.max_tokens)
    got = fit_recording(recording).cost
    # Timers are late, never early, so c0 comes out high; but the engine starts a step
    # where the previous one was due to end (live.CATCH_UP_S), so a step after a late
    # one is measured a little short and the fit may land just under c0 (4 µs once).
    assert COST.c0 - 0.001 <= got.c0 < COST.c0 + 0.005
    assert got.c1 == pytest.approx(COST.c1, rel=0.25)
    assert got.c2 == pytest.approx(COST.c2, rel=0.5)
    assert got.c3 == pytest.approx(COST.c3, rel=0.25)
    assert got.c4 == pytest.approx(COST.c4, rel=0.25)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, check=False)


def test_the_command_measures_fits_and_writes_a_profile(paced_url: str, tmp_path: Path) -> None:
    out = tmp_path / "paced.json"
    done = _run_cli(
        "--url", paced_url, "--model", MODEL, "--out", str(out), "--quick", "--repeats", "1",
        "--kv-bytes-per-token", "1024", "--max-num-seqs", "32", "--max-num-batched-tokens", "1024",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = load_profile(str(out))
    assert profile.name == "paced"
    assert (profile.block_size, profile.num_gpu_blocks, profile.max_model_len) == (16, 1024, 4096)
    assert profile.cost.kind == "fitted"
    assert CostModel(profile).decode_time(100) > 0
    recording = Recording.model_validate_json((tmp_path / "paced.recording.json").read_text())
    assert len(recording.probes) == len(design_probes(ENGINE, repeats=1, quick=True))
    # The machine is named: a CPU engine's profile predicts only the host it was fitted on.
    assert recording.host == host_cpu_description()
    assert recording.host in profile.description
    assert "prefill" in done.stdout and "written to" in done.stdout
    # The same recording fits again offline, into the same profile.
    again = tmp_path / "again.json"
    done = _run_cli("--from-recording", str(tmp_path / "paced.recording.json"), "--out", str(again),
                    "--name", "paced")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert load_profile(str(again)).cost == profile.cost


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _html_app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> HTMLResponse:
        return HTMLResponse("<html>hello</html>")

    return app


def test_command_errors_are_clear_and_traceback_free(tmp_path: Path) -> None:
    out = str(tmp_path / "p.json")
    down = _run_cli("--url", f"http://127.0.0.1:{_free_port()}", "--model", "m", "--out", out)
    assert down.returncode == 1 and "no server answers at" in down.stderr
    with serve_in_thread(_html_app()) as url:
        html = _run_cli("--url", url, "--model", "m", "--out", out)
    assert html.returncode == 1 and "is not an OpenAI-compatible server" in html.stderr
    missing = _run_cli("--out", out)
    assert missing.returncode == 2 and "--model is required" in missing.stderr
    junk = tmp_path / "junk.json"
    junk.write_text('{"format": "something else"}')
    refit = _run_cli("--from-recording", str(junk), "--out", out)
    assert refit.returncode == 2 and "not a calibration recording" in refit.stderr
    for done in (down, html, missing, refit):
        assert "Traceback" not in done.stderr
    assert not Path(out).exists()


def test_the_command_needs_the_kv_bytes_per_token(paced_url: str, tmp_path: Path) -> None:
    done = _run_cli("--url", paced_url, "--model", MODEL, "--out", str(tmp_path / "p.json"))
    assert done.returncode == 2
    assert "--kv-bytes-per-token or --hf-config" in done.stderr


def test_tokens_with_empty_text_count_by_their_running_usage() -> None:
    # vLLM: a token that decodes to no text yet still comes with its usage.
    empty = {"text": "", "finish_reason": None}
    last = {"text": "", "finish_reason": "length"}
    chunks = [
        _chunk({"choices": [empty], "usage": {"completion_tokens": 1}}),
        _chunk({"choices": [last], "usage": {"completion_tokens": 2}}),
        _chunk({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 2}}),
        "data: [DONE]\n\n",
    ]
    with serve_in_thread(_streaming_app(chunks, "text/event-stream")) as url:
        recording = record(url, MODEL, ENGINE, [ProbePlan("decode", (16,), (2,))], vocab_size=500)
    (stream,) = recording.probes[0].streams
    assert len(stream.token_s) == 2 and stream.prompt_tokens == 16


def _streaming_app(chunks: list[str], media_type: str) -> FastAPI:
    """Answers every completion with ``chunks``, as a real server would not."""
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> StreamingResponse:
        async def body() -> Any:
            for chunk in chunks:
                yield chunk

        return StreamingResponse(body(), media_type=media_type)

    return app


def _chunk(payload: dict[str, Any]) -> str:
    import json

    return f"data: {json.dumps(payload)}\n\n"


@pytest.mark.parametrize(
    ("chunks", "media_type", "message"),
    [
        (['{"id": 1}'], "application/json", "not an event stream"),
        (["data: hello\n\n"], "text/event-stream", "stream chunk is not JSON"),
        ([_chunk({"id": "x"})], "text/event-stream", "not an OpenAI completion chunk"),
        ([_chunk({"error": {"message": "boom"}})], "text/event-stream", "reported an error"),
        # Two of four tokens in one chunk: step times would be wrong.
        (
            [
                _chunk({"choices": [{"text": "a", "finish_reason": None}]}),
                _chunk({"choices": [{"text": "b", "finish_reason": "length"}]}),
                _chunk({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 4}}),
                "data: [DONE]\n\n",
            ],
            "text/event-stream",
            "one chunk per token",
        ),
    ],
)
def test_non_openai_streams_are_refused(chunks: list[str], media_type: str, message: str) -> None:
    plan = ProbePlan("decode", (16,), (4,))
    with (
        serve_in_thread(_streaming_app(chunks, media_type)) as url,
        pytest.raises(CalibrationError, match=message),
    ):
        record(url, MODEL, ENGINE, [plan], vocab_size=500)


def test_a_mixed_window_timed_far_too_short_is_set_aside() -> None:
    # A mixed probe whose prefill fell into another step leaves a window 20x too short;
    # under relative weights alone it would outweigh every other equation (seen on a
    # real vLLM recording: a 2032-token prefill "taking" 2 ms).
    truth = FittedCost(c0=0.02, c1=3e-5, c2=1e-8, c3=5e-4, c4=1e-6)
    rows = synthetic_rows(truth, overhead=0.004, noise=0.01, seed=7)
    index = next(i for i, row in enumerate(rows) if row.kind == "mixed" and row.features[1] == 1000)
    short = rows[index]
    rows[index] = Row(short.kind, short.seconds / 20, short.features, short.requests)
    fit = fit_rows(rows)
    assert fit.errors["mixed"].outliers == 1
    assert fit.cost.c1 == pytest.approx(truth.c1, rel=0.1)
    assert fit.cost.c3 == pytest.approx(truth.c3, rel=0.1)
    assert fit.r_squared > 0.99


def test_the_host_is_described_by_its_cpu_and_speed_features() -> None:
    cpuinfo = (
        "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 fma\n"
    )
    assert host_cpu_description(cpuinfo) == "AMD EPYC 7B13, 2 logical CPUs, avx2"
    sapphire = "processor : 0\nmodel name : Xeon\nflags : avx2 avx512f avx512_bf16 amx_bf16\n"
    assert (
        host_cpu_description(sapphire) == "Xeon, 1 logical CPUs, avx2 avx512f avx512_bf16 amx_bf16"
    )
    assert host_cpu_description("") == "unknown CPU, 0 logical CPUs, no AVX2"
