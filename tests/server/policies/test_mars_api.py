"""``mars-api`` (seed 001): each rule on a small scenario worked out by hand — the
predictions per API class, the handling at the waste equations' boundaries, the rank
(the area under a call's memory over time), the starvation counter, and the running
batch re-selected every step (a waiting call displaces a running one)."""

from __future__ import annotations

import pytest

from agentmars.sdk.events import ToolEnd
from agentmars.server.metrics.records import CallRecord
from agentmars.server.metrics.summary import summarize
from agentmars.server.policies.interface import Offload, Pin, Release
from agentmars.server.policies.mars_api import MarsApi, MarsApiEngine
from agentmars.server.policies.mars_api.handling import Handling, choose_handling
from agentmars.server.policies.mars_api.predictors import ApiPredictors, Prediction
from agentmars.server.policies.mars_api.ranking import memory_time
from agentmars.server.policies.mars_api.starvation import StarvationGuard
from agentmars.server.policies.registry import make_policy
from agentmars.server.sim.engine import SimConfig
from tests.server.policies.scenarios import calls, run, session, turn
from tests.server.policies.views import EngineData, LinearCosts, call

# Prefill 1 ms a token; a decode step 10 ms; 4 ms to move one 16-token block.
COSTS = LinearCosts(prefill_s_per_token=0.001, decode_step_s=0.01, transfer_s_per_block=0.004)


def engine() -> MarsApiEngine:
    return MarsApi().engine()


# --- predictions ------------------------------------------------------------------------


def test_predictions_are_the_api_class_means_from_the_stream() -> None:
    predictors = ApiPredictors()
    math_call = call("s", next_tool="math", max_tokens=50)
    # No history: the call's own max_tokens; no tool seen: an API of no time.
    assert predictors.predict(math_call) == Prediction(output_tokens=50, api_s=0.0)
    for output, duration in [(10, 1.0), (30, 3.0)]:
        predictors.observe_output(call("s", next_tool="math", output_tokens=output))
        predictors.on_event(ToolEnd(session_id="s", call_id="t", tool="math", duration_s=duration))
    # Math: outputs 10 and 30, durations 1 and 3 s -> 20 tokens, 2 s.
    assert predictors.predict(math_call) == Prediction(output_tokens=20, api_s=2.0)
    # Another class without history of its own: the means over every class.
    assert predictors.predict(call("s", next_tool="image")) == Prediction(20, 2.0)
    # A call that calls no API: its output, and no API time.
    assert predictors.predict(call("s", expects_tool=False)).api_s == 0.0


def test_the_misprediction_study_multiplies_each_prediction_by_seeded_noise() -> None:
    def predicted(error: float, seed: int) -> list[Prediction]:
        predictors = ApiPredictors(error=error, seed=seed)
        predictors.observe_output(call("s", next_tool="qa", output_tokens=100))
        predictors.on_event(ToolEnd(session_id="s", call_id="t", tool="qa", duration_s=10.0))
        return [predictors.predict(call(f"s{i}", next_tool="qa")) for i in range(200)]

    exact = predicted(0.0, 0)
    assert {p.output_tokens for p in exact} == {100} and {p.api_s for p in exact} == {10.0}
    noisy = predicted(0.2, 7)
    assert noisy == predicted(0.2, 7)  # the same seed, the same errors
    assert noisy != predicted(0.2, 8)
    outputs = [p.output_tokens for p in noisy]
    # 1 + N(0, 0.2): mean about 100, sd about 20.
    assert 95 < sum(outputs) / len(outputs) < 105
    assert 15 < (sum((o - 100) ** 2 for o in outputs) / len(outputs)) ** 0.5 < 25


# --- handling ---------------------------------------------------------------------------


