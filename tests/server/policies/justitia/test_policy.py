"""The ``justitia`` policy's halves and seed 004's baselines (``srjf``, ``parrot``,
``vllm-sjf``), each on a scenario worked out by hand: the engine half's virtual-time
order over announced costs, the admission half's prediction and online learning, and
each baseline's order."""

from __future__ import annotations

import math
from collections.abc import Sequence

import httpx
import pytest

from agentmars.sdk.events import AnyEvent, LLMEnd, SessionEnd, SessionStart, TaskCost
from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.policies import vllm_sjf
from agentmars.server.policies.interface import AdmissionHalf, Policy
from agentmars.server.policies.justitia.admission import CostAdmission, pretrained_predictor
from agentmars.server.policies.justitia.predictor import CostPredictor
from agentmars.server.policies.justitia.scheduler import AnnouncedCosts, JustitiaEngine
from agentmars.server.policies.parrot import ParrotEngine
from agentmars.server.policies.registry import make_policy
from agentmars.server.policies.srjf import SRJFEngine
from agentmars.server.policies.views import AdmissionView, SessionView
from agentmars.server.policies.vllm_sjf import VllmSJFEngine
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.web.ingest import EventHub
from agentmars.server.web.serving import serve_in_thread
from agentmars.server.workloads.agent_prompts import agent_samples
from agentmars.server.workloads.model import SessionSpec
from tests.server.policies.scenarios import ends, run, turn
from tests.server.policies.views import AdmissionData, EngineData, SessionData, call

# M = 10 blocks x 10 tokens = 100 KV tokens: V grows by 100 / N per decode iteration.
ENGINE = EngineData(total_blocks=10, block_size=10)


def at(steps: int) -> EngineData:
    return EngineData(total_blocks=10, block_size=10, decode_steps=steps)


def announce(half: JustitiaEngine | SRJFEngine, **costs: float) -> None:
    for task, cost in costs.items():
        half.on_event(TaskCost(task_id=task, cost=cost))


def test_calls_are_served_by_their_instance_virtual_finish_tag() -> None:
    half = JustitiaEngine()
    announce(half, A=1000, B=100, C=500)
    # Step 0: A arrives, V = 0: F_A = 0 + 1000.
    assert half.priority(call("a", task_id="A"), at(0)) == (1000, 0)
    # Step 5: V = 5 x 100 / 1 = 500 (A alone in GPS); B arrives: F_B = 600.
    assert half.priority(call("b", task_id="B"), at(5)) == (600, 1)
    # Step 6: V = 500 + 100 / 2 = 550; C arrives: F_C = 1050.
    assert half.priority(call("c", task_id="C"), at(6)) == (1050, 2)
    # B, the latest but smallest, first; a later arrival never reorders earlier tags.
    keys = {t: half.priority(call(t.lower(), task_id=t), at(9)) for t in "ABC"}
    assert sorted(keys, key=keys.__getitem__) == ["B", "A", "C"]


def test_a_tag_is_fixed_at_arrival_and_an_unannounced_instance_gets_the_typical_cost() -> None:
    half = JustitiaEngine()
    announce(half, A=1000, B=100, C=500)
    half.priority(call("a", task_id="A"), at(0))
    # D was never announced: the geometric mean of 1000, 100, 500 (368.4) at V = 200.
    (finish, _) = half.priority(call("d", task_id="D"), at(2))
    assert finish == pytest.approx(200 + (1000 * 100 * 500) ** (1 / 3))
    announce(half, D=5)  # too late: D's tag stays
    assert half.priority(call("d", 1, task_id="D"), at(3))[0] == pytest.approx(finish)


def test_only_the_newest_announcements_are_kept() -> None:
    # Costs announced for instances whose calls go to another replica are never read
    # here: only the newest few are kept, the oldest falls back to the typical cost.
    costs = AnnouncedCosts(limit=2)
    for task, cost in {"A": 1000.0, "B": 100.0, "C": 10.0}.items():
        costs.on_event(TaskCost(task_id=task, cost=cost))
    assert costs.cost("B") == 100 and costs.cost("C") == 10
    assert costs.cost("A") == pytest.approx(100.0)  # the geometric mean of all three
    costs.on_event(TaskCost(task_id="B", cost=50.0))  # re-announced: newest again
    costs.on_event(TaskCost(task_id="D", cost=1.0))
    assert costs.cost("B") == 50 and costs.cost("D") == 1
    assert costs.cost("C") != 10


