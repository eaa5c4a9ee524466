"""The schedule() benchmark's harness (``engines.vllm.bench_schedule``): its queue (any
interpreter) and, in the vLLM environment, stock vLLM's scheduler and the plugin's
each finishing every call of a small queue with the same tokens."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agentmars.server.engines.vllm.bench_schedule import (
    VOCAB,
    QueueShape,
    VirtualClock,
    build_sessions,
    main,
    one_core,
    policy_list,
    synthetic_token,
)


def test_the_queue_is_sessions_of_turns_with_the_gateways_metadata() -> None:
    shape = QueueShape(sessions=3, turns=2, first_prompt=(10, 10), tool_result=(4, 4))
    sessions = build_sessions(shape)
    assert [[call.request_id for call in calls] for calls in sessions] == [
        ["s000-t0", "s000-t1"],
        ["s001-t0", "s001-t1"],
        ["s002-t0", "s002-t1"],
    ]
    first, second = sessions[0]
    assert (len(first.new_tokens), len(second.new_tokens)) == (10, 4)
    assert first.extra_args() == {
        "session_id": "s000",
        "turn": 0,
        "follows_tool": False,
        "expects_tool": True,
    }
    assert second.extra_args() == {
        "session_id": "s000",
        "turn": 1,
        "follows_tool": True,
        "expects_tool": False,
    }
    assert all(8 <= call.max_tokens <= 48 for calls in sessions for call in calls)
    assert all(0 < token < VOCAB for call in (first, second) for token in call.new_tokens)


def test_the_queue_depends_on_the_seed_only() -> None:
    assert build_sessions(QueueShape(seed=5)) == build_sessions(QueueShape(seed=5))
    assert build_sessions(QueueShape(seed=5)) != build_sessions(QueueShape(seed=6))


def test_sampled_tokens_are_in_the_vocabulary_and_fixed_by_position() -> None:
    assert synthetic_token(0) == 1
    assert synthetic_token(1) == 1 + 7919 % (VOCAB - 1)
    assert all(0 < synthetic_token(p) < VOCAB for p in range(5000))


@pytest.mark.parametrize(
    ("field", "value"), [("sessions", 0), ("turns", 0), ("output", (5, 4)), ("tool_result", (0, 3))]
)
def test_a_bad_queue_shape_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field if field in ("output", "tool_result") else "one"):
        QueueShape(**{field: value})  # type: ignore[arg-type]


def test_a_callgrind_run_names_a_missing_library(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such.so"
    with pytest.raises(SystemExit) as exited:
        main(["--count-with", str(missing)])
    assert exited.value.code == 2
    assert f"--count-with: no library at {missing}" in capsys.readouterr().err


def test_policies_are_registered_names_each_once() -> None:
    assert policy_list(" mars, mars-no-coscheduler ,") == ("mars", "mars-no-coscheduler")
    for text, message in [
        ("", "names no policy"),
        ("mars,fcfs,mars", "names a policy twice"),
        ("stock", "stock vLLM, which always runs"),
        ("fcfs,no-such", "unknown policy 'no-such'"),
        ("fcfs,continuum-dy", "cannot run policy 'continuum-dy': it needs costs"),
    ]:
        with pytest.raises(ValueError, match=message):
            policy_list(text)
    # A cost profile lets the policies that need costs run; one that does not load is
    # named.
    assert policy_list("continuum-dy", "cpu-tiny") == ("continuum-dy",)
    with pytest.raises(ValueError, match="AGENTMARS_PROFILE=no-such-profile"):
        policy_list("fcfs", "no-such-profile")


def test_the_virtual_clock_moves_only_when_advanced(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    # Put the real clocks back after the test: the clock replaces them process-wide.
    monkeypatch.setattr(time, "time", time.time)
    monkeypatch.setattr(time, "monotonic", time.monotonic)
    clock = VirtualClock(start_s=100.0)
    assert time.time() == time.monotonic() == 100.0
    clock.advance(0.25)
    assert time.time() == time.monotonic() == 100.25


@pytest.mark.slow
def test_both_schedulers_finish_every_call_with_the_same_tokens(
    vllm_python: Path, tmp_path: Path
) -> None:
    out = tmp_path / "figures.json"
    # 6 sessions of 3 turns (contexts up to 1,680 tokens: 105 blocks) in 160 KV blocks:
    # not all fit at once, so calls wait.
    subprocess.run(
        [
            str(vllm_python), "-m", "agentmars.server.engines.vllm.bench_schedule",
            "--sessions", "6", "--turns", "3", "--reps", "1", "--kv-blocks", "160",
            "--policies", "fcfs,continuum,mars,mars-no-coscheduler", "--json", str(out),
        ],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    figures = json.loads(out.read_text())
    # ignore_eos: every call generates exactly its max_tokens.
    sessions = build_sessions(QueueShape(sessions=6, turns=3))
    expected_tokens = sum(call.max_tokens for calls in sessions for call in calls)
    ablation = "mars-no-coscheduler"  # --policies: any registered policy the plugin runs
    assert set(figures["schedulers"]) == {"stock", "fcfs", "continuum", "mars", ablation}
    for name, row in figures["schedulers"].items():
        assert (row["calls_finished"], row["output_tokens"]) == (18, expected_tokens), name
        assert row["schedule"]["calls"] == row["steps_per_run"] > 0
        assert row["schedule"]["p50_us"] > 0
        # Every call is looked up at least once when vLLM's waiting loop reaches it.
        lookups = row["prefix_lookups"]
        assert lookups["per_step"] * row["steps_per_run"] >= 18, name
        assert lookups["us_per_step"] > 0
    # The second and third turns find their session's earlier context cached (6
    # sessions' contexts fit in 160 blocks but for the waiting ones).
    assert figures["schedulers"]["continuum"]["prefix_lookups"]["hit_tokens_mean"] > 0
    assert figures["same_tokens"] is True
    ratios = figures["schedule_ratio_to_stock"]
    assert set(ratios) == {"fcfs", "continuum", "mars", ablation}
    assert all(min(r.values()) > 0 for r in ratios.values())
    assert all(set(r) == {"p50", "mean", "per_run", "paired"} for r in ratios.values())


WAITING_ORDER_PROBE = """
import json
import time
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

