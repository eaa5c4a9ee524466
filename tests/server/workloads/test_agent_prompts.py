"""The prompts Justitia's cost predictor learns from (``workloads.agent_prompts``):
real text per seed 004 agent class, drawn as the task-parallel workloads draw their
agents (``draw_agent``), the same for the same seed, with the fan-out it names
driving the agent's cost; and the workloads' sessions carrying that text."""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import pytest

from agentmars.server.workloads.agent_prompts import (
    AGENT_TYPES,
    agent_samples,
    draw_agent,
    draw_sample,
    sample_mix,
    sessions_cost,
)
from agentmars.server.workloads.model import SessionSpec
from agentmars.server.workloads.registry import build_workload
from agentmars.server.workloads.task_parallel import (
    AGENT_CLASSES,
    QWEN25_32B_CONTEXT,
    AgentClass,
)


def test_prompts_are_the_same_for_the_same_seed() -> None:
    assert agent_samples("PE", 5, seed=4) == agent_samples("PE", 5, seed=4)
    assert agent_samples("PE", 5, seed=4) != agent_samples("PE", 5, seed=5)
    assert {s.agent for s in sample_mix(1, seed=0)} == {
        "EV", "FV", "CC", "ALFWI", "KBQAV", "CG", "PE", "SC", "DM", "MRS"
    }  # fmt: skip


def test_the_fan_out_named_in_the_prompt_drives_the_cost() -> None:
    samples = agent_samples("SC", 200, seed=0)
    paths = [int(re.search(r"Sample (\d+) ", s.prompt).group(1)) for s in samples]  # type: ignore[union-attr]
    costs = [math.log(s.cost) for s in samples]
    # not higher: the detail instruction and the unseen output lengths share the rest
    assert np.corrcoef(paths, costs)[0, 1] > 0.3


def test_samples_are_as_before_draw_agent() -> None:
    # Pinned from the draw before the workloads drew their agents with draw_agent: the
    # predictor's training and test data (and agentmars bench justitia-predictor's
    # figures) stay as they were for the same seed.
    expected = {
        "SC": [(6268290.0, 456, "aab3d2a97cd6d62d"), (4557147.5, 356, "7adf3b88d6f0f976")],
        "EV": [(91641.0, 1404, "3ce8f4e53cde5e76"), (167071.5, 824, "dd2e706a73f6bb25")],
    }
    for agent, pinned in expected.items():
        samples = agent_samples(agent, 2, seed=3)
        digests = [hashlib.sha256(s.prompt.encode()).hexdigest()[:16] for s in samples]
        assert [(s.cost, len(s.prompt), d) for s, d in zip(samples, digests, strict=True)] == (
            pinned
        )


@pytest.mark.parametrize("agent", AGENT_CLASSES, ids=AGENT_TYPES)
def test_a_sample_is_the_agent_draw_agent_draws(agent: AgentClass) -> None:
    sample = draw_sample(agent, np.random.default_rng(11))
    sessions = draw_agent(agent, np.random.default_rng(11), "x-00000", QWEN25_32B_CONTEXT)
    assert {s.input_text for s in sessions} == {sample.prompt}
    assert sessions_cost(sessions) == sample.cost
    assert {s.agent for s in sessions} == {agent.name}  # the class, not the instance
    branches = [s for s in sessions if not s.after]
    assert [s.session_id for s in branches] == [f"x-00000.{i}" for i in range(len(branches))]
    assert {s.task_id for s in sessions} == {"x-00000"}
    # MRS's reduce waits for every map; no other class has an aggregation session.
    waiting = [s for s in sessions if s.after]
    if agent.reduce_output:
        assert [(s.session_id, s.after) for s in waiting] == [
            ("x-00000.reduce", tuple(s.session_id for s in branches))
        ]
        (reduce,) = waiting
        read = sum(s.turns[-1].output_tokens for s in branches)
        instruction = round(agent.prompt * agent.shared)
        assert reduce.turns[0].append_tokens == min(instruction + read, QWEN25_32B_CONTEXT)
    else:
        assert waiting == []


def _instances(sessions: tuple[SessionSpec, ...]) -> dict[str, list[SessionSpec]]:
    by_instance: dict[str, list[SessionSpec]] = {}
    for session in sessions:
        assert session.task_id is not None
        by_instance.setdefault(session.task_id, []).append(session)
    return by_instance


def test_the_workload_s_agents_carry_their_input_text() -> None:
    workload = build_workload("task-parallel", sessions=300, seed=5, concurrency=1)
    instances = _instances(workload.sessions)
    assert len(instances) == 300
    texts = []
    for branches in instances.values():
        # every branch of an instance carries the instance's one text
        (text,) = {branch.input_text for branch in branches}
        assert text
        texts.append(text)
        # and the text names the agent it rides on: SC's paths, CG's candidates, DM's
        # merges, one claim, statement or question per branch, one section per MRS map
        # (its reduce, which waits for the maps, is not an item)
        count = len([branch for branch in branches if not branch.after])
        agent = branches[0].agent
        if agent == "SC":
            assert f"Sample {count} independent reasoning paths" in text
        elif agent in ("CG", "DM"):
            assert re.search(rf"^(Write|Propose) {count} candidate", text)
        elif agent in ("EV", "FV", "CC", "KBQAV", "MRS"):
            items = re.findall(r"^(Claim|Statement|Question|Section) \d+: ", text, re.M)
            assert len(items) == count
    assert len(set(texts)) == len(texts)  # every agent its own input
