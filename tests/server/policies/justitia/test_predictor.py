"""Justitia's per-agent-type cost predictor (seed 004 §4.2): TF-IDF + a 4-layer MLP per
agent type, trained on the prompts of ``workloads.agent_prompts`` and their true KV
token-time; online refits; the fallback of a type without a model; input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentmars.server.policies.justitia.predictor import (
    OVERALL,
    CostPredictor,
    accuracy,
    cost_model,
)
from agentmars.server.workloads.agent_prompts import AgentSample, agent_samples

TYPES = ("EV", "SC")  # a small and a medium class, ~30x apart in cost, short prompts


@pytest.fixture(scope="module")
def trained() -> CostPredictor:
    predictor = CostPredictor()
    predictor.fit([s for agent in TYPES for s in agent_samples(agent, 100, seed=0)])
    return predictor


def geometric_mean(costs: list[float]) -> float:
    return float(np.exp(np.mean(np.log(costs))))


def constant_mape(constant: float, held_out: list[AgentSample]) -> float:
    return float(np.mean([abs(constant - s.cost) / s.cost for s in held_out]))


@pytest.mark.parametrize("agent", TYPES)
def test_beats_a_constant_on_held_out_agents(trained: CostPredictor, agent: str) -> None:
    training = [s.cost for s in agent_samples(agent, 100, seed=0)]
    held_out = agent_samples(agent, 100, seed=1)
    figures = accuracy(trained, held_out)[agent]
    best_constant = min(
        constant_mape(float(np.mean(training)), held_out),
        constant_mape(geometric_mean(training), held_out),
    )
    assert figures.mape < 0.8 * best_constant
    assert figures.r2 > 0.2  # the constant's R^2 is <= 0 on held-out data


def test_a_type_is_predicted_by_its_own_model(trained: CostPredictor) -> None:
    prompt = agent_samples("EV", 1, seed=2)[0].prompt
    as_ev, as_sc = trained.predict("EV", prompt), trained.predict("SC", prompt)
    ev_costs = [s.cost for s in agent_samples("EV", 100, seed=0)]
    sc_costs = [s.cost for s in agent_samples("SC", 100, seed=0)]
    assert min(ev_costs) <= as_ev <= max(ev_costs)
    assert min(sc_costs) <= as_sc <= max(sc_costs)
    assert as_sc > 5 * as_ev
    assert set(trained.fitted_types) == set(TYPES)


def test_the_mlp_has_four_layers_and_a_first_layer_sized_by_the_input() -> None:
    prompts = ["one two three four " * 25, "five six seven eight " * 25]  # 100 words each
    model = cost_model(mean_input_words=100, seed=0).fit(prompts, np.array([1e5, 2e5]))
    mlp = model.regressor_.steps[-1][1]
    assert mlp.n_layers_ == 4
    assert mlp.hidden_layer_sizes == (25, 12)


def test_training_is_deterministic_per_seed() -> None:
    samples = agent_samples("EV", 30, seed=0)
    prompt = agent_samples("EV", 1, seed=3)[0].prompt
    first, second = CostPredictor(seed=5), CostPredictor(seed=5)
    first.fit(samples)
    second.fit(samples)
    assert first.predict("EV", prompt) == second.predict("EV", prompt)


def test_observe_refits_every_n_samples() -> None:
    samples = agent_samples("EV", 10, seed=0)
    prompt = agent_samples("EV", 1, seed=3)[0].prompt
    predictor = CostPredictor(refit_every=5)
    refits = [predictor.observe(s.agent, s.prompt, s.cost) for s in samples[:5]]
    assert refits == [False, False, False, False, True]
    assert predictor.fitted_types == ("EV",)
    after_five = predictor.predict("EV", prompt)
    refits = [predictor.observe(s.agent, s.prompt, s.cost) for s in samples[5:]]
    assert refits == [False, False, False, False, True]
    assert predictor.predict("EV", prompt) != after_five


def test_a_type_without_a_model_gets_a_geometric_mean() -> None:
    predictor = CostPredictor(refit_every=5)
    ev, sc = agent_samples("EV", 3, seed=0), agent_samples("SC", 2, seed=0)
    for s in [*ev, *sc]:
        predictor.observe(s.agent, s.prompt, s.cost)
    assert predictor.fitted_types == ()
    own = geometric_mean([s.cost for s in ev])
    everyone = geometric_mean([s.cost for s in [*ev, *sc]])
    assert predictor.predict("EV", "any input") == pytest.approx(own)
    assert predictor.predict("MRS", "an unseen type") == pytest.approx(everyone)


def test_nothing_to_predict_before_any_cost_is_seen() -> None:
    with pytest.raises(ValueError, match="no cost has been seen"):
        CostPredictor().predict("EV", "Verify each claim.")


@pytest.mark.parametrize(
    ("agent", "prompt", "cost", "message"),
    [
        ("EV", "", 1e5, "prompt must not be empty"),
        ("EV", "  \n", 1e5, "prompt must not be empty"),
        ("EV", "Verify.", -1.0, "positive finite"),
        ("EV", "Verify.", 0.0, "positive finite"),
        ("EV", "Verify.", math.nan, "positive finite"),
        ("", "Verify.", 1e5, "non-empty name"),
    ],
)
def test_bad_samples_are_rejected(agent: str, prompt: str, cost: float, message: str) -> None:
    predictor = CostPredictor()
    with pytest.raises(ValueError, match=message):
        predictor.observe(agent, prompt, cost)
    with pytest.raises(ValueError, match=message):
        predictor.fit([AgentSample(agent, prompt, cost)])


def test_an_empty_prompt_is_not_predicted(trained: CostPredictor) -> None:
    with pytest.raises(ValueError, match="prompt must not be empty"):
        trained.predict("EV", " ")


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="refit_every"):
        CostPredictor(refit_every=0)


def test_overall_accuracy_weighs_every_sample(trained: CostPredictor) -> None:
    held_out = [*agent_samples("EV", 30, seed=1), *agent_samples("SC", 10, seed=1)]
    figures = accuracy(trained, held_out)
    assert [figures[t].samples for t in (*TYPES, OVERALL)] == [30, 10, 40]
    weighted = (30 * figures["EV"].mape + 10 * figures["SC"].mape) / 40
    assert figures[OVERALL].mape == pytest.approx(weighted)
    with pytest.raises(ValueError, match="at least one sample"):
        accuracy(trained, [])
