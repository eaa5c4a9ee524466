"""Every metric of ``summarize`` on small runs whose answers are worked out by hand.

Percentiles: numpy's linear interpolation puts percentile q of n sorted values at
position (n - 1) x q / 100, between the two neighbouring values.
"""

from __future__ import annotations

import json

import pytest

from agentmars.server.metrics.records import KVSample, RunRecord, SessionRecord
from agentmars.server.metrics.summary import (
    DEFAULT_SLO_FACTOR,
    Distribution,
    RunSummary,
    distribution,
    summarize,
)
from tests.server.metrics.records_factory import call, run, session, tool

# --- a three-session run ---------------------------------------------------------
# session  arrival  end  latency  agent   T_ideal  slowdown  under VTC  fair ratio
# s1       4        14   10       small   10       1.0       20         0.5
# s2       5        25   20       small    8       2.5       16         1.25
# s3       20       80   60       large   15       4.0       40         1.5
# s4 arrived but had not finished when the run stopped at 80 s.
# Window: first arrival 4 s to the end of the run 80 s = 76 s.
#
# calls (run / alone)   TTFT       TPOT       within 2x?
# s1 turn 0             0.5 / 0.5  0.5 / 0.5  yes
# s2 turn 0             1 / 1      1 / 1      yes
# s2 turn 1             3 / 1      1 / 1      no (TTFT 3x)
# s3 turn 0             2 / 1.5    - / -      yes (one token: no TPOT bound)
# s3 turn 1             1 / 1      1 / 0.4    no (TPOT 2.5x)

WINDOW = 76.0


def _three_sessions() -> RunRecord:
    return run(
        [
            session(
                "s1", 4, 14, agent="small", calls=[call(0, 4, 0.5, 20, 0.5, prompt_tokens=100)]
            ),
            session(
                "s2",
                5,
                25,
                agent="small",
                calls=[
                    call(0, 5, 1.0, 5, 1.0, prompt_tokens=200),
                    call(1, 20, 3.0, 3, 1.0, prompt_tokens=300),
                ],
            ),
            session(
                "s3",
                20,
                80,
                agent="large",
                calls=[
                    call(0, 20, 2.0, 1, prompt_tokens=400),
                    call(1, 70, 1.0, 10, 1.0, prompt_tokens=500),
                ],
            ),
        ],
        duration_s=80,
        steps=152,
        unfinished=["s4"],
    )


def _alone() -> dict[str, SessionRecord]:
    """Each session's record when it ran alone."""
    return {
        "s3": session("s3", 0, 15, calls=[call(0, 0, 1.5, 1), call(1, 12, 1.0, 10, 0.4)]),
        "s1": session("s1", 0, 10, calls=[call(0, 0, 0.5, 20, 0.5)]),
        "s2": session("s2", 0, 8, calls=[call(0, 0, 1.0, 5, 1.0), call(1, 5, 1.0, 3, 1.0)]),
    }


def _under_vtc() -> RunRecord:
    return run(
        [session("s1", 4, 24), session("s2", 5, 21), session("s3", 20, 60)],
        duration_s=60,
        policy="vtc",
    )


def test_latency_is_arrival_to_last_token_with_linear_percentiles() -> None:
    summary = summarize(_three_sessions())
    # latencies 10, 20, 60: P90 at position 1.8 = 20 + 0.8 x 40, P95 at 1.9, P99 at 1.98
    assert summary.latency_s is not None
    assert summary.latency_s.model_dump() == pytest.approx(
        {"n": 3, "mean": 30, "p50": 20, "p90": 52, "p95": 56, "p99": 59.2}
    )
    assert (summary.sessions, summary.unfinished, summary.window_s) == (3, 1, WINDOW)


