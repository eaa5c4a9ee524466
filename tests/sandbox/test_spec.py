from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentmars.sandbox.spec import (
    MAX_ARGS,
    MAX_COMMAND_BYTES,
    MAX_ENV_VARS,
    MAX_OUTPUT_CAP_BYTES,
    ExecSpec,
    SandboxError,
    check_session_id,
)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"command": []}, "at least 1 item"),
        ({"command": [""]}, "program"),
        ({"command": ["echo", "a\x00b"]}, "NUL"),
        ({"command": ["x" * (MAX_COMMAND_BYTES + 1)]}, "the limit is"),
        ({"command": ["true"], "timeout_s": -1}, "greater than 0"),
        ({"command": ["true"], "timeout_s": 0}, "greater than 0"),
        ({"command": ["true"], "cwd": "/etc"}, "relative path inside the workspace"),
        ({"command": ["true"], "cwd": "a/../../x"}, "relative path inside the workspace"),
        ({"command": ["true"], "env": {"1BAD": "x"}}, "invalid environment variable name"),
        ({"command": ["true"], "output_cap_bytes": -5}, "greater than or equal to 0"),
        ({"command": ["true"], "shell": True}, "Extra inputs"),
        ({"command": ["true"], "env": {"NAME\n": "x"}}, "invalid environment variable name"),
        ({"command": ["true"], "env": {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}}, "at most"),
        ({"command": ["true"] * (MAX_ARGS + 1)}, f"at most {MAX_ARGS} items"),
        ({"command": ["true"], "output_cap_bytes": MAX_OUTPUT_CAP_BYTES + 1}, "less than or"),
        ({"command": ["true"], "timeout_s": float("nan")}, "finite number"),
        ({"command": ["true"], "timeout_s": float("inf")}, "finite number"),
    ],
)
def test_bad_spec_is_rejected_clearly(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ExecSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "session_id", ["", "..", "-rf", "a/b", "x" * 129, ".hidden", "a b", "ok\n", "ok\r\n"]
)
def test_session_ids_that_could_escape_are_rejected(session_id: str) -> None:
    with pytest.raises(SandboxError, match="invalid session id"):
        check_session_id(session_id)


def test_good_ids_pass() -> None:
    assert check_session_id("sess-1.a_b") == "sess-1.a_b"
