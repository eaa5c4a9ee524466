"""Backends by name, and the contract module that knows none of them."""

from __future__ import annotations

import ast
import inspect

import pytest

from agentmars.sandbox.backends import base
from agentmars.sandbox.backends.docker import DockerBackend
from agentmars.sandbox.backends.process import ProcessBackend
from agentmars.sandbox.backends.registry import backend_for


def test_each_name_gives_its_backend() -> None:
    assert isinstance(backend_for("process"), ProcessBackend)
    assert isinstance(backend_for("docker"), DockerBackend)
    with pytest.raises(ValueError, match="choose 'process' or 'docker'"):
        backend_for("podman")


def test_the_contract_imports_no_backend() -> None:
    """Every backend imports ``base``; an import back, even a lazy one, is a cycle."""
    tree = ast.parse(inspect.getsource(base))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("agentmars.sandbox.backends")}
