"""Issue 38 items 1-3 for every registered policy's admission half, hosted by the
gateway's admission as `agentmars serve` hosts it: sessions that never say goodbye,
after the stream has seen a 20 s tool, and a refused prompt, must leave new sessions
served within a gap's seat limit. Virtual time: the test moves the clock."""

from __future__ import annotations

import asyncio

import pytest

from agentmars.sdk.events import KVStats, LLMEnd, LLMFirstToken, LLMSubmit, ToolEnd
from agentmars.server.gateway.admission import Admission
from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.gateway.gaps import MIN_GAP_S
from agentmars.server.policies.admission_view import StreamAdmissionView
from agentmars.server.policies.registry import make_policy, policy_names
from tests.server.gateway.clock import Clock

STEP_S = 0.05
"""How far the clock moves between two admission passes while a call waits."""
KV = KVStats(total_blocks=48, free_blocks=48, used_blocks=0)
"""cpu-tiny's pool (48 blocks of 16 tokens here), idle."""


def host(policy: str) -> tuple[Admission, Clock]:
    clock = Clock()
    view = StreamAdmissionView(clock=clock, block_size=16, tool_cores=2, kv_sources=[lambda: KV])
    half = make_policy(policy).admission()
    admission = Admission(half, view, policy_name=policy, clock=clock)
    # What the half publishes reaches the stream, and so the half, after the pass (as
    # the gateway's hub hands it back on the event loop's next turn).
    admission.published = []  # type: ignore[attr-defined]
    half.publish = admission.published.append  # type: ignore[attr-defined]
    return admission, clock


def admission_pass(admission: Admission) -> None:
    admission.admit()
    published, admission.published = admission.published, []  # type: ignore[attr-defined]
    if published:
        admission.on_events(published)


async def served(
    admission: Admission, clock: Clock, session_id: str, call: int, prompt: int = 200
) -> float:
    """One call of the session, refused by the engine when its prompt is over the pool;
    returns how long it waited for its seat."""
    meta = CallMeta(
        session_id=session_id, call_id=f"c{call}", turn=None, follows_tool=False,
        expects_tool=True, prompt_tokens=prompt, ephemeral=False,
    )  # fmt: skip
    arrived = clock.now
    entering = asyncio.create_task(admission.enter(meta))
    await asyncio.sleep(0)
    while not entering.done():
        assert clock.now - arrived < 60, f"{session_id}'s call stranded"
        clock.now += STEP_S
        admission_pass(admission)
        await asyncio.sleep(0)
    turn = entering.result()
    ids = {"session_id": session_id, "call_id": meta.call_id, "turn": turn}
    refused = prompt > KV.total_blocks * 16
    events = [LLMSubmit(**ids, projected_prompt_tokens=prompt, max_tokens=4)]
    if refused:
        events.append(LLMEnd(**ids, status="error", duration_s=0.1))
    else:
        events.append(LLMFirstToken(**ids, ttft_s=0.05))
        events.append(LLMEnd(**ids, prompt_tokens=prompt, output_tokens=4, duration_s=0.1))
    admission.on_events(events)
    admission.leave(session_id)
    return clock.now - arrived


@pytest.mark.parametrize("policy", policy_names())
async def test_no_policy_strands_seats_with_clients_that_never_say_goodbye(policy: str) -> None:
    admission, clock = host(policy)
    admission.on_events([ToolEnd(session_id="x", call_id="t", tool="bash", duration_s=20.0)])
    waits = []
    for n in range(12):  # one after another, two calls each, no session_end
        for call in range(2):
            waits.append(await served(admission, clock, f"agent-{n}", call))
    waits.append(await served(admission, clock, "hog", 0, prompt=300_000 // 4))
    for n in range(3):
        waits.append(await served(admission, clock, f"new-{n}", 0))
    # a seat goes back a gap (0 s here, floored) after its session's last call
    assert max(waits) <= MIN_GAP_S + 2 * STEP_S, waits
