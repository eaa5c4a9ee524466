"""The ``agentmars`` command, run as a user runs it (a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentmars.sdk import decode_jsonl

CLI = [sys.executable, "-m", "agentmars.cli.main"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_demo_prints_and_writes_a_valid_event_stream(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    done = _run("events", "demo", "--out", str(out))
    assert done.returncode == 0, done.stderr
    decoded = decode_jsonl(out.read_text())
    assert decoded.errors == []
    kinds = [e.kind for e in decoded.events]
    assert kinds.count("session_start") == kinds.count("session_end") == 2
    assert kinds.count("tool_end") >= 2 and "llm_first_token" in kinds
    for kind in ("session_start", "llm_submit", "tool_start", "session_end"):
        assert kind in done.stdout
    assert "What the server received" in done.stdout


def test_events_validate_reports_bad_lines(tmp_path: Path) -> None:
    good = _run("events", "demo", "--out", str(tmp_path / "good.jsonl"))
    assert good.returncode == 0
    bad = tmp_path / "bad.jsonl"
    lines = (tmp_path / "good.jsonl").read_text().splitlines()
    bad.write_text("\n".join([lines[0], "{not json", '{"v": 7, "kind": "llm_end"}', *lines[1:]]))
    done = _run("events", "validate", str(bad))
    assert done.returncode == 1
    assert ":2:" in done.stderr and "not valid JSON" in done.stderr
    assert ":3:" in done.stderr and "unknown event schema version 7" in done.stderr
    assert f"{len(lines)} valid event(s), 2 bad line(s)" in done.stdout
    assert "Traceback" not in done.stderr
    assert _run("events", "validate", str(tmp_path / "good.jsonl")).returncode == 0


def test_bad_cli_input_exits_non_zero_without_traceback(tmp_path: Path) -> None:
    for args in (
        ("events", "validate", str(tmp_path / "missing.jsonl")),
        ("events", "show", str(tmp_path)),
        ("bench", "sdk", "--events", "10"),
        ("no-such-command",),
    ):
        done = _run(*args)
        assert done.returncode == 2, args
        assert "Traceback" not in done.stderr


def test_an_engine_that_is_not_offered_is_named_with_the_choices() -> None:
    for command, choices in (("serve", "'vllm', 'sim'"), ("demo", "'twin', 'vllm'")):
        done = _run(command, "--engine", "foo")
        assert done.returncode == 2, done.stderr
        said = " ".join(done.stderr.replace("│", " ").split())
        assert f"Invalid value for '--engine': 'foo' is not one of {choices}." in said
        assert "Value error" not in said and "Traceback" not in said