def test_slowdown_and_goodput_against_t_ideal() -> None:
    summary = summarize(_three_sessions(), _alone(), alphas=(1, 2, 3, 4))
    assert summary.slowdown is not None
    # slowdowns 1, 2.5, 4
    assert (summary.slowdown.mean, summary.slowdown.p50) == (2.5, 2.5)
    assert summary.slowdown.p95 == pytest.approx(2.5 + 0.9 * 1.5)
    # within alpha x T_ideal: alpha 1 and 2 -> s1; 3 -> s1, s2; 4 -> all three
    assert summary.goodput == pytest.approx(
        {1: 1 / WINDOW, 2: 1 / WINDOW, 3: 2 / WINDOW, 4: 3 / WINDOW}
    )


def test_slo_attainment_per_session_and_per_call() -> None:
    at_2 = summarize(_three_sessions(), _alone(), slo_factor=2)
    # sessions: only s1 kept both bounds on every call; s4 (unfinished) counts as a miss
    assert at_2.slo_attainment == pytest.approx(1 / 4)
    assert at_2.slo_attainment_calls == pytest.approx(3 / 5)
    at_3 = summarize(_three_sessions(), _alone(), slo_factor=3)
    # at 3x, s2's TTFT (3 = 3 x 1) and s3's TPOT (1 <= 1.2) are within bounds
    assert at_3.slo_attainment == pytest.approx(3 / 4)
    assert at_3.slo_attainment_calls == 1.0
    assert at_3.slo_factor == 3


def test_ttft_per_turn_overall_and_tpot() -> None:
    summary = summarize(_three_sessions())
    by_turn = {turn: d.model_dump() for turn, d in summary.ttft_by_turn_s.items()}
    assert by_turn == {
        # turn 0: 0.5, 1, 2
        0: pytest.approx({"n": 3, "mean": 3.5 / 3, "p50": 1, "p90": 1.8, "p95": 1.9, "p99": 1.98}),
        # turn 1: 3, 1 -> sorted 1, 3
        1: pytest.approx({"n": 2, "mean": 2, "p50": 2, "p90": 2.8, "p95": 2.9, "p99": 2.98}),
    }
    assert summary.ttft_s is not None and summary.tpot_s is not None
    # all five TTFTs 0.5, 1, 1, 2, 3
    assert (summary.ttft_s.n, summary.ttft_s.mean, summary.ttft_s.p50) == (5, 1.5, 1.0)
    # TPOTs 0.5, 1, 1, 1 (s3's one-token answer has none)
    assert (summary.tpot_s.n, summary.tpot_s.mean) == pytest.approx((4, 0.875))


def test_token_and_step_throughput_over_the_window() -> None:
    summary = summarize(_three_sessions())
    assert summary.prompt_tokens_per_s == pytest.approx(1500 / WINDOW)
    assert summary.output_tokens_per_s == pytest.approx((20 + 5 + 3 + 1 + 10) / WINDOW)
    assert summary.steps_per_s == pytest.approx(2.0)


def test_finish_time_fair_ratio_against_vtc() -> None:
    fairness = summarize(_three_sessions(), fair_reference=_under_vtc()).fairness
    assert fairness is not None
    # ratios 10/20, 20/16, 60/40
    assert fairness.by_agent == pytest.approx({"large": 1.5, "small": (0.5 + 1.25) / 2})
    assert fairness.mean == pytest.approx((0.5 + 1.25 + 1.5) / 3)
    assert fairness.max == 1.5
    assert fairness.at_most_1 == pytest.approx(1 / 3)
    assert fairness.ratios == pytest.approx([0.5, 1.25, 1.5])  # Fig. 8's CDF, ascending


# --- fairness per agent instance ---------------------------------------------------
# Task "t" (class "dm") fans out into three branch sessions; "u" (class "ev") is a
# session of its own.
# instance  sessions          run: arrival-end  JCT   under VTC  JCT   fair ratio
# t         t.0, t.1, t.2     0 - 30            30    0 - 20     20    1.5
# u         u                 2 - 10            8     2 - 18     16    0.5


