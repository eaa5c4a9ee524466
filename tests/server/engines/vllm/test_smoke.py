"""The smoke check's parsing helpers, and (in the vLLM env) the smoke check itself."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, VllmServerConfig
from agentmars.server.engines.vllm.smoke import (
    PREFILL_TOKENS,
    SmokeError,
    metric_total,
    model_vocab_size,
    random_prompt,
    run_smoke,
)

EXPOSITION = """\
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 19968.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny-llama"} 1.7953141567241743e+09
vllm:prefix_cache_hits_total{engine="1",model_name="tiny-llama"} 128.0
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 30025.0
"""


def test_counter_total_sums_engines_and_skips_created_stamps() -> None:
    assert metric_total(EXPOSITION, "vllm:prefix_cache_hits") == 20096.0
    assert metric_total(EXPOSITION, "vllm:prefix_cache_queries") == 30025.0
    assert metric_total(EXPOSITION, "vllm:num_preemptions") == 0.0


def test_prompt_is_seeded_and_avoids_special_tokens() -> None:
    prompt = random_prompt(1000, vocab_size=8, seed=3)
    assert len(prompt) == 1000
    assert set(prompt) == {3, 4, 5, 6, 7}
    assert random_prompt(1000, vocab_size=8, seed=3) == prompt


def test_vocab_size_comes_from_the_model_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    assert model_vocab_size(tmp_path) == 512
    with pytest.raises(SmokeError, match="no readable vocab_size"):
        model_vocab_size(tmp_path / "missing")


@pytest.mark.slow
def test_tiny_model_serves_and_hits_the_prefix_cache(vllm_python: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    subprocess.run(
        [vllm_python, "-m", "agentmars.server.engines.vllm.tiny_model", "--out", model],
        check=True,
        capture_output=True,
    )
    config = VllmServerConfig(python=vllm_python, model=model)
    report = run_smoke(config, tmp_path / "server.log", model_vocab_size(model))
    # The repeat hits every full block of the 10,000-token prompt: 78 x 128 = 9,984.
    assert report.prefix_hit_tokens == PREFILL_TOKENS // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE == 9984
    assert report.prefill_hit_s < report.prefill_cold_s
    assert report.leftover_pids == ()