def test_a_late_session_rejoins_its_ended_instance_until_it_is_forgotten() -> None:
    half = JustitiaEngine()
    half.instances.remember = 1
    announce(half, T=300, U=50)
    half.on_event(SessionStart(session_id="t.1", metadata={"task_id": "T"}))
    assert half.priority(call("t.0", task_id="T"), at(0)) == (300, 0)
    half.on_event(SessionEnd(session_id="t.0"))
    half.on_event(SessionEnd(session_id="t.1"))
    # T's sessions all ended, but an aggregation step that starts now (its reduce,
    # waiting for its branches) is still T: the same tag, no new arrival.
    assert half.priority(call("t.reduce", task_id="T"), at(2)) == (300, 0)
    half.on_event(SessionEnd(session_id="t.reduce"))
    assert half.clock is not None and half.clock.knows("T")
    # Once another instance has ended since (one remembered here), T is forgotten: the
    # same id later is a new instance, with a new tag: V (300 by then: T alone in GPS
    # for 3 iterations) plus the typical cost of those announced so far, 300 and 50.
    half.priority(call("u", task_id="U"), at(3))
    half.on_event(SessionEnd(session_id="u"))
    assert not half.clock.knows("T") and half.clock.knows("U")
    (finish, rank) = half.priority(call("t.9", task_id="T"), at(3))
    assert rank == 2 and finish == pytest.approx(half.clock.value + math.sqrt(300 * 50))


def test_the_engine_half_orders_calls_on_the_simulated_engine() -> None:
    class Announced(AdmissionHalf):
        def admit(self, queue: Sequence[SessionView], view: AdmissionView) -> Sequence[SessionView]:
            for session in queue:
                self.publish(TaskCost(task_id=session.task_id, cost=COSTS[session.task_id]))
            return queue

    class Fixed(Policy):
        name = "justitia-fixed-costs"

        def admission(self) -> AdmissionHalf:
            return Announced()

        def engine(self) -> JustitiaEngine:
            return JustitiaEngine()

    # One call at a time, 10 ms a step (scenarios.py). E (an elephant, two branches of
    # 10 tokens) and mouse m arrive at once; mouse n a step later.
    COSTS = {"E": 10_000.0, "m": 50.0, "n": 60.0}
    workload = (
        SessionSpec(session_id="E.0", task_id="E", turns=(turn(16, 10),)),
        SessionSpec(session_id="E.1", task_id="E", turns=(turn(16, 10),)),
        SessionSpec(session_id="m", task_id="m", turns=(turn(16, 2),)),
        SessionSpec(session_id="n", task_id="n", arrival_s=0.005, turns=(turn(16, 2),)),
    )
    # 0.00: tags (M = 128 tokens): E 10,000, m 50: m runs 0.00-0.02 (non-preemptive).
    # 0.02: n (arrived 0.005; V tiny) has tag ~60 < E's: n runs 0.02-0.04, then E's
    #       branches 0.04-0.14 and 0.14-0.24. FCFS would run E.0, E.1, m, n.
    record = run(Fixed(), *workload, max_num_seqs=1)
    assert ends(record) == pytest.approx({"m": 0.02, "n": 0.04, "E.0": 0.14, "E.1": 0.24})
    assert ends(run("fcfs", *workload, max_num_seqs=1)) == pytest.approx(
        {"E.0": 0.10, "E.1": 0.20, "m": 0.22, "n": 0.24}
    )


# --- the admission half ----------------------------------------------------------------


class Recording(CostPredictor):
    """A real predictor that also keeps what it was asked to learn."""

    def __init__(self) -> None:
        super().__init__(refit_every=1)
        self.learnt: list[tuple[str, str, float]] = []

    def observe(self, agent_type: str, prompt: str, cost: float) -> bool:
        self.learnt.append((agent_type, prompt, cost))
        return super().observe(agent_type, prompt, cost)


def trained() -> Recording:
    predictor = Recording()
    predictor.fit(agent_samples("EV", 12, seed=0) + agent_samples("MRS", 12, seed=0))
    return predictor