def test_the_handling_is_the_least_waste_at_the_equations_boundaries() -> None:
    view = EngineData(costs=COSTS)
    # C = 32 tokens (2 blocks), alone (C_other = 0):
    #   Preserve = T x 32;  Discard = T_fwd(32) x 32 = 0.032 x 32 = 1.024;
    #   Swap = 2 x T_swap(2 blocks) x 32 = 2 x 0.008 x 32 = 0.512.
    # Without a CPU tier: Preserve up to T = 0.032 s (a tie keeps the cheaper to carry
    # out), Discard past it.
    assert choose_handling(32, 0.032, 0, view, can_swap=False) is Handling.PRESERVE
    assert choose_handling(32, 0.0321, 0, view, can_swap=False) is Handling.DISCARD
    # With one: Swap (0.512) once Preserve passes it, at T = 0.016 s.
    assert choose_handling(32, 0.016, 0, view, can_swap=True) is Handling.PRESERVE
    assert choose_handling(32, 0.0161, 0, view, can_swap=True) is Handling.SWAP
    # Other calls in the batch weigh on Discard and Swap (their memory waits too), not
    # on Preserve: with C_other = 96, Discard = 0.032 x 128 = 4.096.
    assert choose_handling(32, 1.0, 96, view, can_swap=False) is Handling.DISCARD
    assert choose_handling(32, 4.0, 96, view, can_swap=False) is Handling.DISCARD
    assert choose_handling(32, 0.128, 96, view, can_swap=False) is Handling.PRESERVE


def test_the_kv_is_handled_as_planned_when_the_call_reaches_its_api() -> None:
    view = EngineData(costs=COSTS, cpu_total_blocks=64)
    half = engine()
    for tool, duration in [("math", 0.001), ("chatbot", 30.0)]:
        half.on_event(ToolEnd(session_id="x", call_id="t", tool=tool, duration_s=duration))
    short = call("a", next_tool="math", prompt_tokens=32, max_tokens=1)
    long = call("b", next_tool="chatbot", prompt_tokens=32, max_tokens=1)
    final = call("c", expects_tool=False)
    for each in (short, long, final):
        half.priority(each, view)  # planned before it is scheduled
    assert half.on_call_finished(short, view) == Pin()  # a 1 ms API: keep it
    assert half.on_call_finished(long, view) == Offload()  # 30 s: swap it out
    assert half.on_call_finished(final, view) == Release()
    # Without a CPU tier the long one is discarded instead.
    half = engine()
    half.on_event(ToolEnd(session_id="x", call_id="t", tool="chatbot", duration_s=30.0))
    half.priority(long, EngineData(costs=COSTS))
    assert half.on_call_finished(long, EngineData(costs=COSTS)) == Release()


# --- ranking ----------------------------------------------------------------------------


def test_the_rank_is_the_area_under_the_calls_memory_to_the_end_of_its_api() -> None:
    view = EngineData(costs=COSTS)
    waiting = call("a", prompt_tokens=100, max_tokens=10)
    predicted = Prediction(output_tokens=10, api_s=2.0)
    # Prefill 100 tokens: 0.1 s holding 100 -> 10. Ten decode steps of 10 ms from a
    # context of 100: 0.01 x (10 x 100 + 1 + 2 + ... + 10) = 0.01 x 1055 = 10.55.
    # Preserve through the 2 s API with 110 tokens: 220.  In all 240.55.
    assert memory_time(waiting, predicted, Handling.PRESERVE, view) == pytest.approx(240.55)
    # Discard: the 110 tokens held while recomputed after it, 0.11 s: 12.1 -> 32.65.
    assert memory_time(waiting, predicted, Handling.DISCARD, view) == pytest.approx(32.65)
    # Swap: 7 blocks out and in, 2 x 0.028 s, holding 110: 6.16 -> 26.71.
    assert memory_time(waiting, predicted, Handling.SWAP, view) == pytest.approx(26.71)
    # No API: the prefill and the decode only.
    assert memory_time(waiting, predicted, None, view) == pytest.approx(20.55)
    # Running, its prompt computed and 6 tokens out: 4 decode steps from 106 left,
    # 0.01 x (4 x 106 + 10) = 4.34, no prefill.
    running = call("a", prompt_tokens=100, output_tokens=6, num_computed_tokens=105)
    assert memory_time(running, predicted, None, view) == pytest.approx(4.34)


