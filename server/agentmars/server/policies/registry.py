"""Policies by name: ``--policy NAME`` looks one up here.

Each policy module registers its class with ``@register``; ``POLICY_MODULES`` lists the
modules so that looking up a name imports them (once) without the caller knowing
where a policy lives. A policy kept outside the project is found the same way once its
module is named in ``AGENTMARS_POLICY_MODULES`` (comma-separated, importable): every
host reads it, the CLI, the gateway and the vLLM plugin (docs/writing-a-policy.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
from collections.abc import Iterable
from typing import Any, TypeVar

from agentmars.server.policies.interface import Policy

POLICY_MODULES = (
    "agentmars.server.policies.fcfs",
    "agentmars.server.policies.autellix",
    "agentmars.server.policies.infercept",
    "agentmars.server.policies.continuum",
    "agentmars.server.policies.thunderagent",
    "agentmars.server.policies.vtc",
    "agentmars.server.policies.mars",
    "agentmars.server.policies.mars_api",
    "agentmars.server.policies.agentserve",
    "agentmars.server.policies.mori",
    "agentmars.server.policies.justitia",
    "agentmars.server.policies.srjf",
    "agentmars.server.policies.parrot",
    "agentmars.server.policies.vllm_sjf",
)

POLICY_MODULES_ENV = "AGENTMARS_POLICY_MODULES"

_registry: dict[str, type[Policy]] = {}
P = TypeVar("P", bound=type[Policy])


class UnknownPolicy(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown policy {name!r}; known: {', '.join(policy_names())}")


def register(cls: P) -> P:
    """Class decorator: make ``cls`` selectable by its ``name``."""
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} has no name")
    if _registry.get(cls.name, cls) is not cls:
        raise TypeError(f"policy name {cls.name!r} is taken by {_registry[cls.name].__qualname__}")
    _registry[cls.name] = cls
    return cls


class PolicyModuleError(ValueError):
    """A module named in ``AGENTMARS_POLICY_MODULES`` cannot be imported."""


def policy_modules_in(text: str) -> tuple[str, ...]:
    """The modules a ``AGENTMARS_POLICY_MODULES`` value names, in order."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def extra_policy_modules() -> tuple[str, ...]:
    """The modules this process's ``AGENTMARS_POLICY_MODULES`` names."""
    return policy_modules_in(os.environ.get(POLICY_MODULES_ENV, ""))


def import_policy_modules(modules: Iterable[str]) -> None:
    """Import each module (registering its policies); ``PolicyModuleError`` names the
    first that does not import."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise PolicyModuleError(
                f"{POLICY_MODULES_ENV}: cannot import {module}: {error}"
            ) from None


def _load_all() -> None:
    for module in POLICY_MODULES:
        importlib.import_module(module)
    import_policy_modules(extra_policy_modules())


def policy_names() -> list[str]:
    _load_all()
    return sorted(_registry)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:SETTING=VALUE:...`` (e.g. ``mars:aimd_beta=0.7``, as
    ``--policies`` takes it): the name and the settings, numbers read as numbers."""
    name, *pairs = spec.split(":")
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"policy {spec!r}: settings are NAME=VALUE, got {pair!r}")
        settings[key] = _number(text)
    return name, settings


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def policy_class(name: str) -> type[Policy]:
    """The class of a registered name (or of a ``NAME:SETTING=VALUE`` spec)."""
    _load_all()
    name = name.split(":", 1)[0]
    try:
        return _registry[name]
    except KeyError:
        raise UnknownPolicy(name) from None


def make_policy(name: str, **settings: Any) -> Policy:
    """A fresh policy object; ``name`` may carry settings (``parse_spec``); ``settings``
    are its constructor's keyword arguments (a clear error names the ones it does not
    take)."""
    name, given = parse_spec(name)
    settings = {**given, **settings}
    cls = policy_class(name)
    accepted = set(inspect.signature(cls).parameters)
    unknown = sorted(set(settings) - accepted)
    if unknown:
        known = ", ".join(sorted(accepted)) or "none"
        raise ValueError(f"policy {name!r} has no setting {', '.join(unknown)} (settings: {known})")
    return cls(**settings)


def describe_policy(name: str) -> str:
    """The first sentence of the policy's docstring (its first paragraph, whose lines
    are one text): a sentence ends at a full stop followed by a space or the end, and
    not inside brackets."""
    doc = inspect.getdoc(policy_class(name)) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    depth = 0
    for index, char in enumerate(paragraph):
        depth += (char in "([") - (char in ")]")
        if char in ".!?" and depth == 0 and paragraph[index + 1 : index + 2] in ("", " "):
            return paragraph[: index + 1]
    return paragraph


def require_positive_numbers(settings: Any) -> None:
    """Check that every field of a policy's settings dataclass is a finite number > 0
    (``ValueError`` naming the first that is not)."""
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"{field.name} must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{field.name} must be a finite number > 0, got {value!r}")


def settings_signature(settings_class: type) -> inspect.Signature:
    """The constructor signature of a policy that takes ``**settings`` of a settings
    dataclass: one keyword per field, its default the field's (``make_policy`` names the
    settings a policy takes from its signature)."""
    return inspect.Signature(
        [
            inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default)
            for field in dataclasses.fields(settings_class)
        ]
    )