def test_each_instance_is_predicted_once_from_its_input_and_announced() -> None:
    predictor = trained()
    half = CostAdmission(predictor)
    published: list[AnyEvent] = []
    half.publish = published.append
    mrs, ev = agent_samples("MRS", 1, seed=9)[0].prompt, agent_samples("EV", 1, seed=9)[0].prompt
    queue = [
        SessionData("m.0", 500, agent="MRS", task_id="m", prompt_text=mrs),
        SessionData("m.1", 500, agent="MRS", task_id="m", prompt_text=mrs),
        SessionData("e.0", 100, agent="EV", task_id="e", prompt_text=ev),
        SessionData("x", 100, agent="new-kind", prompt_text=""),
    ]
    assert list(half.admit(queue, AdmissionData())) == queue  # Justitia admits everyone
    costs = {event.task_id: event.cost for event in published if isinstance(event, TaskCost)}
    assert len(published) == 3
    assert costs["m"] == pytest.approx(predictor.predict("MRS", mrs))
    assert costs["e"] == pytest.approx(predictor.predict("EV", ev))
    assert costs["m"] > 10 * costs["e"]  # an MRS agent is an elephant next to an EV one
    # No text, unknown type: the typical cost of all the agents seen.
    assert costs["x"] == pytest.approx(predictor.typical("new-kind"))


def test_an_instance_is_learnt_from_when_its_last_session_ends() -> None:
    predictor = trained()
    half = CostAdmission(predictor)
    text = agent_samples("EV", 1, seed=9)[0].prompt
    queue = [
        SessionData("e.0", 100, agent="EV", task_id="e", prompt_text=text),
        SessionData("e.1", 100, agent="EV", task_id="e", prompt_text=text),
    ]
    half.admit(queue, AdmissionData())
    for session, (prompt, output) in (("e.0", (100, 20)), ("e.1", (120, 10))):
        half.on_event(
            LLMEnd(session_id=session, call_id="c", prompt_tokens=prompt, output_tokens=output)
        )
    half.on_event(SessionEnd(session_id="e.0"))
    assert predictor.learnt == []
    half.on_event(SessionEnd(session_id="e.1"))
    # Eq. 1: 100 x 20 + 20^2 / 2 + 120 x 10 + 10^2 / 2 = 2,200 + 1,250.
    assert predictor.learnt == [("EV", text, 3450.0)]
    # A session that starts after (an aggregation step) rejoins the instance: it is
    # neither announced again nor learnt from twice.
    published: list[AnyEvent] = []
    half.publish = published.append
    late = SessionData("e.reduce", 50, agent="EV", task_id="e", prompt_text=text)
    half.admit([late], AdmissionData())
    half.on_event(SessionEnd(session_id="e.reduce"))
    assert published == [] and len(predictor.learnt) == 1


# --- the baselines ---------------------------------------------------------------------


def test_srjf_serves_the_least_predicted_cost_left_first() -> None:
    half = SRJFEngine()
    announce(half, A=1000, B=800)
    a, b = call("a.0", task_id="A"), call("b.0", task_id="B")
    assert half.priority(b, ENGINE) < half.priority(a, ENGINE)
    # A call of A ends: 20 x 20 + 20^2 / 2 = 600 used, 400 left < B's 800.
    half.on_event(LLMEnd(session_id="a.0", call_id="x", prompt_tokens=20, output_tokens=20))
    assert half.priority(a, ENGINE) == (400, 1) < half.priority(b, ENGINE) == (800, 0)


def test_parrot_serves_whole_agents_in_arrival_order() -> None:
    half = ParrotEngine()
    late = call("t1.0", task_id="t1", session_arrival_s=1.0, arrival_s=1.0)
    early_agent = call("t2.0", task_id="t2", session_arrival_s=0.5, arrival_s=3.0)
    # A branch of t2 that starts later still ranks with its agent.
    later_branch = call("t2.1", task_id="t2", session_arrival_s=2.0, arrival_s=2.5)
    keys = [half.priority(c, ENGINE) for c in (late, early_agent, later_branch)]
    assert keys == [(1.0, 0, 1.0), (0.5, 1, 3.0), (0.5, 1, 2.5)]
    assert sorted(keys)[0] == keys[2]


def test_vllm_sjf_ranks_calls_by_the_output_their_type_and_step_had() -> None:
    half = VllmSJFEngine()
    for session, agent in (("e1", "EV"), ("e2", "EV"), ("r1", "MRS")):
        half.on_event(SessionStart(session_id=session, agent=agent))
    for session, output in (("e1", 100), ("e2", 200), ("r1", 40)):
        half.on_event(LLMEnd(session_id=session, call_id="c", turn=0, output_tokens=output))
    ev, mrs = call("e3", agent="EV", prompt_tokens=10), call("r2", agent="MRS")
    assert half.priority(ev, ENGINE) == (150, 10, 0.0)
    assert half.priority(mrs, ENGINE)[0] == 40  # shorter: first
    # A step no call of the type reached yet: the type's mean; an unknown type: all calls'.
    assert half.priority(call("e3", 1, agent="EV"), ENGINE)[0] == 150
    assert half.priority(call("z", agent="other"), ENGINE)[0] == pytest.approx(340 / 3)
    assert not math.isnan(half.predicted_output(call("z", agent="other")))


