"""Every registered policy on every engine: it starts and serves a small multi-session
workload, or it is refused at start with a message naming what is missing; it never
fails later (docs/policies.md "Which policy runs where"). The vLLM CPU engine's part
is in ``tests/server/engines/vllm``; here: the simulator, and the wall-clock twin
behind the gateway (real servers on loopback, real HTTP clients)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agentmars.sdk.events import SessionEnd, SessionStart, ToolEnd, ToolEnqueue, ToolStart
from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine, LiveError
from agentmars.server.gateway.app import GatewayConfig, create_gateway_app
from agentmars.server.policies.capabilities import Capability, PolicyRefused
from agentmars.server.policies.registry import make_policy, policy_names
from agentmars.server.profiles.cost_model import load_profile
from agentmars.server.sim.engine import SimConfig, SimEngine, SimError
from agentmars.server.web.ingest import EventHub
from agentmars.server.web.serving import serve_in_thread
from agentmars.server.workloads.model import Workload
from tests.server.sim.factories import flat_profile, session, workload

TOKEN = "contract-token"
SESSIONS = 4
TURNS = 3


def _small_workload() -> Workload:
    return workload(
        *(
            session(f"s{i}", [(200, 8, 0.05), (50, 8, 0.05), (50, 8, None)], arrival_s=0.1 * i)
            for i in range(SESSIONS)
        )
    )


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_runs_in_the_simulator_or_is_refused_at_start(name: str) -> None:
    profile = flat_profile(num_gpu_blocks=64, cpu_kv_blocks=256)
    record = SimEngine(_small_workload(), make_policy(name), profile, SimConfig(tool_cores=2)).run()
    assert len(record.sessions) == SESSIONS
    assert all(len(s.calls) == TURNS for s in record.sessions)


@pytest.mark.parametrize("name", policy_names())
def test_a_simulator_without_a_cpu_tier_refuses_what_needs_one_at_start(name: str) -> None:
    policy = make_policy(name)
    config = SimConfig(tool_cores=2, cpu_tier=False)
    needs = policy.engine().needs
    if Capability.CPU_TIER not in needs:
        SimEngine(_small_workload(), policy, flat_profile(), config).run()
        return
    with pytest.raises(SimError, match="cpu-tier"):
        SimEngine(_small_workload(), policy, flat_profile(), config)


async def _agent(client: httpx.AsyncClient, session_id: str) -> list[str]:
    """One agent session through the gateway: LLM calls with tools between them, the
    tool and session events posted as the SDK posts them."""
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def post(*events: object) -> None:
        body = "".join(event.to_json() + "\n" for event in events)  # type: ignore[attr-defined]
        answer = await client.post("/v1/events", content=body, headers=auth)
        assert answer.status_code == 200, answer.text

    await post(SessionStart(session_id=session_id, agent="contract"))
    finishes = []
    prompt = f"system prompt of {session_id} " * 20
    for turn in range(TURNS):
        prompt += f" turn {turn} observation " * 8
        answer = await client.post(
            "/v1/completions",
            json={
                "model": "cpu-tiny",
                "prompt": prompt,
                "max_tokens": 4,
                "session_id": session_id,
                "vllm_xargs": {"turn": turn, "expects_tool": int(turn < TURNS - 1)},
            },
            timeout=60.0,
        )
        assert answer.status_code == 200, answer.text
        finishes.append(answer.json()["choices"][0]["finish_reason"])
        if turn < TURNS - 1:
            tool = {"session_id": session_id, "call_id": f"t{turn}", "tool": "bash"}
            await post(ToolEnqueue(**tool), ToolStart(**tool))
            await asyncio.sleep(0.02)  # the tool's run time, as an agent's tool takes
            await post(ToolEnd(duration_s=0.02, **tool))
    await post(SessionEnd(session_id=session_id, turns=TURNS))
    return finishes


async def _agents(url: str) -> list[list[str]]:
    async with httpx.AsyncClient(base_url=url) as client:
        return await asyncio.gather(*(_agent(client, f"s{i}") for i in range(SESSIONS)))


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_runs_on_the_twin_behind_the_gateway_or_is_refused_at_start(
    name: str,
) -> None:
    profile = load_profile("cpu-tiny")  # it has a CPU KV tier: every policy starts
    hub = EventHub()
    engine = LiveEngine(profile, make_policy(name), publish=lambda e: hub.publish([e]))
    with serve_in_thread(create_live_app(engine)) as engine_url:
        config = GatewayConfig(
            upstream_url=engine_url,
            token=TOKEN,
            policy=name,
            block_size=profile.block_size,
            kv_source=engine,
        )
        try:
            app = create_gateway_app(config, hub=hub)
        except PolicyRefused as error:
            pytest.fail(f"the gateway refused {name} although the twin serves it: {error}")
        hub.subscribe(engine.observe_threadsafe)
        with serve_in_thread(app) as gateway_url:
            finishes = asyncio.run(_agents(gateway_url))
    assert finishes == [["length"] * TURNS] * SESSIONS
    assert engine.counters.finished == SESSIONS * TURNS


@pytest.mark.parametrize("name", policy_names())
def test_a_twin_without_a_cpu_tier_refuses_at_start_what_needs_one(name: str) -> None:
    profile = load_profile("cpu-tiny").model_copy(update={"cpu_kv_blocks": 0})
    if Capability.CPU_TIER not in make_policy(name).engine().needs:
        LiveEngine(profile, make_policy(name))
        return
    with pytest.raises(LiveError, match=r"the wall-clock twin cannot run .* cpu-tier"):
        LiveEngine(profile, make_policy(name))


def test_the_worked_example_in_the_docs_runs_and_its_halves_talk_through_the_stream() -> None:
    """docs/writing-a-policy.md's example policy, as written there: registered, run in
    the simulator; its admission half's window shrinks when tools queue (one tool core,
    two tools at once), which the stream carries as ``window_update`` events."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "writing-a-policy.md").read_text()
    section = text.split("## 3. The example", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/writing-a-policy.md", "exec"), namespace)
    policy = make_policy("example", window=2)
    seen: list[str] = []
    engine = SimEngine(
        _small_workload(), policy, flat_profile(), SimConfig(tool_cores=1, tool_slots=1)
    )
    deliver = engine.engine_half.on_event

    def spy(event):  # type: ignore[no-untyped-def]
        seen.append(event.kind)
        deliver(event)

    engine.engine_half.on_event = spy  # type: ignore[method-assign]
    record = engine.run()
    assert len(record.sessions) == SESSIONS
    assert "window_update" in seen  # the admission half's event reached the engine half
    assert engine.admission.window == 1  # type: ignore[attr-defined]