def _fan_out(ends: tuple[float, float, float], u_end: float, policy: str) -> RunRecord:
    branches = [session(f"t.{i}", 0, end, agent="dm", task_id="t") for i, end in enumerate(ends)]
    return run([*branches, session("u", 2, u_end, agent="ev")], 30, policy=policy)


def test_the_fair_ratio_is_per_agent_instance() -> None:
    # Branch by branch the ratios would be 10/20, 30/5, 12/15 (and 0.5 for u): a mean
    # of 1.7 over four "agents", the worst 6. The job seed 004 measures is the agent
    # instance: first arrival to last end.
    under_vtc = _fan_out((20, 5, 15), 18, "vtc")
    fairness = summarize(_fan_out((10, 30, 12), 10, "fcfs"), fair_reference=under_vtc).fairness
    assert fairness is not None
    assert fairness.by_agent == pytest.approx({"dm": 1.5, "ev": 0.5})
    assert (fairness.mean, fairness.max, fairness.at_most_1) == pytest.approx((1.0, 1.5, 0.5))


def test_an_instance_with_a_branch_unfinished_is_left_out() -> None:
    # t.2 did not finish in the run: t has no completion time yet.
    cut = _fan_out((10, 30, 12), 10, "fcfs")
    cut.sessions = [s for s in cut.sessions if s.session_id != "t.2"]
    cut.unfinished = ["t.2"]
    fairness = summarize(cut, fair_reference=_fan_out((20, 5, 15), 18, "vtc")).fairness
    assert fairness is not None
    assert fairness.by_agent == {"ev": 0.5}


def test_a_reference_grouping_sessions_differently_is_refused() -> None:
    under_vtc = _fan_out((20, 5, 15), 18, "vtc")
    under_vtc.sessions[1].task_id = "other"
    with pytest.raises(ValueError, match=r"fair_reference puts session 't.1' in agent instance"):
        summarize(_fan_out((10, 30, 12), 10, "fcfs"), fair_reference=under_vtc)


def test_without_references_the_relative_metrics_are_absent() -> None:
    summary = summarize(_three_sessions())
    assert summary.slowdown is None and summary.goodput is None
    assert summary.slo_attainment is None and summary.slo_attainment_calls is None
    assert summary.fairness is None
    assert summary.slo_factor == DEFAULT_SLO_FACTOR


# --- job completion time per agent instance -----------------------------------------
# instance  sessions        arrival-end          JCT
# j         j.0, j.1        3 - 9, 4 - 15        15 - 3 = 12
# k         k               6 - 10               4
# (m        m.0, m.1        m.1 unfinished       left out)


def _jobs(*, cut: bool = False) -> RunRecord:
    sessions = [
        session("j.0", 3, 9, task_id="j"),
        session("j.1", 4, 15, task_id="j"),
        session("k", 6, 10),
    ]
    if not cut:
        return run(sessions, 15)
    return run([*sessions, session("m.0", 1, 5, task_id="m")], 15, unfinished=["m.1"])


def test_jct_runs_from_an_instance_s_first_arrival_to_its_last_end() -> None:
    # JCTs 12 and 4: mean 8, P50 8, P90 at position 0.9 = 4 + 0.9 x 8
    expected = {"n": 2, "mean": 8, "p50": 8, "p90": 11.2, "p95": 11.6, "p99": 11.92}
    jct = summarize(_jobs()).jct_s
    assert jct is not None and jct.model_dump() == pytest.approx(expected)
    # m.1 did not finish: m has no completion time and is left out
    jct = summarize(_jobs(cut=True)).jct_s
    assert jct is not None and jct.model_dump() == pytest.approx(expected)
    summary = summarize(_jobs())
    assert RunSummary.model_validate(json.loads(json.dumps(summary.to_dict()))) == summary


def test_without_agent_instances_there_is_no_jct() -> None:
    # every session its own job: its JCT is its latency, already in latency_s
    assert summarize(_three_sessions()).jct_s is None


