"""The policy registry: every baseline is selectable by name, and a wrong name or a
wrong setting fails with a message that says what would be right."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentmars.server.policies.autellix import Autellix
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.continuum import Continuum, ContinuumDynamic
from agentmars.server.policies.fcfs import FCFS
from agentmars.server.policies.infercept import InferCept
from agentmars.server.policies.interface import AdmissionHalf, EngineHalf, Policy
from agentmars.server.policies.justitia import Justitia
from agentmars.server.policies.parrot import Parrot
from agentmars.server.policies.registry import (
    POLICY_MODULES,
    UnknownPolicy,
    describe_policy,
    make_policy,
    policy_class,
    policy_names,
    register,
)
from agentmars.server.policies.srjf import SRJF
from agentmars.server.policies.thunderagent import ThunderAgent, ThunderAgentOffload
from agentmars.server.policies.vllm_sjf import VllmSJF
from agentmars.server.policies.vtc import VTC

BASELINES: dict[str, type[Policy]] = {
    "fcfs": FCFS,
    "autellix": Autellix,
    "infercept": InferCept,
    "continuum": Continuum,
    "continuum-dy": ContinuumDynamic,
    "thunderagent": ThunderAgent,
    "thunderagent-cpu": ThunderAgentOffload,
    "vtc": VTC,
    "parrot": Parrot,
    "vllm-sjf": VllmSJF,
    "srjf": SRJF,
    "justitia": Justitia,
}


@pytest.mark.parametrize(("name", "cls"), BASELINES.items())
def test_each_baseline_is_registered_under_its_name(name: str, cls: type[Policy]) -> None:
    assert name in policy_names()
    assert policy_class(name) is cls
    policy = make_policy(name)
    assert type(policy) is cls
    assert policy.name == name
    assert policy.variant  # which published rule or code it follows


def test_names_are_listed_sorted() -> None:
    names = policy_names()
    assert names == sorted(names)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicy) as caught:
        make_policy("sjf")
    message = str(caught.value)
    assert "'sjf'" in message
    for name in BASELINES:
        assert name in message
    assert isinstance(caught.value, ValueError)  # the CLI reports ValueErrors cleanly


def test_unknown_setting_names_it_and_the_accepted_ones() -> None:
    expected = r"policy 'continuum' has no setting ttl \(settings: ttl_s\)"
    with pytest.raises(ValueError, match=expected):
        make_policy("continuum", ttl=1.0)


def test_a_policy_without_settings_says_so() -> None:
    with pytest.raises(ValueError, match=r"policy 'fcfs' has no setting beta \(settings: none\)"):
        make_policy("fcfs", beta=2.0)


INCREASING = "boundaries_s must be positive and increasing"


@pytest.mark.parametrize(
    ("name", "settings", "message"),
    [
        ("autellix", {"boundaries_s": [0.04, 0.02]}, INCREASING),
        ("autellix", {"boundaries_s": [0.0, 0.02]}, INCREASING),
        ("autellix", {"beta": 0.0}, "beta must be positive"),
        ("continuum", {"ttl_s": 0.0}, "ttl_s must be positive"),
        ("continuum-dy", {"ttl_s": -1.0}, "ttl_s must be positive"),
        ("continuum-dy", {"min_samples": 0}, "min_samples must be at least 1"),
        ("thunderagent", {"check_interval_s": 0.0}, "check_interval_s must be positive"),
        ("thunderagent-cpu", {"check_interval_s": -5.0}, "check_interval_s must be positive"),
        ("vtc", {"w_prompt": -1.0}, "weights must be non-negative"),
        ("vtc", {"w_output": -2.0}, "weights must be non-negative"),
    ],
)
def test_bad_setting_values_are_refused(
    name: str, settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(name, **settings)


@pytest.mark.parametrize("name", BASELINES)
def test_settings_round_trip_through_make_policy(name: str) -> None:
    # What a results file records must rebuild the same policy.
    settings = make_policy(name).settings()
    assert make_policy(name, **settings).settings() == settings


def test_settings_record_the_chosen_values() -> None:
    assert make_policy("continuum-dy", ttl_s=1.5, min_samples=10).settings() == {
        "ttl_s": 1.5,
        "min_samples": 10,
    }
    assert make_policy("thunderagent", check_interval_s=2.0).settings() == {"check_interval_s": 2.0}
    assert make_policy("vtc", w_prompt=0.5, w_output=1.0).settings() == {
        "w_prompt": 0.5,
        "w_output": 1.0,
    }
    assert make_policy("autellix", boundaries_s=[0.1, 0.2], beta=4.0).settings() == {
        "boundaries_s": [0.1, 0.2],
        "beta": 4.0,
    }


def test_every_policy_object_is_fresh() -> None:
    # A policy object keeps per-run state (counters, statistics): never shared.
    assert make_policy("vtc") is not make_policy("vtc")


IMMUTABLE = (str, bytes, int, float, bool, type(None), tuple, frozenset)


def mutable_state(obj: object) -> Iterator[Any]:
    """The mutable objects an object's attributes hold (its per-run state)."""
    for value in vars(obj).values():
        if not isinstance(value, IMMUTABLE):
            yield value


