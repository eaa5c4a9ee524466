"""Every registered policy on vLLM: each on the plugin's scheduler (vLLM's own V1
``Scheduler``, built in-process as ``bench_schedule`` builds it, over a queue that does
not fit the KV cache), and one policy of each capability profile through ``agentmars
serve --profile cpu-tiny`` (vLLM CPU with the agentmars plugin, the gateway in front,
linked by the side channel): it serves a small multi-session workload, and nothing
fails later; none is refused (docs/policies.md "Which policy runs where";
``tests/cross/test_policy_contract.py`` does the same on the simulator and the twin).
A policy whose engine half needs or uses a CPU KV tier gets one: ``agentmars serve``
starts vLLM with the agentmars CPU tier, as large as the GPU's KV (docs/vllm-plugin.md
"The CPU KV tier").

A capability profile is what an engine half needs and uses (``Capability``): what the
plugin does for it beyond the policy's own code, which the scheduler-level run covers
for every policy. ``agentmars serve`` checks the plugin's refusal before it starts
vLLM; each policy served costs one vLLM start (about 50 s of one core here, with
``--vllm-arg=--enforce-eager``: the scheduler, and so the plugin, are the same)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agentmars.sdk.events import SessionEnd, SessionStart, ToolEnd, ToolEnqueue, ToolStart
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME
from agentmars.server.engines.vllm.smoke import model_vocab_size, random_prompt
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.registry import (
    POLICY_MODULES,
    make_policy,
    policy_class,
    policy_names,
)
from agentmars.server.web.serving import free_loopback_port
from tests.cli.serving import wait_for
from tests.server.engines.vllm.helpers import labelled_total, post_events, vllm_core

TOKEN = "contract-token"
SESSIONS = 3
TURNS = 2
PRESSED_SESSIONS = 4
PRESSED_PROMPT = 2_600
"""Under KV pressure: four sessions of 2,600-token contexts at once, 10,400 tokens and
more, against the 63 usable blocks of 128 (8,064 tokens): pins are dropped, contexts
go to the CPU tier and back, pausing policies pause (issue 39: thunderagent-cpu killed
vLLM's engine core so)."""
PRESSED = frozenset({Capability.CPU_TIER, Capability.PAUSE})
"""A policy whose engine half needs or uses one of these also runs under pressure."""
PROFILE = "cpu-tiny"
REGISTERED = [name for name in policy_names() if policy_class(name).__module__ in POLICY_MODULES]
"""The registered policies (the test policies that test modules register left out)."""


def _capabilities(name: str) -> tuple[frozenset[Capability], frozenset[Capability]]:
    half = make_policy(name).engine()
    return frozenset(half.needs), frozenset(half.uses)


def _one_of_each_profile() -> list[str]:
    """MARS (the default), then the first registered policy of each other capability
    profile."""
    chosen = {_capabilities("mars"): "mars"}
    for name in REGISTERED:
        chosen.setdefault(_capabilities(name), name)
    return sorted(chosen.values())


SERVED = _one_of_each_profile()
NEEDS_A_TIER = [name for name in REGISTERED if Capability.CPU_TIER in _capabilities(name)[0]]
"""Refused at the scheduler level, which has no CPU tier (``bench_schedule``); each is
served below (its profile is its own)."""
ENGINE_URL = re.compile(r"engine (http://127\.0\.0\.1:\d+)")


@dataclass
class Served:
    process: subprocess.Popen[str]
    folder: Path
    port: int

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine(self) -> str:
        found = ENGINE_URL.search((self.folder / "serve.out").read_text())
        assert found, "agentmars serve did not say where vLLM is"
        return found.group(1)

    @property
    def vllm_log(self) -> Path:
        return self.folder / "vllm.log"

    def stderr(self) -> str:
        return (self.folder / "serve.err").read_text()


def _start(name: str, vllm_python: Path, folder: Path, core: str) -> Served:
    """``agentmars serve`` with policy ``name``, as a user starts it, vLLM on ``core``."""
    folder.mkdir(parents=True)
    port = free_loopback_port()
    with (folder / "serve.out").open("w") as out, (folder / "serve.err").open("w") as err:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "agentmars.cli.main", "serve",
                "--model", str(tiny_model_made_by(vllm_python)),
                "--vllm-python", str(vllm_python), "--policy", name, "--profile", PROFILE,
                "--port", str(port), "--cores", core, "--num-blocks", "64",
                "--max-model-len", "4096", "--log", str(folder / "vllm.log"),
                # No torch.compile at start: ~10 of each start's ~38 s here.
                "--vllm-arg=--enforce-eager",
            ],
            env={**os.environ, "AGENTMARS_GATEWAY_TOKEN": TOKEN},
            stdout=out, stderr=err, text=True, start_new_session=True,
        )  # fmt: skip
    return Served(process, folder, port)


def _stop(served: Served) -> None:
    """SIGTERM; it must exit 0 if it served."""
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=90)
        assert served.process.returncode == 0, served.stderr()[-3000:]


class Starts:
    """Starts each policy's server when the test before it takes its own, on this
    worker's vLLM core (``vllm_core``): the next start's imports, a minute of one core,
    go on while the test before it sends its few seconds of traffic."""

    def __init__(self, vllm_python: Path, root: Path) -> None:
        self.vllm_python = vllm_python
        self.root = root
        self.started: dict[str, Served] = {}

    def take(self, name: str) -> Served:
        index = SERVED.index(name)
        for policy in SERVED[index : index + 2]:
            if policy not in self.started:
                folder = self.root / policy
                self.started[policy] = _start(policy, self.vllm_python, folder, vllm_core())
        return self.started.pop(name)

    def stop_all(self) -> None:
        for served in self.started.values():
            served.process.send_signal(signal.SIGTERM)
        for served in self.started.values():
            served.process.wait(timeout=90)