# --- KV ----------------------------------------------------------------------------


def test_eviction_curve_bins_normalized_progress() -> None:
    # window 2 s .. 12 s, 5 bins of 2 s; the last bin includes the end of the run
    record = run(
        [session("a", 2, 12, calls=[call(0, 2, 1, recomputed_tokens=40, preemptions=1)])],
        duration_s=12,
        evictions=[(2.5, 4), (3.9, 2), (4.0, 6), (11.99, 1), (12.0, 3)],
        kv_samples=[KVSample(time_s=5, free=10, used=5, pinned=2)],
        preemptions=1,
        prefix_queries=120,
        prefix_hits=30,
        pinned_block_s=55.5,
    )
    kv = summarize(record, progress_bins=5).kv
    # blocks per bin 6, 6, 0, 0, 4 over 2 s each
    assert kv.eviction_rate_by_progress == [3.0, 3.0, 0.0, 0.0, 2.0]
    assert kv.evicted_blocks == 16
    assert (kv.recomputed_tokens, kv.preemptions, kv.pinned_block_s) == (40, 1, 55.5)
    assert kv.prefix_hit_rate == 0.25


def test_no_prefix_lookups_means_no_hit_rate() -> None:
    kv = summarize(run([session("a", 0, 1)], duration_s=1)).kv
    assert kv.prefix_hit_rate is None
    assert kv.eviction_rate_by_progress == [0.0] * 20


# --- CPU ---------------------------------------------------------------------------


def test_tool_queueing_active_tools_and_core_utilisation() -> None:
    # window 0 .. 20 s; tools queue 0, 1 and 3 s and run 4, 6 and 10 s
    tools_a = [tool(0, 0, 4), tool(5, 6, 12, turn=1)]
    tools_b = [tool(7, 10, 20)]
    record = run(
        [session("a", 0, 15, tools=tools_a), session("b", 1, 20, tools=tools_b)],
        duration_s=20,
        tool_cores=2,
        tool_busy_core_s=30,
    )
    cpu = summarize(record).cpu
    assert cpu.tool_queue_s is not None
    assert (cpu.tool_queue_s.mean, cpu.tool_queue_s.p50) == pytest.approx((4 / 3, 1.0))
    assert cpu.tool_queue_s.p95 == pytest.approx(1 + 0.9 * 2)
    assert cpu.active_tools == 1.0  # 20 tool-seconds over 20 s
    assert cpu.core_utilisation == 0.75  # 30 core-seconds / (2 cores x 20 s)


def test_no_tool_cores_means_no_utilisation() -> None:
    assert (
        summarize(run([session("a", 0, 1)], duration_s=1, tool_cores=0)).cpu.core_utilisation
        is None
    )


# --- edge cases --------------------------------------------------------------------


def test_a_run_where_no_session_finished() -> None:
    record = run([], duration_s=100, unfinished=["a", "b"], evictions=[(5.0, 3)])
    summary = summarize(record, {}, fair_reference=run([], duration_s=1))
    assert (summary.sessions, summary.unfinished, summary.window_s) == (0, 2, None)
    assert summary.latency_s is None and summary.ttft_s is None and summary.tpot_s is None
    assert summary.ttft_by_turn_s == {}
    assert summary.slowdown is None
    assert summary.goodput == {1.0: 0.0, 2.0: 0.0, 3.0: 0.0}  # nothing finished, in time or not
    assert summary.slo_attainment == 0.0 and summary.slo_attainment_calls is None
    assert summary.output_tokens_per_s is None and summary.cpu.active_tools is None
    assert summary.kv.evicted_blocks == 3 and summary.kv.eviction_rate_by_progress == []
    assert summary.fairness is None


