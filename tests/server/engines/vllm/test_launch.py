"""The vLLM server's command line and environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentmars.server.engines.vllm.launch import VllmServerConfig, server_argv, server_env

PYTHON = Path("/envs/vllm/bin/python")
MODEL = Path("/cache/models/tiny-llama-abc")


def test_default_command_runs_the_module_with_fixed_kv_capacity() -> None:
    config = VllmServerConfig(python=PYTHON, model=MODEL)
    assert server_argv(config) == [
        "/envs/vllm/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/cache/models/tiny-llama-abc",
        "--served-model-name",
        "tiny-llama",
        "--host",
        "127.0.0.1",
        "--max-model-len",
        "32768",
        "--num-gpu-blocks-override",
        "512",
        "--kv-cache-memory-bytes",
        "1073741824",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "pythonic",
        "--enable-prompt-tokens-details",
    ]
    assert server_env(config) == {}


def test_cores_pin_the_whole_server_and_its_compute_threads() -> None:
    config = VllmServerConfig(
        python=PYTHON, model=MODEL, cores="0", extra_args=("--scheduling-policy", "priority")
    )
    argv = server_argv(config)
    assert argv[:4] == ["taskset", "-c", "0", "/envs/vllm/bin/python"]
    assert argv[-2:] == ["--scheduling-policy", "priority"]
    assert server_env(config) == {"VLLM_CPU_OMP_THREADS_BIND": "0"}


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_blocks must be positive"):
        VllmServerConfig(python=PYTHON, model=MODEL, num_blocks=0)


def test_the_kv_must_hold_one_longest_context_beside_the_null_block() -> None:
    # 4096 tokens are 32 blocks of 128, plus the block pool's null block.
    with pytest.raises(ValueError, match="needs 33 blocks of 128 tokens"):
        VllmServerConfig(python=PYTHON, model=MODEL, num_blocks=32, max_model_len=4096)
    with pytest.raises(ValueError, match="needs 33 blocks"):
        VllmServerConfig(python=PYTHON, model=MODEL, num_blocks=32, max_model_len=3969)
    VllmServerConfig(python=PYTHON, model=MODEL, num_blocks=33, max_model_len=4096)
    VllmServerConfig(python=PYTHON, model=MODEL, num_blocks=32, max_model_len=3968)


def test_a_cpu_tier_starts_vllm_with_the_agentmars_offloading_connector() -> None:
    config = VllmServerConfig(python=PYTHON, model=MODEL, cpu_kv_blocks=512)
    argv = server_argv(config)
    connector = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert connector["kv_connector"] == "OffloadingConnector"
    assert connector["kv_connector_extra_config"]["agentmars_cpu_blocks"] == 512
    assert "--kv-transfer-config" not in server_argv(VllmServerConfig(python=PYTHON, model=MODEL))
    with pytest.raises(ValueError, match="cpu_kv_blocks must not be negative"):
        VllmServerConfig(python=PYTHON, model=MODEL, cpu_kv_blocks=-1)
