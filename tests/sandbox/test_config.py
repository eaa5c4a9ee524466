from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentmars.sandbox.config import SandboxConfig, allowed_cores
from agentmars.sandbox.spec import MAX_OUTPUT_CAP_BYTES

CORES = allowed_cores()


def test_default_keeps_core_0_for_the_engine_when_there_are_two_or_more() -> None:
    config = SandboxConfig()
    if len(CORES) > 1:
        assert config.resolved_engine_cores() == CORES[:1]
        assert config.resolved_tool_cores() == CORES[1:]
    assert config.resolved_slots() == len(config.resolved_tool_cores())
    assert not set(config.resolved_engine_cores()) & set(config.resolved_tool_cores())


def test_slots_are_dealt_cores_round_robin() -> None:
    config = SandboxConfig(tool_cores=CORES, engine_cores=[], slots=len(CORES))
    assert [config.slot_cores(i) for i in range(len(CORES))] == [[c] for c in CORES]
    shared = SandboxConfig(tool_cores=CORES[:1], engine_cores=[], slots=3)
    assert [shared.slot_cores(i) for i in range(3)] == [CORES[:1]] * 3
    wide = SandboxConfig(tool_cores=CORES, engine_cores=[], slots=1)
    assert wide.slot_cores(0) == CORES


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tool_cores": [0], "engine_cores": [0]}, "overlap"),
        ({"tool_cores": [max(CORES) + 64]}, "not cores this process may use"),
        ({"engine_cores": CORES, "tool_cores": None}, "no cores left for tools"),
        ({"slots": 0}, "greater than or equal to 1"),
        ({"memory_limit_mb": 1}, "greater than or equal to 16"),
        ({"default_timeout_s": -1}, "greater than 0"),
        ({"backend": "chroot"}, "'process' or 'docker'"),
        ({"no_such_option": 1}, "Extra inputs are not permitted"),
        ({"output_cap_bytes": MAX_OUTPUT_CAP_BYTES + 1}, "less than or equal to 16777216"),
        ({"workspace_quota_mb": 1}, "greater than or equal to 16"),
    ],
)
def test_bad_configuration_says_what_to_change(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SandboxConfig(**options)  # type: ignore[arg-type]
