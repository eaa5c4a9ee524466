"""Loading and saving workloads: our format, the importers, and bad input."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentmars.server.workloads.files import WorkloadError, load_workload, save_workload
from agentmars.server.workloads.importers import from_mooncake, read_rows
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec, Workload

DATA = Path(__file__).parent / "data"


def small_workload() -> Workload:
    return Workload(
        name="tiny",
        seed=3,
        arrival="closed",
        concurrency=2,
        sessions=(
            SessionSpec(
                session_id="a",
                agent="openhands",
                shared_prefix_tokens=10,
                prefix_group="system",
                turns=(
                    TurnSpec(
                        append_tokens=100,
                        output_tokens=5,
                        tool=ToolSpec(kind="bash", wall_s=0.125, cpu_s=0.1, command="ls"),
                    ),
                    TurnSpec(append_tokens=7, output_tokens=3),
                ),
            ),
            SessionSpec(
                session_id="b", arrival_s=1.5, turns=(TurnSpec(append_tokens=1, output_tokens=1),)
            ),
        ),
    )


def write_lines(path: Path, *objects: Any) -> Path:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects))
    return path


HEADER = {"name": "w", "seed": 1, "arrival": "open", "concurrency": None}
SESSION = {"session_id": "s1", "turns": [{"append_tokens": 10, "output_tokens": 2}]}


def test_our_format_reads_a_hand_written_file() -> None:
    # Defaults may be left out; a blank line is skipped.
    assert load_workload(DATA / "agentmars_workload.jsonl") == small_workload()


def test_save_then_load_gives_the_same_workload(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    save_workload(small_workload(), path)
    assert load_workload(path) == small_workload()
    assert load_workload(path, "agentmars") == small_workload()
    header, *sessions = path.read_text().splitlines()
    assert json.loads(header) == {"name": "tiny", "seed": 3, "arrival": "closed", "concurrency": 2}
    assert len(sessions) == 2
    assert os.listdir(tmp_path) == ["w.jsonl"]  # no temporary file left behind


def test_a_failed_save_leaves_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.jsonl"
    save_workload(small_workload(), path)
    before = path.read_bytes()

    def fail(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        save_workload(small_workload().model_copy(update={"name": "other"}), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["w.jsonl"]


def test_gzip_files_are_read(tmp_path: Path) -> None:
    plain = tmp_path / "w.jsonl"
    save_workload(small_workload(), plain)
    packed = tmp_path / "w.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_workload(packed) == small_workload()


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "w.jsonl", HEADER, "", SESSION, "   ", "{oops")
    with pytest.raises(WorkloadError, match=r"w\.jsonl:5: not JSON"):
        load_workload(path)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], r":1: the file is empty"),
        (["", "  "], r":1: the file is empty"),
        ([HEADER, "[1, 2]"], r":2: expected a JSON object, got list"),
        ([HEADER, "not json"], r":2: not JSON \(Expecting value at column 1\)"),
        ([HEADER], r":1: no sessions after the header"),
        ([SESSION, SESSION], r":1: cannot tell the format from this line"),
        (
            [HEADER, {**SESSION, "turns": [{"append_tokens": -4, "output_tokens": 2}]}],
            r":2: turns\.0\.append_tokens: Input should be greater than or equal to 0",
        ),
        (
            [HEADER, {**SESSION, "arrival_s": -1}],
            r":2: arrival_s: Input should be greater than or equal to 0",
        ),
        (
            [
                HEADER,
                {
                    "session_id": "s1",
                    "turns": [
                        {
                            "append_tokens": 10,
                            "output_tokens": 2,
                            "tool": {"kind": "bash", "wall_s": 1},
                        }
                    ],
                },
            ],
            r":2: the last turn must not end in a tool call",
        ),
        (
            [HEADER, SESSION, {**SESSION, "session_id": "s2"}, SESSION],
            r":4: duplicate session_id 's1' \(first on line 2\)",
        ),
        ([{**HEADER, "colour": "red"}, SESSION], r":1: colour: Extra inputs are not permitted"),
        (
            [{**HEADER, "arrival": "closed"}, SESSION],
            r":1: concurrency is required for closed-loop arrival",
        ),
        ([{"name": "w", "sessions": []}, SESSION], r":1: the first line must be the header"),
        ([HEADER, {"session_id": "s1"}], r":2: turns: Field required"),
        (
            [HEADER, {**SESSION, "input_text": "x" * 65_537}],
            r":2: input_text: String should have at most 65536 characters",
        ),
    ],
)
def test_bad_files_name_the_line_and_field(tmp_path: Path, lines: list[Any], message: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", *lines)
    with pytest.raises(WorkloadError, match=rf"bad\.jsonl{message}"):
        load_workload(path)


def test_unknown_format_and_missing_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="unknown workload format 'csv'; expected one of auto"):
        load_workload(DATA / "mooncake_trace.jsonl", "csv")
    with pytest.raises(
        WorkloadError, match=r"nope\.jsonl: cannot read \(No such file or directory\)"
    ):
        load_workload(tmp_path / "nope.jsonl")


def test_tracelab_rounds_become_sessions() -> None:
    workload = load_workload(DATA / "tracelab_round_trace.jsonl")
    assert workload.name == "tracelab_round_trace"
    assert [s.session_id for s in workload.sessions] == [
        "claude:0a1b",
        "codex:7c8d",
        "codex:7c8d#1",
    ]
    claude, codex, compacted = workload.sessions
    assert claude.agent == "claude"
    assert claude.arrival_s == 0.0
    assert claude.turns == (
        # Bash ran 1.5 s from 10:00:05.0 on the host: one core.
        TurnSpec(
            append_tokens=20000,
            output_tokens=300,
            tool=ToolSpec(kind="Bash", wall_s=1.5, cpu_s=1.5),
        ),
        # 21000 - (20000 + 300); Read ran 0.2 s from 09.0, WebSearch 4.99 s (its
        # internal latency) from 09.1, in parallel: 5.09 s, no host CPU.
        TurnSpec(
            append_tokens=700,
            output_tokens=200,
            tool=ToolSpec(kind="WebSearch", wall_s=0.1 + 4.99),
        ),
        TurnSpec(append_tokens=1800, output_tokens=400),
    )
    assert codex.agent == "codex"
    assert codex.arrival_s == 60.0
    assert codex.turns == (
        # No timestamps: its effective (internal) latency, 900 ms.
        TurnSpec(
            append_tokens=9000,
            output_tokens=400,
            tool=ToolSpec(kind="exec_command", wall_s=0.9, cpu_s=0.9),
        ),
        # 9300 < 9000 + 400 (reasoning not sent back): appends nothing; the round ends
        # without a tool, the user answers 30 s after its last output.
        TurnSpec(append_tokens=0, output_tokens=100, tool=ToolSpec(kind="human", wall_s=30.0)),
        # 9800 - (9400 + 100); its write_stdin is dropped: the prompt then shrinks by
        # 6800 tokens, a compaction, so the next round starts a new session.
        TurnSpec(append_tokens=300, output_tokens=150),
    )
    assert compacted.arrival_s == 105.0
    assert compacted.turns == (TurnSpec(append_tokens=3000, output_tokens=80),)


def test_tracelab_duplicate_rounds_and_bad_fields_are_refused(tmp_path: Path) -> None:
    rows = [
        json.loads(line) for line in (DATA / "tracelab_round_trace.jsonl").read_text().splitlines()
    ]
    path = write_lines(tmp_path / "t.jsonl", *rows, rows[0])
    with pytest.raises(
        WorkloadError,
        match=r"t\.jsonl:8: session 'claude:0a1b' has round_index 0 twice \(also line 1\)",
    ):
        load_workload(path, "tracelab")
    path = write_lines(tmp_path / "t.jsonl", rows[0], {**rows[1], "output_tokens": -1})
    with pytest.raises(WorkloadError, match=r"t\.jsonl:2: output_tokens: Input should be greater"):
        load_workload(path)
    path = write_lines(
        tmp_path / "t.jsonl",
        {**rows[0], "tools": [{"tool_name": "Bash", "tool_wall_latency_ms": -5}]},
    )
    with pytest.raises(
        WorkloadError, match=r"t\.jsonl:1: tools\.0\.tool_wall_latency_ms: Input should be"
    ):
        load_workload(path)


def test_mooncake_requests_are_chained_into_sessions() -> None:
    workload = load_workload(DATA / "mooncake_trace.jsonl")
    assert workload.name == "mooncake_trace"
    x, y, z, w = workload.sessions
    # Request 4 starts with request 1's full blocks [0, 1], and block 1 is request
    # 1's own: the same session. The gap 3.0 s less 50 output tokens x 0.02 s.
    assert x == SessionSpec(
        session_id="mooncake_trace-00000",
        agent="mooncake",
        shared_prefix_tokens=512,
        prefix_group="mooncake-0",
        turns=(
            TurnSpec(append_tokens=1100, output_tokens=50, tool=ToolSpec(kind="gap", wall_s=2.0)),
            TurnSpec(append_tokens=550, output_tokens=20),
        ),
    )
    assert y.arrival_s == 1.0
    assert [(t.append_tokens, t.output_tokens) for t in y.turns] == [(1200, 30), (570, 40)]
    tool = y.turns[0].tool
    assert tool is not None
    assert (tool.kind, tool.wall_s) == ("gap", pytest.approx(3.5 - 30 * 0.02))
    # Request 3 shares only block 0, which every session has: a new session, with
    # no output recorded (one token).
    assert (z.arrival_s, z.turns) == (2.0, (TurnSpec(append_tokens=600, output_tokens=1),))
    # Block 0 starts the first request of x, y and z: they share one block (512).
    assert [s.prefix_group for s in (x, y, z, w)] == ["mooncake-0"] * 3 + [None]
    assert (w.arrival_s, w.shared_prefix_tokens) == (5.0, 0)


def test_mooncake_service_time_estimate_is_a_parameter() -> None:
    path = DATA / "mooncake_trace.jsonl"
    workload = from_mooncake(path, read_rows(path), decode_s_per_token=0.0)
    assert workload.sessions[0].turns[0].tool == ToolSpec(kind="gap", wall_s=3.0)


def test_mooncake_rows_are_validated(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "m.jsonl",
        {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 10, "input_length": 0, "output_length": 1, "hash_ids": [1]},
    )
    with pytest.raises(WorkloadError, match=r"m\.jsonl:2: input_length: Input should be greater"):
        load_workload(path, "mooncake")