def test_a_call_kept_through_its_api_ranks_after_a_longer_one_that_calls_none() -> None:
    # Seed 001's point: size alone is not the rank. "a" generates 5 tokens after a
    # 100-token prompt, then calls a 1 s API while a 2,000-token call runs beside it.
    # Preserve wastes 1 x 105 = 105 token-seconds, Discard 0.105 s x (105 + 2,000) =
    # 221: a is kept, and its rank holds the 105 tokens for that second: prefill
    # 0.1 x 100 = 10, 5 decodes 0.01 x (5 x 100 + 15) = 5.15, the API 105: 120.15.
    # "b" generates 50 tokens and calls nothing: 10 + 0.01 x (50 x 100 + 1,275) = 72.75.
    view = EngineData(costs=COSTS, running=[call("x", prompt_tokens=2000)])
    half = engine()
    half.on_event(ToolEnd(session_id="x", call_id="t", tool="tts", duration_s=1.0))
    a = call("a", next_tool="tts", prompt_tokens=100, max_tokens=5)
    b = call("b", expects_tool=False, prompt_tokens=100, max_tokens=50)
    assert half.plan(a, view).handling is Handling.PRESERVE
    assert half.priority(a, view) == (2, pytest.approx(120.15))
    assert half.priority(b, view) == (2, pytest.approx(72.75))
    # With an API of 10 ms, a holds its tokens for 1.05 token-seconds: it goes first.
    half = engine()
    half.on_event(ToolEnd(session_id="x", call_id="t", tool="tts", duration_s=0.01))
    assert half.priority(a, view) < half.priority(b, view)


# --- starvation -------------------------------------------------------------------------


def test_a_call_starves_after_100_steps_waiting_and_keeps_the_head_until_it_ends() -> None:
    guard = StarvationGuard()
    waiting, running = call("w"), call("r")
    for _ in range(99):
        guard.count_step([waiting], [running])
    assert not guard.is_starving("w/0")
    # Scheduled once: its counter goes back to 0.
    guard.count_step([], [waiting])
    for _ in range(99):
        guard.count_step([waiting], [])
    assert not guard.is_starving("w/0")
    guard.count_step([waiting], [])
    assert guard.is_starving("w/0")  # the 100th step in a row
    guard.count_step([], [waiting])  # running does not end it
    assert guard.is_starving("w/0")
    guard.forget("w/0")  # the call ended
    assert not guard.is_starving("w/0")


def test_a_starving_call_ranks_before_every_call_that_is_not() -> None:
    view = EngineData(costs=COSTS)
    half = MarsApi(starvation_threshold=3).engine()
    big = call("big", expects_tool=False, prompt_tokens=4000, max_tokens=100)
    small = call("small", expects_tool=False, prompt_tokens=10, max_tokens=1)
    assert half.priority(small, view) < half.priority(big, view)
    for _ in range(3):
        half.tick(EngineData(costs=COSTS, waiting=[big], running=[small]))
    assert half.priority(big, view) < half.priority(small, view)
    # Another call starves while big runs: it ranks before the others, not before big,
    # which keeps running to its end.
    half.tick(EngineData(costs=COSTS, waiting=[small], running=[big]))
    for _ in range(3):
        half.tick(EngineData(costs=COSTS, waiting=[small], running=[big]))
    assert half.guard.is_starving("small/0")
    assert half.priority(big, view) < half.priority(small, view)


