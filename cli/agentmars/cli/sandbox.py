"""``agentmars sandbox serve``: run the sandbox service."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

TOKEN_ENV = "AGENTMARS_SANDBOX_TOKEN"
EVENTS_TOKEN_ENV = "AGENTMARS_EVENTS_TOKEN"
err = Console(stderr=True, soft_wrap=True)


class BadOption(ValueError):
    """A command-line value that cannot be used; the message says which and why."""


def parse_cores(text: str | None, option: str) -> list[int] | None:
    """``"0,2-3"`` -> [0, 2, 3]."""
    if text is None:
        return None
    cores: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            low, dash, high = part.partition("-")
            if dash and not high:  # "1-": a range with no end
                raise ValueError(part)
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise BadOption(f"{option} {text!r}: use core numbers and ranges, e.g. 0,2-3") from None
    if not cores:
        raise BadOption(f"{option} {text!r} names no cores")
    return sorted(cores)


def service_token(token_file: Path) -> str:
    """The token from the environment, else a new one written to ``token_file`` (0600)."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    token = secrets.token_urlsafe(24)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    err.print(f"no {TOKEN_ENV} set: generated a token in {token_file}")
    return token


def build_config(options: dict[str, Any]) -> Any:
    from agentmars.sandbox.config import SandboxConfig

    given = {k: v for k, v in options.items() if v is not None}
    try:
        return SandboxConfig(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise BadOption(f"invalid sandbox configuration: {problems}") from None


def serve(
    *,
    host: str,
    port: int,
    options: dict[str, Any],
    token_file: Path,
    events_url: str | None,
    listener: socket.socket | None = None,
) -> None:
    """Serve the pool on ``host:port`` until SIGINT or SIGTERM, which kill the running
    tools (``serve_sandbox``). ``listener``: the socket, bound there already (the
    command binds it first, so that a busy port is refused before any banner); None:
    bound here, after the options are checked."""
    from agentmars.sandbox.pool import SandboxPool
    from agentmars.sandbox.service import create_sandbox_app, serve_sandbox
    from agentmars.sdk.emitter import Emitter
    from agentmars.sdk.sinks.http import HttpSink
    from agentmars.server.web.serving import listening_socket

    config = build_config(options)
    if listener is None:
        listener = listening_socket(host, port)
    emitter = Emitter()
    try:
        if events_url:
            emitter.add(HttpSink(events_url, token=os.environ.get(EVENTS_TOKEN_ENV)))
        pool = SandboxPool(config, emitter=emitter)
        app = create_sandbox_app(pool, service_token(token_file))
        slots = ", ".join(f"{s.index}:{list(s.cores)}" for s in pool.slots)
        err.print(
            f"sandbox service on http://{host}:{port} backend={config.backend} slots={slots} "
            f"workspaces={config.workspace_root}"
        )
        # Slow clients time out: headers (guarded_server), bodies (the app's guard).
        serve_sandbox(app, listener)
    finally:
        listener.close()
        emitter.close()
    sys.stdout.flush()
