"""``agentmars serve``: vLLM with the agentmars scheduler plugin, and the gateway in
front of it, as one command that starts both and stops both.

vLLM runs as a child process group (its own Python environment, ``--vllm-python``),
with ``--scheduler-cls`` naming the plugin and the policy in its environment. Once it
answers ``/health`` the gateway serves in this process, linked to the plugin by the side
channel (two ZMQ sockets in a private temporary directory: the plugin's KV figures in,
the stream's events out). SIGINT or SIGTERM, at any point, stops the gateway and then
vLLM's whole group, so nothing is left running.

With ``--replicas N``, N such vLLM servers start together, each on its share of the
CPUs (``replica_cores``), with its own plugin, side channel and log
(``vllm.log``, ``vllm.1.log``...); the gateway places each session on one of them by the
policy's ``place`` and keeps it there (``gateway.app``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

from agentmars.sdk.auth import GATEWAY_TOKEN_ENV
from agentmars.sdk.otlp import traces_endpoint_from_env
from agentmars.server.engines.vllm.launch import (
    CPU_BLOCK_SIZE,
    VllmReplica,
    VllmServerConfig,
    check_kv_holds_context,
    serve_vllm_replicas,
)
from agentmars.server.engines.vllm.plugin_config import PluginConfig, PluginConfigError
from agentmars.server.gateway.app import (
    EngineReplica,
    GatewayConfig,
    create_gateway_app,
    run_gateway,
)
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
    replicas: int = 1
    """vLLM servers behind the gateway, each with all of ``num_blocks`` and the CPU
    tier."""
    cpu_kv_blocks: int | None = None
    """The CPU KV tier's size in KV blocks (``--cpu-kv-blocks``; 0: none); None: as many
    as the GPU's (seed 003's tight 1x) for a policy whose engine half needs or uses a
    CPU tier, else none."""
    session_idle_s: float = 300.0
    """The gateway's final expiry of a quiet session (``GatewayConfig``)."""

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
        if self.replicas < 1:
            raise ServeError(f"--replicas {self.replicas}: must be at least 1")
        self.replica_cores()
        # The plugin's own check, before vLLM takes a minute to start and refuse.
        try:
            config = self._plugin_config(cpu_tier=self.cpu_tier_blocks() > 0)
            config.make_engine_half()
            config.costs()
        except PluginConfigError as error:
            raise ServeError(str(error)) from None

    def replica_cores(self) -> list[str | None]:
        """Each replica's CPUs: ``cores`` as given for one replica (None: vLLM's own
        choice); for several, ``cores`` (else the CPUs this process may use) shared out
        in order, in equal contiguous groups, the first groups one larger when they do
        not divide evenly (ours: replicas that share a core slow each other down, so
        each gets its own)."""
        if self.replicas == 1:
            return [self.cores]
        cpus = parse_cpu_list(self.cores) if self.cores else sorted(os.sched_getaffinity(0))
        if len(cpus) < self.replicas:
            raise ServeError(
                f"--replicas {self.replicas}: only {len(cpus)} CPUs to share out "
                f"({','.join(map(str, cpus))}); each replica needs one"
            )
        share, extra = divmod(len(cpus), self.replicas)
        groups: list[str | None] = []
        start = 0
        for index in range(self.replicas):
            size = share + (index < extra)
            groups.append(",".join(map(str, cpus[start : start + size])))
            start += size
        return groups


def parse_cpu_list(text: str) -> list[int]:
    """A CPU list as ``taskset -c`` takes it (``0,2-3``), in order, each CPU once."""
    cpus: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            span = range(int(first), int(last if dash else first) + 1)
        except ValueError:
            raise ServeError(f"--cores {text!r}: not a CPU list such as 0,2-3") from None
        if not span or span.start < 0:
            raise ServeError(f"--cores {text!r}: {part.strip()!r} is not a CPU range")
        cpus.extend(cpu for cpu in span if cpu not in cpus)
    return cpus


