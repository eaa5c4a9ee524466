"""``agentmars serve --engine sim``: the simulated engine paced to the wall clock
(``agentmars.server.engines.twin.engine``) behind the gateway, so the whole stack runs without a
GPU.

The engine serves its OpenAI-compatible API on a loopback port of its own, from a
thread of this process, and the gateway serves in front of it as it does for vLLM.
NOTE: a thread rather than a subprocess (ours): the engine starts at once, nothing
can be orphaned, and in one process the gateway reads the engine's KV figures directly
and hands it the tool events it ingests (what the side channel does for vLLM). The
engine's pacing sleeps, so sharing the interpreter with the gateway costs it little.
SIGINT or SIGTERM stops the gateway, then the engine.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agentmars.cli.serve import announce, stop_on_sigterm
from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine, LiveError
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app, run_gateway
from agentmars.server.policies.capabilities import PolicyRefused
from agentmars.server.policies.registry import UnknownPolicy, make_policy
from agentmars.server.profiles.cost_model import Profile, ProfileError, load_profile
from agentmars.server.web.ingest import EventHub
from agentmars.server.web.serving import serve_in_thread


class SimServeError(ValueError):
    """A setting ``agentmars serve --engine sim`` cannot start with."""


@dataclass(frozen=True)
class SimServeOptions:
    profile: str
    """A profile name (as ``agentmars sim run --profile``) or a profile JSON file."""
    policy: str
    host: str
    port: int
    token: str
    num_blocks: int | None = None
    """KV blocks instead of the profile's."""
    max_model_len: int | None = None
    """Context limit instead of the profile's."""
    session_idle_s: float = 300.0
    """The gateway's final expiry of a quiet session (``GatewayConfig``)."""


def live_profile(
    name: str, *, num_blocks: int | None = None, max_model_len: int | None = None
) -> Profile:
    """The profile with the given limits in place of its own, checked as vLLM checks
    them at start-up (the context limit must fit in the KV cache)."""
    try:
        profile = load_profile(name)
    except ProfileError as exc:
        raise SimServeError(str(exc)) from None
    overrides: dict[str, Any] = {}
    if num_blocks is not None:
        overrides["num_gpu_blocks"] = num_blocks
    if max_model_len is not None:
        overrides["max_model_len"] = max_model_len
    elif num_blocks is not None:
        # Fewer blocks than the profile's context limit needs: the limit shrinks to fit.
        overrides["max_model_len"] = min(profile.max_model_len, num_blocks * profile.block_size)
    try:
        return Profile.model_validate({**profile.model_dump(), **overrides})
    except ValidationError as exc:
        problems = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
        raise SimServeError(f"profile {profile.name!r} with these limits: {problems}") from None


def live_engine(options: SimServeOptions, hub: EventHub) -> LiveEngine:
    """The twin engine, its events published into the gateway's ``hub``."""
    profile = live_profile(
        options.profile, num_blocks=options.num_blocks, max_model_len=options.max_model_len
    )
    try:
        return LiveEngine(
            profile, make_policy(options.policy), publish=lambda event: hub.publish([event])
        )
    except (UnknownPolicy, LiveError) as exc:
        raise SimServeError(str(exc)) from None


def serve_sim(options: SimServeOptions, listener: socket.socket) -> int:
    """Serve until SIGINT or SIGTERM on ``listener`` (bound to the options' host and
    port); 0 once everything has stopped."""
    hub = EventHub()
    engine = live_engine(options, hub)
    stop_on_sigterm()
    try:
        with serve_in_thread(create_live_app(engine)) as engine_url:
            config = GatewayConfig(
                upstream_url=engine_url,
                token=options.token,
                policy=options.policy,
                block_size=engine.profile.block_size,
                kv_source=engine,
                session_idle_s=options.session_idle_s,
            )
            try:
                app = create_gateway_app(config, hub=hub)
            except PolicyRefused as exc:
                raise SimServeError(str(exc)) from None
            app.state.gateway.hub.subscribe(engine.observe_threadsafe)
            announce(
                options.host,
                listener.getsockname()[1],
                f"simulated engine ({engine.profile.name}, policy {options.policy}) {engine_url}",
                options.token,
            )
            run_gateway(app, listener)
    except KeyboardInterrupt:
        pass
    return 0