# --- both halves through the gateway and the twin ------------------------------------


def test_the_gateway_half_announces_each_instance_to_the_engine_half_of_the_twin() -> None:
    # The real gateway in front of the wall-clock twin, linked by the event hub as
    # ``agentmars serve --engine sim`` links them: the gateway half reads the instance's
    # input from the first call, predicts, and the twin's engine half ranks by it.
    profile = load_profile("cpu-tiny")
    policy = make_policy("justitia", pretrain_per_type=12)
    hub = EventHub()
    engine = LiveEngine(profile, policy, publish=lambda e: hub.publish([e]))
    text = agent_samples("MRS", 1, seed=9)[0].prompt
    with serve_in_thread(create_live_app(engine)) as engine_url:
        config = GatewayConfig(
            upstream_url=engine_url, token="t", policy="justitia",
            policy_settings={"pretrain_per_type": 12}, block_size=profile.block_size,
        )  # fmt: skip
        app = create_gateway_app(config, hub=hub)
        hub.subscribe(engine.observe_threadsafe)
        with serve_in_thread(app) as gateway_url:
            for branch in ("m.0", "m.1"):
                body = {
                    "model": "cpu-tiny",
                    "messages": [{"role": "user", "content": text}],
                    "max_tokens": 2,
                    "session_id": branch,
                    "vllm_xargs": {"task_id": "m", "agent": "MRS"},
                }
                answer = httpx.post(f"{gateway_url}/v1/chat/completions", json=body, timeout=60)
                assert answer.status_code == 200, answer.text
    half = engine.half
    assert isinstance(half, JustitiaEngine)
    expected = pretrained_predictor(12).predict("MRS", text)
    assert half.costs.cost("m") == pytest.approx(expected)  # announced once, for both
    assert half.clock is not None and half.clock.finish_tag("m") == pytest.approx(expected)


@pytest.mark.parametrize(
    "settings",
    [{"pretrain_per_type": -1}, {"pretrain_per_type": 1.5}, {"seed": -2}, {"seed": True}],
)
def test_bad_settings_are_refused_with_a_message(settings: dict[str, object]) -> None:
    for name in ("justitia", "srjf"):
        with pytest.raises(ValueError, match=next(iter(settings))):
            make_policy(name, **settings)


class Wild(CostPredictor):
    """A real predictor whose model answers ``answer`` whatever the input."""

    def __init__(self, answer: float) -> None:
        super().__init__()
        self.answer = answer

    def predict(self, agent_type: str, prompt: str) -> float:
        return self.answer


@pytest.mark.parametrize(("answer", "announced"), [(1e30, float(2**53)), (-5.0, 0.0)])
def test_a_wild_prediction_is_announced_within_what_an_event_carries(
    answer: float, announced: float
) -> None:
    predictor = Wild(answer)
    predictor.fit(agent_samples("EV", 3, seed=0))
    half = CostAdmission(predictor)
    published: list[AnyEvent] = []
    half.publish = published.append
    half.admit([SessionData("s", 10, agent="EV", prompt_text="Claim 1.")], AdmissionData())
    assert [e.cost for e in published if isinstance(e, TaskCost)] == [announced]


def test_an_infinite_prediction_falls_back_to_the_typical_cost() -> None:
    predictor = Wild(math.inf)
    predictor.fit(agent_samples("EV", 3, seed=0))
    half = CostAdmission(predictor)
    published: list[AnyEvent] = []
    half.publish = published.append
    half.admit([SessionData("s", 10, agent="EV", prompt_text="Claim 1.")], AdmissionData())
    assert [e.cost for e in published if isinstance(e, TaskCost)] == [
        pytest.approx(predictor.typical("EV"))
    ]


def test_vllm_sjf_keeps_means_for_a_bounded_number_of_types_and_steps() -> None:
    half = VllmSJFEngine()
    for i in range(vllm_sjf.MAX_AGENTS + 1):
        half.on_event(SessionStart(session_id=f"s{i}", agent=f"type-{i}"))
        turn = vllm_sjf.MAX_STEPS if i == 0 else 0
        half.on_event(LLMEnd(session_id=f"s{i}", call_id="c", turn=turn, output_tokens=10))
    assert len(half.by_agent) == vllm_sjf.MAX_AGENTS
    assert ("type-0", vllm_sjf.MAX_STEPS) not in half.by_step
    assert half.overall.count == vllm_sjf.MAX_AGENTS + 1  # every call still counts