@pytest.mark.parametrize("name", policy_names())
def test_both_halves_are_built_fresh_and_share_nothing(name: str) -> None:
    # Every registered policy (the baselines and any other), not only BASELINES.
    policy = make_policy(name)
    first_admission, second_admission = policy.admission(), policy.admission()
    first_engine, second_engine = policy.engine(), policy.engine()
    assert isinstance(first_admission, AdmissionHalf)
    assert isinstance(first_engine, EngineHalf)
    for half in (first_admission, first_engine):
        assert type(half.needs) is frozenset
        assert all(isinstance(need, Capability) for need in half.needs)
    # A new object at each call: a half keeps per-run state (counters, pauses seen).
    halves = [first_admission, second_admission, first_engine, second_engine]
    assert len({id(half) for half in halves}) == 4
    # No mutable object is shared between two halves, nor with the policy: the halves
    # live in different processes on the real stack and talk only through the stream.
    owners: dict[int, str] = {}
    labels = ["admission", "admission (2nd)", "engine", "engine (2nd)"]
    for label, obj in [("policy", policy), *zip(labels, halves, strict=True)]:
        for value in mutable_state(obj):
            assert id(value) not in owners, f"{label} shares {value!r} with {owners[id(value)]}"
            owners[id(value)] = label
    # Each half's events go nowhere until its host connects it: setting one half's
    # ``publish`` does not set another's.
    unconnected = second_engine.publish
    heard: list[object] = []
    first_engine.publish = heard.append
    assert second_engine.publish is unconnected
    assert first_admission.publish is unconnected


def test_make_policy_builds_fresh_halves_each_call() -> None:
    for name in policy_names():
        one, two = make_policy(name), make_policy(name)
        assert one.admission() is not two.admission()
        assert one.engine() is not two.engine()


def test_describe_policy_is_the_docstrings_first_sentence() -> None:
    first_line = "First come, first served: stock vLLM V1 (the baseline of every seed)."
    assert describe_policy("fcfs") == first_line
    # Over lines, to its full stop, not one inside brackets ("(seed 000 §3-§4; ...)").
    mars = describe_policy("mars")
    assert mars.startswith("MARS: dual-pressure admission") and mars.endswith(
        "tail guard in admission."
    )
    for name in [n for n in policy_names() if policy_class(n).__module__ in POLICY_MODULES]:
        description = describe_policy(name)
        assert description.endswith("."), (name, description)
        assert "module docstring" not in description, name


def test_a_name_cannot_be_taken_twice() -> None:
    class Impostor(Policy):
        name = "fcfs"

    with pytest.raises(TypeError, match="policy name 'fcfs' is taken by FCFS"):
        register(Impostor)
    assert policy_class("fcfs") is FCFS


def test_a_policy_needs_a_name() -> None:
    class Nameless(Policy):
        pass

    with pytest.raises(TypeError, match="has no name"):
        register(Nameless)