def announce(host: str, port: int, engine: str, token: str) -> None:
    """The gateway's address (first line: scripts read it) and its dashboard's, to open
    as it is: with the token when serve made it (it printed it already), with the
    variable's name when the user set it (a chosen secret is not echoed into logs)."""
    print(f"agentmars: gateway on http://{host}:{port}, {engine}", flush=True)
    chosen = os.environ.get(GATEWAY_TOKEN_ENV) == token
    shown = f"${GATEWAY_TOKEN_ENV}" if chosen else token
    print(f"agentmars: dashboard on http://{host}:{port}/dashboard#token={shown}", flush=True)


def stop_on_sigterm() -> None:
    """SIGTERM raises like SIGINT does, so the context managers stop vLLM's group
    even while it is still starting (uvicorn handles both itself once it serves)."""

    def stop(signum: int, frame: types.FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _plugin_env(options: ServeOptions, sockets: Path) -> dict[str, str]:
    """The plugin's settings (plugin_config.py), in vLLM's environment."""
    env = {
        "AGENTMARS_POLICY": options.policy,
        "AGENTMARS_KV_STATUS_ADDR": f"ipc://{sockets}/kv",
        "AGENTMARS_HINTS_ADDR": f"ipc://{sockets}/hints",
    }
    if options.profile is not None:
        env["AGENTMARS_PROFILE"] = options.profile
    return env


def serve(options: ServeOptions, listener: socket.socket) -> int:
    """Serve until SIGINT or SIGTERM on ``listener`` (bound to the options' host and
    port before vLLM starts); 0 once everything has stopped."""
    options.check()
    stop_on_sigterm()
    try:
        with tempfile.TemporaryDirectory(prefix="agentmars-") as sockets:
            replicas = _replicas(options, Path(sockets))
            with serve_vllm_replicas(replicas) as urls:
                gateway = _gateway_config(options, replicas, urls)
                app = create_gateway_app(gateway)
                engines = f"engine{'s' * (len(urls) > 1)} {', '.join(urls)}"
                announce(options.host, listener.getsockname()[1], engines, options.token)
                run_gateway(app, listener)
    except KeyboardInterrupt:
        pass
    return 0


def _replicas(options: ServeOptions, sockets: Path) -> list[VllmReplica]:
    """The vLLM servers to start: one per replica, each with its CPUs, its plugin's
    sockets (``sockets/<index>/``) and its log (replica 0's is ``log_path``)."""
    replicas = []
    for index, cores in enumerate(options.replica_cores()):
        folder = sockets / str(index)
        folder.mkdir()
        config = VllmServerConfig(
            python=options.vllm_python,
            model=options.model,
            max_model_len=options.max_model_len,
            num_blocks=options.num_blocks,
            cores=cores,
            otlp_traces_endpoint=traces_endpoint_from_env(),
            cpu_kv_blocks=options.cpu_tier_blocks(),
            extra_args=("--scheduler-cls", PLUGIN_CLASS, *options.vllm_args),
        )
        log = options.log_path
        if index > 0:
            log = log.with_name(f"{log.stem}.{index}{log.suffix}")
        replicas.append(VllmReplica(config, log, _plugin_env(options, folder)))
    return replicas


def _gateway_config(
    options: ServeOptions, replicas: list[VllmReplica], urls: list[str]
) -> GatewayConfig:
    engines = [
        EngineReplica(
            url, replica.env["AGENTMARS_KV_STATUS_ADDR"], replica.env["AGENTMARS_HINTS_ADDR"]
        )
        for replica, url in zip(replicas, urls, strict=True)
    ]
    first, *more = engines
    return GatewayConfig(
        upstream_url=first.url,
        token=options.token,
        policy=options.policy,
        block_size=CPU_BLOCK_SIZE,
        plugin_kv_address=first.kv_address,
        plugin_hints_address=first.hints_address,
        more_replicas=tuple(more),
        session_idle_s=options.session_idle_s,
    )
