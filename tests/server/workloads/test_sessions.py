"""Assembling sessions: context cap, shared prefix, tool kinds."""

from __future__ import annotations

import pytest

from agentmars.server.workloads.model import ToolSpec, TurnSpec
from agentmars.server.workloads.sessions import assemble_session
from agentmars.server.workloads.tool_kinds import canonical_kind, tool_call

BASH = ToolSpec(kind="bash", wall_s=1.0, cpu_s=1.0)
WEB = ToolSpec(kind="web", wall_s=2.0)


def test_turns_are_kept_while_the_context_fits() -> None:
    # Contexts after each turn: 100 + 10 = 110, + 50 + 10 = 170, + 40 + 10 = 220 > 200.
    session = assemble_session(
        "s",
        agent="a",
        first_prompt=100,
        appends=[50, 40],
        outputs=[10, 10, 10],
        tools=[BASH, WEB],
        max_context=200,
        shared_prefix=30,
        prefix_group="g",
    )
    assert session.turns == (
        TurnSpec(append_tokens=100, output_tokens=10, tool=BASH),
        TurnSpec(append_tokens=50, output_tokens=10),
    )
    assert (session.shared_prefix_tokens, session.prefix_group) == (30, "g")
    assert (
        max(session.prompt_tokens(i) + t.output_tokens for i, t in enumerate(session.turns)) <= 200
    )


def test_a_first_prompt_too_long_is_cut_with_its_shared_prefix() -> None:
    session = assemble_session(
        "s",
        agent="a",
        first_prompt=5000,
        appends=[50],
        outputs=[30, 10],
        tools=[BASH],
        max_context=1000,
        shared_prefix=4000,
        prefix_group="g",
    )
    assert session.turns == (TurnSpec(append_tokens=970, output_tokens=30),)
    assert session.shared_prefix_tokens == 970


def test_no_shared_prefix_means_no_group() -> None:
    session = assemble_session(
        "s",
        agent="a",
        first_prompt=5,
        appends=[],
        outputs=[1],
        tools=[],
        max_context=10,
        prefix_group="g",
    )
    assert (session.shared_prefix_tokens, session.prefix_group) == (0, None)


def test_mismatched_lengths_and_tiny_contexts_are_refused() -> None:
    with pytest.raises(ValueError, match="one append and one tool per turn"):
        assemble_session(
            "s", agent="a", first_prompt=5, appends=[1], outputs=[1], tools=[], max_context=10
        )
    with pytest.raises(ValueError, match="max_context 1 leaves no room"):
        assemble_session(
            "s", agent="a", first_prompt=5, appends=[], outputs=[1], tools=[], max_context=1
        )


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Bash", "bash"),
        ("exec_command", "bash"),
        ("Read", "read"),
        ("Edit", "edit"),
        ("apply_patch", "edit"),
        ("Grep", "search"),
        ("Glob", "search"),
        ("WebSearch", "web"),
        ("WebFetch", "web"),
        ("Task", "wait"),
        ("write_stdin", "wait"),
        ("mcp__linear__list_issues", "api"),
        ("human", "human"),
    ],
)
def test_recorded_tool_names_map_to_kinds(name: str, kind: str) -> None:
    assert canonical_kind(name) == kind


def test_cpu_demand_follows_the_kind() -> None:
    assert tool_call("Bash", 2.0) == ToolSpec(kind="Bash", wall_s=2.0, cpu_s=2.0)
    assert tool_call("read", 2.0).cpu_s == 1.0
    assert tool_call("WebSearch", 2.0).cpu_s == 0.0
    assert tool_call("gap", -0.5).wall_s == 0.0  # an estimate below zero is no wait