scheduler = b.make_scheduler("continuum", ensure_tiny_model(), b.SchedulerShape())
factory = b.RequestFactory(16)
sessions = b.build_sessions(b.QueueShape(sessions=3, turns=1))
for calls in sessions:
    scheduler.add_request(factory.make(calls[0], []))
pins, orders = scheduler.pin_table, []

def order():
    scheduler._forget_changed_keys(time.monotonic())
    scheduler._waiting_order.order(scheduler.waiting)
    orders.append([r.sampling_params.extra_args["session_id"] for r in scheduler.waiting])

order()
pins.pin("s002", [], now=time.time(), ttl_s=None, session_arrival_s=0.0)
order()
pins.release("s002", "expired")
pins.pin("s001", [], now=time.time(), ttl_s=None, session_arrival_s=0.0)
order()
print(json.dumps(orders))
"""


@pytest.mark.slow
def test_the_kept_waiting_order_follows_pin_changes(vllm_python: Path) -> None:
    """Continuum's priority reads only pins, so the plugin keeps each waiting call's key
    until its session's pin changes: a pinned session's call goes first, and goes back
    when the pin goes."""
    done = subprocess.run(
        [str(vllm_python), "-c", WAITING_ORDER_PROBE],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    orders = json.loads(done.stdout.strip().splitlines()[-1])
    assert orders == [
        ["s000", "s001", "s002"],
        ["s002", "s000", "s001"],
        ["s001", "s000", "s002"],
    ]


def test_the_timed_runs_hold_one_core_and_give_the_others_back() -> None:
    allowed = os.sched_getaffinity(0)
    with one_core() as core:
        assert os.sched_getaffinity(0) == {core} and core in allowed
    assert os.sched_getaffinity(0) == allowed
    with pytest.raises(RuntimeError), one_core():
        raise RuntimeError("a run failed")
    assert os.sched_getaffinity(0) == allowed