@pytest.fixture(scope="module")
def starts(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Starts]:
    pool = Starts(vllm_python, tmp_path_factory.mktemp("served"))
    try:
        yield pool
    finally:
        pool.stop_all()  # a server started ahead for a test that did not run


@pytest.fixture
def serve(starts: Starts, request: pytest.FixtureRequest) -> Iterator[Served]:
    """``agentmars serve`` with the policy the test is parametrized with; stopped with
    SIGTERM after the test."""
    served = starts.take(request.node.callspec.params["name"])
    try:
        yield served
    finally:
        _stop(served)


def _agent(
    client: httpx.Client, session_id: str, vocab_size: int, prompt_tokens: int = 300
) -> list[int]:
    """One agent session through the gateway: two calls (the first answered whole, the
    second streamed) with a tool between them, its events posted as the SDK posts
    them; returns the calls' statuses."""
    post_events(client, TOKEN, SessionStart(session_id=session_id, agent="contract"))
    seed = sum(map(ord, session_id))
    prompt = random_prompt(prompt_tokens, vocab_size, seed=seed)
    statuses = []
    for turn in range(TURNS):
        if turn:
            tool = {"session_id": session_id, "call_id": f"{session_id}-t{turn}", "turn": turn - 1}
            post_events(
                client, TOKEN, ToolEnqueue(tool="bash", **tool), ToolStart(tool="bash", **tool)
            )
            time.sleep(0.05)  # the tool runs
            post_events(client, TOKEN, ToolEnd(tool="bash", duration_s=0.05, **tool))
            prompt = prompt + random_prompt(40, vocab_size, seed=seed + turn)
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": prompt,
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": turn == TURNS - 1,
            "vllm_xargs": {"turn": turn, "follows_tool": int(turn > 0), "expects_tool": 1},
        }
        headers = {"X-Session-ID": session_id}
        with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            response.read()
        statuses.append(response.status_code)
    post_events(client, TOKEN, SessionEnd(session_id=session_id, turns=TURNS))
    return statuses


@pytest.mark.slow
def test_every_policy_runs_on_the_plugins_scheduler(vllm_python: Path, tmp_path: Path) -> None:
    """Each policy with the ``cpu-tiny`` costs, as stock vLLM does: 8 sessions of 3
    turns (contexts up to 1,680 tokens: 105 blocks) in 160 KV blocks, so calls wait,
    pins are dropped and calls are preempted. Every call finishes with the tokens
    stock vLLM gives it."""
    out = tmp_path / "figures.json"
    policies = [name for name in REGISTERED if name not in NEEDS_A_TIER]
    done = subprocess.run(
        [
            str(vllm_python), "-m", "agentmars.server.engines.vllm.bench_schedule",
            "--sessions", "8", "--turns", "3", "--reps", "1", "--kv-blocks", "160",
            "--profile", PROFILE, "--policies", ",".join(policies), "--json", str(out),
        ],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures["schedulers"]) == {"stock", *policies}
    assert figures["same_tokens"] is True
    for name, row in figures["schedulers"].items():
        assert row["calls_finished"] == 24, name
    assert sum(row["preemptions_per_run"] for row in figures["schedulers"].values()) > 0


def test_one_policy_of_each_capability_profile_is_served() -> None:
    profiles = {_capabilities(name) for name in REGISTERED}
    assert {_capabilities(name) for name in SERVED} == profiles
    assert len(SERVED) == len(profiles) and "mars" in SERVED
    assert set(NEEDS_A_TIER) <= set(SERVED) and NEEDS_A_TIER


@pytest.mark.slow
@pytest.mark.parametrize("name", SERVED)
def test_each_capability_profile_serves_behind_the_gateway(
    name: str, serve: Served, vllm_python: Path
) -> None:
    half = make_policy(name).engine()
    wait_for(serve.gateway + "/healthz", serve.process, timeout_s=600, stderr=serve.stderr)
    vocab_size = model_vocab_size(tiny_model_made_by(vllm_python))
    with (
        httpx.Client(base_url=serve.gateway, timeout=120.0) as client,
        ThreadPoolExecutor(max(SESSIONS, PRESSED_SESSIONS)) as agents,
    ):
        runs = [agents.submit(_agent, client, f"{name}-s{i}", vocab_size) for i in range(SESSIONS)]
        assert [run.result(timeout=240) for run in runs] == [[200] * TURNS] * SESSIONS
        sessions = SESSIONS
        if PRESSED & (half.needs | half.uses):
            runs = [
                agents.submit(_agent, client, f"{name}-p{i}", vocab_size, PRESSED_PROMPT)
                for i in range(PRESSED_SESSIONS)
            ]
            assert [run.result(timeout=600) for run in runs] == [[200] * TURNS] * PRESSED_SESSIONS
            sessions += PRESSED_SESSIONS
        metrics = client.get("/metrics").text
    assert labelled_total(metrics, "agentmars_llm_calls_total", status="ok") == sessions * TURNS
    # Nothing failed later: vLLM still answers, and its engine never died.
    assert httpx.get(serve.engine + "/health", timeout=10.0).status_code == 200
    log = serve.vllm_log.read_text()
    assert "EngineDeadError" not in log and "Traceback" not in log, log[-3000:]
    # A CPU tier where the policy needs or uses one (as large as the 64-block GPU KV).
    with_tier = Capability.CPU_TIER in half.needs | half.uses
    assert ("agentmars: CPU KV tier of 64 blocks" in log) == with_tier
    assert serve.process.poll() is None