def test_a_single_session() -> None:
    record = run([session("a", 1, 5, calls=[call(0, 1, 0.5, 3, 1.0)])], duration_s=5)
    ideal = {"a": session("a", 0, 2, calls=[call(0, 0, 0.5, 3, 0.5)])}
    summary = summarize(record, ideal, slo_factor=2)
    assert summary.latency_s == Distribution(n=1, mean=4, p50=4, p90=4, p95=4, p99=4)
    assert summary.slowdown is not None and summary.slowdown.mean == 2.0
    # slowdown 2 and a 4 s window: misses alpha 1, makes 2 and 3
    assert summary.goodput == {1.0: 0.0, 2.0: 0.25, 3.0: 0.25}
    assert summary.slo_attainment == 1.0  # TTFT 1x, TPOT exactly 2x


def test_distribution_of_nothing_is_none() -> None:
    assert distribution([]) is None


# --- bad input ---------------------------------------------------------------------


def test_an_ideal_run_missing_a_session_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ideal lacks 2 sessions .*'s2', 's3'"):
        summarize(_three_sessions(), {"s1": session("s1", 0, 10)})


def test_an_ideal_run_missing_a_turn_is_refused() -> None:
    alone = _alone()
    alone["s2"].calls.pop()
    with pytest.raises(ValueError, match=r"session 's2' has no call for turn 1"):
        summarize(_three_sessions(), alone)


def test_a_vtc_reference_missing_a_session_is_refused() -> None:
    with pytest.raises(ValueError, match=r"fair_reference lacks 1 sessions .*'s3'"):
        summarize(
            _three_sessions(), fair_reference=run([session("s1", 0, 1), session("s2", 0, 1)], 1)
        )


def test_a_reference_session_with_zero_latency_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ideal: session 'a' has latency <= 0"):
        summarize(run([session("a", 0, 1)], 1), {"a": session("a", 3, 3)})


def test_a_vtc_reference_with_a_session_twice_is_refused() -> None:
    twice = run([session("a", 0, 1), session("a", 0, 2)], 2)
    with pytest.raises(ValueError, match=r"fair_reference has session 'a' twice"):
        summarize(run([session("a", 0, 1)], 1), fair_reference=twice)


def test_a_session_ending_after_the_run_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ends at 12.0 s, after the run's duration_s 10"):
        summarize(run([session("a", 0, 12.0)], duration_s=10))


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"alphas": ()}, "alphas must be positive"),
        ({"alphas": (1.0, 0.0)}, "alphas must be positive"),
        ({"slo_factor": 0.0}, "slo_factor must be positive"),
        ({"progress_bins": 0}, "progress_bins must be at least 1"),
    ],
)
def test_bad_parameters_are_refused(parameters: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        summarize(_three_sessions(), **parameters)  # type: ignore[arg-type]


# --- JSON --------------------------------------------------------------------------


def test_summary_json_round_trip() -> None:
    summary = summarize(_three_sessions(), _alone(), fair_reference=_under_vtc())
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["goodput"] == {"1.0": 1 / WINDOW, "2.0": 1 / WINDOW, "3.0": 2 / WINDOW}
    assert data["ttft_by_turn_s"]["1"]["p50"] == 2.0
    assert RunSummary.model_validate(data) == summary


def test_loaded_throughput_counts_the_calls_that_end_while_sessions_still_arrive() -> None:
    summary = summarize(_three_sessions())
    # Arrivals from 4 s to 20 s; the calls ending in that span: s1's (20 tokens, at
    # 14 s) and s2's first (5 tokens, at 10 s); s2's second ends at 25 s, s3's at 22 s
    # and 80 s: the drain.
    assert summary.loaded_output_tokens_per_s == pytest.approx(25 / 16)
    assert summary.loaded_calls_per_s == pytest.approx(2 / 16)


def test_loaded_throughput_is_none_when_every_session_arrived_at_once() -> None:
    record = run([session("s", 0, 5, calls=[call(0, 0, 1.0, 4, 1.0)])], duration_s=5)
    summary = summarize(record)
    assert summary.loaded_output_tokens_per_s is None and summary.loaded_calls_per_s is None
