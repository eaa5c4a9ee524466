"""``agentmars serve``: vLLM with the agentmars scheduler plugin, and the gateway in
front of it, as one command that starts both and stops both.

vLLM runs as a child process group (its own Python environment, ``--vllm-python``),
with ``--scheduler-cls`` naming the plugin and the policy in its environment. Once it
answers ``/health`` the gateway serves in this process, linked to the plugin by the side
channel (two ZMQ sockets in a private temporary directory: the plugin's KV figures in,
the stream's events out). SIGINT or SIGTERM, at any point, stops the gateway and then
vLLM's whole group, so nothing is left running.
"""

from __future__ import annotations

import dataclasses
import signal
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

from agentmars.sdk.otlp import traces_endpoint_from_env
from agentmars.server.engines.vllm.launch import (
    CPU_BLOCK_SIZE,
    VllmServerConfig,
    check_kv_holds_context,
    serve_vllm,
)
from agentmars.server.engines.vllm.plugin_config import PluginConfig, PluginConfigError
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app, run_gateway
from agentmars.server.policies.capabilities import Capability

PLUGIN_CLASS = "agentmars.server.engines.vllm.plugin.AgentmarsScheduler"
VLLM_PYTHON_ENV = "AGENTMARS_VLLM_PYTHON"


class ServeError(ValueError):
    """A setting ``agentmars serve`` cannot start with; the message says which."""


@dataclass(frozen=True)
class ServeOptions:
    model: Path
    policy: str
    host: str
    port: int
    token: str
    vllm_python: Path
    log_path: Path
    max_model_len: int
    num_blocks: int
    cores: str | None
    vllm_args: tuple[str, ...]
    profile: str | None = None
    """The plugin's cost profile (``AGENTMARS_PROFILE``)."""
    cpu_kv_blocks: int | None = None
    """The CPU KV tier's size in KV blocks (``--cpu-kv-blocks``; 0: none); None: as many
    as the GPU's (seed 003's tight 1x) for a policy whose engine half needs or uses a
    CPU tier, else none."""

    def cpu_tier_blocks(self) -> int:
        """The CPU tier vLLM starts with (``cpu_kv_blocks``, or its default)."""
        if self.cpu_kv_blocks is not None:
            return self.cpu_kv_blocks
        try:
            _, half = self._plugin_config(cpu_tier=True).make_engine_half()
        except PluginConfigError:
            return 0  # check() says why
        return self.num_blocks if Capability.CPU_TIER in half.needs | half.uses else 0

    def _plugin_config(self, *, cpu_tier: bool) -> PluginConfig:
        env = {"AGENTMARS_POLICY": self.policy, "AGENTMARS_HINTS_ADDR": "ipc://check"}
        if self.profile is not None:
            env["AGENTMARS_PROFILE"] = self.profile
        return dataclasses.replace(PluginConfig.from_env(env), cpu_tier=cpu_tier)

    def check(self) -> None:
        if not (self.model / "config.json").is_file():
            raise ServeError(f"--model {self.model}: not a model directory (no config.json)")
        if not self.vllm_python.is_file():
            raise ServeError(
                f"the vLLM python {self.vllm_python} does not exist; "
                f"make it with scripts/vllm-env.sh and pass --vllm-python or ${VLLM_PYTHON_ENV}"
            )
        try:
            check_kv_holds_context(self.num_blocks, self.max_model_len)
        except ValueError as error:
            raise ServeError(f"--num-blocks {self.num_blocks}: {error}") from None
        if self.cpu_kv_blocks is not None and self.cpu_kv_blocks < 0:
            raise ServeError(f"--cpu-kv-blocks {self.cpu_kv_blocks}: must not be negative")
        # The plugin's own check, before vLLM takes a minute to start and refuse.
        try:
            config = self._plugin_config(cpu_tier=self.cpu_tier_blocks() > 0)
            config.make_engine_half()
            config.costs()
        except PluginConfigError as error:
            raise ServeError(str(error)) from None


def announce(host: str, port: int, engine: str) -> None:
    """The gateway's address (first line: scripts read it) and its dashboard's."""
    print(f"agentmars: gateway on http://{host}:{port}, {engine}", flush=True)
    print(
        f"agentmars: dashboard on http://{host}:{port}/dashboard#token=<the gateway token>",
        flush=True,
    )


def stop_on_sigterm() -> None:
    """SIGTERM raises like SIGINT does, so the context managers stop vLLM's group
    even while it is still starting (uvicorn handles both itself once it serves)."""

    def stop(signum: int, frame: types.FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _plugin_env(options: ServeOptions, sockets: str) -> dict[str, str]:
    """The plugin's settings (plugin_config.py), in vLLM's environment."""
    env = {
        "AGENTMARS_POLICY": options.policy,
        "AGENTMARS_KV_STATUS_ADDR": f"ipc://{sockets}/kv",
        "AGENTMARS_HINTS_ADDR": f"ipc://{sockets}/hints",
    }
    if options.profile is not None:
        env["AGENTMARS_PROFILE"] = options.profile
    return env


def serve(options: ServeOptions) -> int:
    options.check()
    stop_on_sigterm()
    engine = VllmServerConfig(
        python=options.vllm_python,
        model=options.model,
        max_model_len=options.max_model_len,
        num_blocks=options.num_blocks,
        cores=options.cores,
        otlp_traces_endpoint=traces_endpoint_from_env(),
        cpu_kv_blocks=options.cpu_tier_blocks(),
        extra_args=("--scheduler-cls", PLUGIN_CLASS, *options.vllm_args),
    )
    try:
        with (
            tempfile.TemporaryDirectory(prefix="agentmars-") as sockets,
            serve_vllm(engine, options.log_path, env=_plugin_env(options, sockets)) as engine_url,
        ):
            gateway = GatewayConfig(
                upstream_url=engine_url,
                token=options.token,
                policy=options.policy,
                block_size=CPU_BLOCK_SIZE,
                plugin_kv_address=f"ipc://{sockets}/kv",
                plugin_hints_address=f"ipc://{sockets}/hints",
            )
            app = create_gateway_app(gateway)
            announce(options.host, options.port, f"engine {engine_url}")
            run_gateway(app, options.host, options.port)
    except KeyboardInterrupt:
        pass
    return 0
