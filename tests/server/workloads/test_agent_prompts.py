"""The prompts Justitia's cost predictor learns from (``workloads.agent_prompts``):
real text per seed 004 agent class, drawn from the task-parallel generator's agents,
the same for the same seed, with the fan-out it names driving the agent's cost."""

from __future__ import annotations

import math
import re

import numpy as np

from agentmars.server.workloads.agent_prompts import agent_samples, sample_mix


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