def test_starvation_prevention_ends_a_starvation_the_ranking_alone_would_cause() -> None:
    # One call at a time (max_num_seqs 1), 10 ms steps. "big" (80 tokens out) and a
    # stream of "small" sessions, one every 10 ms for 1.5 s, each 1 token: the engine
    # is just saturated. Ranked alone, every small call goes before big (a smaller
    # area; one displaces big at 0.11 s after big got its first token), and big ends
    # after the stream, at 1.5 + 0.8 = 2.3 s. With a threshold of 20 steps big starves
    # at 0.11 + 0.2 s, takes the head, recomputes its context in one step and runs its
    # remaining 79 tokens undisturbed: it ends at about 0.32 + 0.8 s.
    smalls = [session(f"s{i:03d}", turn(16, 1), arrival_s=0.01 * i) for i in range(150)]
    big = session("big", turn(16, 80), arrival_s=0.0)

    def big_call(policy: str) -> CallRecord:
        return calls(run(policy, big, *smalls, max_num_seqs=1), "big")[-1]

    assert big_call("mars-api:starvation_threshold=1000").end_s == pytest.approx(2.3)
    starving = big_call("mars-api:starvation_threshold=20")
    assert 1.05 < starving.end_s < 1.15
    assert starving.preemptions == 1  # once running as starving, never again


# --- the running batch re-selected every step -------------------------------------------


def test_a_waiting_call_ranked_first_displaces_a_running_one() -> None:
    # One call at a time. "long" (60 tokens, no tool) starts at 0; "short" (2 tokens)
    # arrives at 0.095 s. FCFS (vLLM): short waits until long ends at 0.6 s. mars-api:
    # short's area is far smaller, so it displaces long at the next step, 0.1 s (long
    # preempted after 10 tokens), and ends two steps later, at 0.12 s.
    long = session("long", turn(16, 60), arrival_s=0.0)
    short = session("short", turn(16, 2), arrival_s=0.095)
    fcfs = run("fcfs", long, short, max_num_seqs=1)
    assert calls(fcfs, "short")[0].end_s >= 0.6
    assert calls(fcfs, "long")[0].preemptions == 0
    ranked = run("mars-api", long, short, max_num_seqs=1)
    assert calls(ranked, "short")[0].end_s == pytest.approx(0.12)
    assert calls(ranked, "long")[0].preemptions == 1
    # Long's context is recomputed in the step that yields its 11th token, then its
    # 49 remaining tokens follow: 0.12 + 0.5 s.
    assert calls(ranked, "long")[0].end_s == pytest.approx(0.62)


def test_a_displaced_call_s_kv_stays_pinned_when_the_engine_keeps_it() -> None:
    # The scenario above. Long is displaced at 0.1 s with 25 tokens computed (16 of
    # prompt, 9 of its 10 outputs): one full 16-token block. Freed, as vLLM frees it,
    # the block stays in the prefix cache (nothing else needs it); kept, it is pinned
    # until long is admitted again as short ends, at 0.12 s: 0.02 block-seconds. Either
    # way long hits that block and recomputes the other 9 tokens, and ends at 0.62 s.
    long = session("long", turn(16, 60), arrival_s=0.0)
    short = session("short", turn(16, 2), arrival_s=0.095)
    for keep, pinned_block_s in ((False, 0.0), (True, 0.02)):
        ranked = run(
            "mars-api", long, short, max_num_seqs=1, config=SimConfig(displaced_keep_kv=keep)
        )
        assert ranked.pinned_block_s == pytest.approx(pinned_block_s), keep
        assert summarize(ranked).kv.recomputed_tokens == 9
        assert calls(ranked, "long")[0].end_s == pytest.approx(0.62)


def test_it_is_registered_and_checks_its_settings() -> None:
    assert isinstance(make_policy("mars-api"), MarsApi)
    assert make_policy("mars-api:prediction_error=0.3").settings()["prediction_error"] == 0.3
    for bad in ("starvation_threshold=0", "prediction_error=-1"):
        with pytest.raises(ValueError):
            make_policy(f"mars-api:{bad}")
