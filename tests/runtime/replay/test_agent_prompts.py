"""The replay agents' prompt token ids: one append per turn, seeded by the session,
a prefix group's shared prefix the same in each of its sessions."""

from __future__ import annotations

from agentmars.runtime.replay.agent import FIRST_PLAIN_TOKEN, VOCAB, prompt_ids
from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec

WAIT = ToolSpec(kind="api", wall_s=0.1)


def session(session_id: str, *, group: str | None = None, shared: int = 0) -> SessionSpec:
    return SessionSpec(
        session_id=session_id,
        prefix_group=group,
        shared_prefix_tokens=shared,
        turns=(
            TurnSpec(append_tokens=40, output_tokens=3, tool=WAIT),
            TurnSpec(append_tokens=0, output_tokens=3, tool=WAIT),
            TurnSpec(append_tokens=25, output_tokens=3),
        ),
    )


def test_one_append_per_turn_of_its_length_within_the_vocabulary() -> None:
    appends = prompt_ids(session("s"), seed=1)
    assert [len(append) for append in appends] == [40, 0, 25]
    ids = [token for append in appends for token in append]
    assert all(FIRST_PLAIN_TOKEN <= token < VOCAB for token in ids)
    assert len(set(ids)) > 1


def test_the_ids_are_the_same_for_a_seed_and_session() -> None:
    assert prompt_ids(session("s"), seed=1) == prompt_ids(session("s"), seed=1)


def test_the_ids_differ_between_sessions_and_seeds() -> None:
    first = prompt_ids(session("s"), seed=1)
    assert prompt_ids(session("t"), seed=1)[0] != first[0]
    assert prompt_ids(session("s"), seed=2)[0] != first[0]


def test_a_prefix_group_shares_its_prefix_and_nothing_else() -> None:
    one = prompt_ids(session("s", group="g", shared=5), seed=1)
    two = prompt_ids(session("t", group="g", shared=5), seed=1)
    assert one[0][:5] == two[0][:5]
    assert one[0][5:] != two[0][5:]
    assert one[2] != two[2]
    # Outside the prefix, a session's ids are its own, with or without the group.
    assert one[0][5:] == prompt_ids(session("s"), seed=1)[0][5:]


def test_sessions_of_different_groups_do_not_share_a_prefix() -> None:
    one = prompt_ids(session("s", group="g", shared=5), seed=1)
    two = prompt_ids(session("t", group="h", shared=5), seed=1)
    assert one[0][:5] != two[0][:5]
