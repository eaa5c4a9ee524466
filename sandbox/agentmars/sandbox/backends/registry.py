"""Backends by name (``SandboxConfig.backend``): the one module that knows them all,
so that ``base`` (the contract each backend imports) knows none."""

from __future__ import annotations

from agentmars.sandbox.backends.base import Backend


def backend_for(name: str) -> Backend:
    """A new, unstarted backend called ``name``; only its own module is imported."""
    if name == "process":
        from agentmars.sandbox.backends.process import ProcessBackend

        return ProcessBackend()
    if name == "docker":
        from agentmars.sandbox.backends.docker import DockerBackend

        return DockerBackend()
    raise ValueError(f"unknown sandbox backend {name!r}; choose 'process' or 'docker'")
