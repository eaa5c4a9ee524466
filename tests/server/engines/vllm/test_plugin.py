"""The vLLM scheduler plugin: its configuration (any interpreter) and, on the real vLLM
CPU engine with the tiny model, loading, waiting order and KV retention.

Two servers start in the whole module (session-scoped, one at a time): one with a
shortest-prompt-first test policy and ``--max-num-seqs 1`` for the waiting order, one
with Continuum and a 64-block KV cache for the pins."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.sdk.events import KVStats, decode_event
from agentmars.server.engines.vllm.kv_status import KVStatusPublisher
from agentmars.server.engines.vllm.launch import (
    CPU_BLOCK_SIZE,
    SERVED_MODEL_NAME,
    VllmServerConfig,
    serve_vllm,
)
from agentmars.server.engines.vllm.plugin_config import (
    PluginConfig,
    PluginConfigError,
    check_vllm_version,
)
from agentmars.server.engines.vllm.preemption import steer_victim
from agentmars.server.engines.vllm.smoke import metric_total, model_vocab_size, random_prompt
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.policies.autellix import AutellixEngine
from agentmars.server.policies.capabilities import Capability
from agentmars.server.policies.continuum import ContinuumDynamicEngine, ContinuumEngine
from agentmars.server.policies.infercept import InferCeptEngine
from agentmars.server.policies.interface import EngineHalf
from agentmars.server.policies.thunderagent import ThunderAgentEngine, ThunderAgentOffloadEngine
from tests.server.engines.vllm.helpers import PLUGIN, blocks, kv_status, released, vllm_core

TIMEOUT_S = 120.0

# --- configuration (no vLLM needed) ----------------------------------------------------


def test_only_the_supported_vllm_series_are_accepted() -> None:
    for supported in ("0.32.0", "0.32.7rc1", "0.33.0", "0.33.1"):
        check_vllm_version(supported)
    for other in ("0.31.2", "0.34.0", "1.0.0", "0.3.2"):
        with pytest.raises(
            PluginConfigError, match=rf"supports vLLM 0\.32\.x or 0\.33\.x only.*vLLM {other}"
        ):
            check_vllm_version(other)


def test_config_defaults_to_fcfs_without_status() -> None:
    config = PluginConfig.from_env({})
    assert (config.policy, dict(config.settings), config.policy_modules) == ("fcfs", {}, ())
    assert (config.status_file, config.status_address, config.status_hz) == (None, None, 10.0)
    assert (config.hints_address, config.profile) == (None, None)
    name, half = config.make_engine_half()
    assert (name, type(half)) == ("fcfs", EngineHalf)
    assert config.provides() == {Capability.AGENT_INSTANCE, Capability.TICK, Capability.PAUSE}


def test_config_reads_policy_settings_modules_and_status() -> None:
    config = PluginConfig.from_env(
        {
            "AGENTMARS_POLICY": "continuum",
            "AGENTMARS_POLICY_SETTINGS": '{"ttl_s": 5}',
            "AGENTMARS_POLICY_MODULES": " json , textwrap ",
            "AGENTMARS_KV_STATUS_FILE": "/tmp/kv.json",
            "AGENTMARS_KV_STATUS_ADDR": "tcp://127.0.0.1:5601",
            "AGENTMARS_KV_STATUS_HZ": "20",
            "AGENTMARS_HINTS_ADDR": "ipc:///tmp/hints",
            "AGENTMARS_PROFILE": "cpu-tiny",
        }
    )
    assert config.policy_modules == ("json", "textwrap")
    assert (config.hints_address, config.profile) == ("ipc:///tmp/hints", "cpu-tiny")
    assert (config.status_file, config.status_address, config.status_hz) == (
        "/tmp/kv.json",
        "tcp://127.0.0.1:5601",
        20.0,
    )
    name, half = config.make_engine_half()
    assert name == "continuum"
    assert isinstance(half, ContinuumEngine) and half.ttl_s == 5
    assert config.provides() == {
        Capability.AGENT_INSTANCE,
        Capability.TICK,
        Capability.PAUSE,
        Capability.COSTS,
        Capability.TOOL_FIGURES,
    }
    costs = config.costs()
    assert costs is not None and costs.prefill_time(1000) > 0


@pytest.mark.parametrize(
    ("env", "half_type"),
    [
        # Costs from the profile, tool figures from the side channel.
        (
            {
                "AGENTMARS_POLICY": "continuum-dy",
                "AGENTMARS_PROFILE": "cpu-tiny",
                "AGENTMARS_HINTS_ADDR": "ipc:///tmp/hints",
            },
            ContinuumDynamicEngine,
        ),
        # The plugin ticks and pauses sessions; the tool figures come from the side channel.
        (
            {"AGENTMARS_POLICY": "thunderagent", "AGENTMARS_HINTS_ADDR": "ipc:///tmp/hints"},
            ThunderAgentEngine,
        ),
        # Costs from the profile, ticks from the plugin; no CPU tier: no swaps.
        ({"AGENTMARS_POLICY": "infercept", "AGENTMARS_PROFILE": "cpu-tiny"}, InferCeptEngine),
        # PLAS's order and victims; preempted calls are recomputed, as vLLM does.
        ({"AGENTMARS_POLICY": "autellix"}, AutellixEngine),
    ],
)
def test_policy_given_what_it_needs_gets_its_engine_half(
    env: dict[str, str], half_type: type[EngineHalf]
) -> None:
    name, half = PluginConfig.from_env(env).make_engine_half()
    assert (name, type(half)) == (env["AGENTMARS_POLICY"], half_type)


def test_the_cpu_tier_is_provided_only_when_vllm_runs_it() -> None:
    """The scheduler sets ``cpu_tier`` once it found the agentmars CPU tier behind vLLM's
    connector (``agentmars serve`` starts vLLM with it for a policy that needs one)."""
    env = {"AGENTMARS_POLICY": "thunderagent-cpu", "AGENTMARS_HINTS_ADDR": "ipc:///tmp/hints"}
    config = PluginConfig.from_env(env)
    assert Capability.CPU_TIER not in config.provides()
    with pytest.raises(PluginConfigError, match=r"it needs cpu-tier.*on vLLM: start vLLM with"):
        config.make_engine_half()
    with_tier = dataclasses.replace(config, cpu_tier=True)
    assert Capability.CPU_TIER in with_tier.provides()
    name, half = with_tier.make_engine_half()
    assert (name, type(half)) == ("thunderagent-cpu", ThunderAgentOffloadEngine)


def test_unknown_profile_is_refused_by_name() -> None:
    with pytest.raises(PluginConfigError, match="AGENTMARS_PROFILE=no-such-profile"):
        PluginConfig.from_env({"AGENTMARS_PROFILE": "no-such-profile"}).costs()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENTMARS_POLICY_SETTINGS": "{ttl"}, "AGENTMARS_POLICY_SETTINGS is not JSON"),
        ({"AGENTMARS_POLICY_SETTINGS": "[1]"}, "must be a JSON object"),
        ({"AGENTMARS_KV_STATUS_HZ": "0"}, "must be a positive number"),
        ({"AGENTMARS_KV_STATUS_HZ": "fast"}, "must be a positive number"),
    ],
)
def test_bad_environment_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        PluginConfig.from_env(env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENTMARS_POLICY": "nope"}, "AGENTMARS_POLICY=nope: unknown policy 'nope'"),
        (
            {"AGENTMARS_POLICY": "fcfs", "AGENTMARS_POLICY_SETTINGS": '{"ttl_s": 1}'},
            "has no setting ttl_s",
        ),
        (
            {"AGENTMARS_POLICY": "continuum", "AGENTMARS_POLICY_SETTINGS": '{"ttl_s": -1}'},
            "ttl_s must be positive",
        ),
        (
            {"AGENTMARS_POLICY_MODULES": "agentmars.no_such_module"},
            "cannot import agentmars.no_such_module",
        ),
        # InferCept's waste equations need time estimates (it swaps only where a CPU
        # tier exists, and vLLM 0.32's CPU backend has none).
        ({"AGENTMARS_POLICY": "infercept"}, r"cannot run policy 'infercept': it needs costs"),
        # Continuum's TTL follows the tools' durations: it needs the gateway's events.
        ({"AGENTMARS_POLICY": "continuum"}, r"it needs tool-figures, .*--plugin-hints-addr"),
        (
            {"AGENTMARS_POLICY": "continuum-dy", "AGENTMARS_HINTS_ADDR": "ipc:///tmp/hints"},
            r"it needs costs, .*--profile",
        ),
        (
            {"AGENTMARS_POLICY": "thunderagent-cpu", "AGENTMARS_HINTS_ADDR": "ipc:///tmp/hints"},
            "cannot run policy 'thunderagent-cpu': it needs cpu-tier, which",
        ),
        ({"AGENTMARS_POLICY": "thunderagent"}, "it needs tool-figures, which"),
    ],
)
def test_policy_that_cannot_run_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(PluginConfigError, match=message):
        PluginConfig.from_env(env).make_engine_half()


# --- KV status publishing (file only: ZMQ needs the vLLM env, tested on the engine) -----


def _figures(sample: int) -> KVStats:
    """KV figures numbered by ``steps``."""
    return KVStats(total_blocks=10, free_blocks=10, used_blocks=0, steps=sample)


def test_status_file_is_rewritten_at_the_rate_and_once_more_at_stop(tmp_path: Path) -> None:
    samples = iter(range(1_000_000))
    path = tmp_path / "kv.json"
    publisher = KVStatusPublisher(
        lambda: _figures(next(samples)), path=str(path), address=None, hz=50.0
    )
    time.sleep(0.5)
    publisher.stop()
    last = decode_event(path.read_bytes())
    assert isinstance(last, KVStats) and last.steps is not None
    # About 25 samples in 0.5 s at 50 Hz (a busy machine may lose a few), then the last.
    assert 15 <= last.steps <= 27
    assert not publisher.running
    assert [p.name for p in tmp_path.iterdir()] == ["kv.json"]  # no partial file left


def test_status_file_that_cannot_be_written_stops_only_the_file(tmp_path: Path) -> None:
    publisher = KVStatusPublisher(
        lambda: _figures(0), path=str(tmp_path / "missing" / "kv.json"), address=None, hz=50.0
    )
    time.sleep(0.1)
    assert publisher.running
    publisher.stop()


# --- victim steering (plain lists: vLLM then pops the last running call) ---------------


def test_victim_is_moved_last_among_the_calls_not_yet_scheduled() -> None:
    running = ["a", "b", "c", "d"]
    offered: list[list[str]] = []

    def choose(candidates: Sequence[str]) -> str:
        offered.append(list(candidates))
        return "c"

    assert steer_victim(running, "b", choose) == "c"
    assert offered == [["b", "c", "d"]]  # "a" is already scheduled in this step
    assert running == ["a", "b", "d", "c"]


def test_current_call_may_be_its_own_victim() -> None:
    running = ["a", "b", "c"]
    assert steer_victim(running, "b", lambda candidates: "b") == "b"
    assert running == ["a", "c", "b"]


def test_nothing_moves_for_a_waiting_call_or_a_last_one() -> None:
    running = ["a", "b"]
    assert steer_victim(running, "waiting", lambda candidates: "a") is None
    assert steer_victim(running, "b", lambda candidates: "b") is None
    assert running == ["a", "b"]


def test_a_victim_not_offered_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of the running calls offered"):
        steer_victim(["a", "b", "c"], "b", lambda candidates: "a")


# --- the real engine --------------------------------------------------------------------

TEST_POLICY_MODULE = "agentmars_plugin_test_policies"
TEST_POLICY = textwrap.dedent(
    '''
    """A policy for the plugin's tests: shortest prompt first, chunks of 128 tokens;
    each finished call's prompt length is written to AGENTMARS_TEST_FINISHED, in the
    engine's order (its clients may hear of calls that end together in any order)."""
    import os

    from agentmars.server.policies.interface import EngineHalf, Policy, Release
    from agentmars.server.policies.registry import register


    class ShortestPromptFirstEngine(EngineHalf):
        def priority(self, call, view):
            return (call.prompt_tokens,)

        def chunk(self, call, tokens, fit_tokens, view):
            return min(tokens, 128)

        def on_call_finished(self, call, view):
            with open(os.environ["AGENTMARS_TEST_FINISHED"], "a") as out:
                out.write(f"{call.prompt_tokens}\\n")
            return Release()


    @register
    class ShortestPromptFirst(Policy):
        name = "test-shortest-prompt"

        def engine(self):
            return ShortestPromptFirstEngine()
    '''
)


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path) -> Path:
    return tiny_model_made_by(vllm_python)


@pytest.fixture(scope="session")
def vocab_size(tiny_model: Path) -> int:
    return model_vocab_size(tiny_model)


FINISHED_FILE = "finished.txt"
"""Next to the ordering server's KV status file: the test policy's record of finished
calls' prompt lengths, in the engine's order."""


@pytest.fixture(scope="class")
def ordering_server(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """The plugin with the test policy (shortest prompt first, 128-token chunks), one
    call at a time; yields the URL and the KV status file."""
    folder = tmp_path_factory.mktemp("ordering")
    (folder / f"{TEST_POLICY_MODULE}.py").write_text(TEST_POLICY)
    config = VllmServerConfig(
        python=vllm_python,
        model=tiny_model,
        max_model_len=4096,
        num_blocks=128,
        # NOTE: vLLM's busy compute threads otherwise starve this test's own process
        # (a 0.5 s sleep took 3 s while a long call decoded), which then submits its
        # calls late: the server keeps to one core, the test has the other.
        cores=vllm_core(),
        extra_args=("--scheduler-cls", PLUGIN, "--max-num-seqs", "1"),
    )
    env = {
        "PYTHONPATH": str(folder),
        "AGENTMARS_POLICY": "test-shortest-prompt",
        "AGENTMARS_POLICY_MODULES": TEST_POLICY_MODULE,
        "AGENTMARS_KV_STATUS_FILE": str(folder / "kv.json"),
        "AGENTMARS_TEST_FINISHED": str(folder / FINISHED_FILE),
    }
    with serve_vllm(config, folder / "server.log", env=env) as base_url:
        yield base_url, folder / "kv.json"


def _complete(
    client: httpx.Client, prompt: list[int], max_tokens: int, **body: Any
) -> dict[str, Any]:
    response = client.post(
        "/v1/completions",
        json={
            "model": SERVED_MODEL_NAME,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            **body,
        },
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _wait_for_metric(base_url: str, name: str, value: float, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = metric_total(httpx.get(f"{base_url}/metrics").text, name)
        if seen == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} stayed {seen}, not {value}")


PLUGIN_IMPORT_PROBE = """
import sys, json
import agentmars.server.engines.vllm.plugin
print(json.dumps(sorted(m for m in sys.modules if m.startswith("agentmars."))))
"""


@pytest.mark.slow
def test_plugin_import_loads_no_more_of_agentmars_than_it_uses(vllm_python: Path) -> None:
    """The simulator, the gateway and the policies themselves (imported when the
    scheduler builds its policy) stay out of an import of the plugin."""
    done = subprocess.run(
        [vllm_python, "-c", PLUGIN_IMPORT_PROBE], check=True, capture_output=True, text=True
    )
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    packages = {"agentmars.server", "agentmars.server.engines", "agentmars.server.engines.vllm"}
    plugin = {
        f"agentmars.server.engines.vllm.{name}"
        for name in (
            "plugin",
            "plugin_config",
            "cpu_tier",  # the labels the plugin sets; the vLLM classes only with the tier
            "cpu_tier.labels",
            "kv_status",
            "hints",
            "pins",
            "prefix_lookup",
            "preemption",
            "displacement",
            "views",
            "paused",
            "ticker",
            "waiting_order",
        )
    }
    # The policy contract: the halves, their views, what they need, the event feed.
    contract = ("", ".interface", ".registry", ".views", ".capabilities", ".feed")
    policies = {f"agentmars.server.policies{name}" for name in contract}
    server = {module for module in loaded if module.startswith("agentmars.server")}
    tools = {"agentmars.server.policies.tool_activity"}  # the view's tool figures (side channel)
    # The cost estimates of AGENTMARS_PROFILE (Capability.COSTS), not the simulator.
    profiles = {f"agentmars.server.profiles{name}" for name in ("", ".cost_model", ".hardware")}
    assert server == packages | plugin | policies | tools | profiles


class TestOrderingServer:
    """The tests that share the server with the test policy (its fixture is
    class-scoped: it stops before the next server starts)."""

    @pytest.mark.slow
    def test_plugin_loads_and_serves_completions(
        self, ordering_server: tuple[str, Path], vocab_size: int
    ) -> None:
        with httpx.Client(base_url=ordering_server[0], timeout=TIMEOUT_S) as client:
            answer = _complete(client, random_prompt(50, vocab_size, seed=7), 8)
            assert answer["usage"]["completion_tokens"] == 8
            assert client.get("/v1/models").json()["data"][0]["id"] == SERVED_MODEL_NAME

    @pytest.mark.slow
    def test_prompt_chunks_follow_the_policy(
        self, ordering_server: tuple[str, Path], vocab_size: int
    ) -> None:
        """The test policy caps a prompt's chunk at 128 tokens: a fresh 1,000-token prompt,
        one token out, takes ceil(1000 / 128) = 8 steps (vLLM alone: 1)."""
        base_url, status = ordering_server
        with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
            before = kv_status(status).steps
            _complete(client, random_prompt(1000, vocab_size, seed=71), 1)
            after = kv_status(status).steps
            assert before is not None and after is not None
            assert after - before == 8

    @pytest.mark.slow
    def test_waiting_calls_run_in_the_policy_order(
        self, ordering_server: tuple[str, Path], vocab_size: int
    ) -> None:
        """Behind a long call, three calls arrive with prompts of 600, 200 and 400 tokens;
        one call runs at a time, so the policy's order (shortest prompt first) is the order
        in which they finish: 200, 400, 600 (FCFS would give 600, 200, 400). The order is
        read from the engine (the test policy's record), not from the clients: in CI the
        four answers reached them within 10 ms of each other, in any order."""
        base_url = ordering_server[0]
        record = ordering_server[1].parent / FINISHED_FILE
        before = len(record.read_text().splitlines()) if record.exists() else 0
        finished: list[str] = []
        lock = threading.Lock()
        started = time.monotonic()

        def run(name: str, prompt_tokens: int, max_tokens: int, seed: int) -> None:
            # Each its own session: the plugin asks the policy about a named session's
            # calls only.
            xargs = {"session_id": name, "turn": 0}
            with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
                prompt = random_prompt(prompt_tokens, vocab_size, seed)
                _complete(client, prompt, max_tokens, vllm_xargs=xargs)
            with lock:
                finished.append(f"{name}@{time.monotonic() - started:.2f}")

        threads = [threading.Thread(target=run, args=("long", 20, 4000, 1))]
        threads[0].start()
        time.sleep(1.0)  # the long call is running
        for name, tokens, seed in (("p600", 600, 2), ("p200", 200, 3), ("p400", 400, 4)):
            threads.append(threading.Thread(target=run, args=(name, tokens, 1, seed)))
            threads[-1].start()
            time.sleep(0.2)  # a distinct arrival order
        # The API server may hand calls to the engine late while it is busy: the order is
        # only the policy's if all three wait in the engine at once, behind the long call.
        _wait_for_metric(base_url, "vllm:num_requests_waiting", 3.0)
        assert not finished, "the long call ended before the others queued"
        for thread in threads:
            thread.join(TIMEOUT_S)
        assert len(finished) == 4, finished
        ended = [int(line) for line in record.read_text().splitlines()[before:]]
        assert ended == [20, 200, 400, 600], finished  # the long call's prompt is 20 tokens


# --- KV retention (Continuum: pin every finished call of a session for PIN_TTL_S) -------

KV_BLOCKS = 64
"""``--num-gpu-blocks-override``: vLLM keeps block 0 as its null block, so 63 hold KV."""
USABLE_BLOCKS = KV_BLOCKS - 1
PIN_TTL_S = 6.0
CONTEXT_TOKENS = 1300
"""A session's first prompt: 10 full blocks (1,280 tokens) are hashed, and pinned."""
CONTEXT_BLOCKS = CONTEXT_TOKENS // CPU_BLOCK_SIZE
DISPLACING_TOKENS = 2600
"""Each of ``DISPLACING_CALLS`` session-less calls takes 21 blocks: 84 distinct blocks in
all, more than the 53 not pinned, so every unpinned cached block is evicted."""
DISPLACING_CALLS = 4


@pytest.fixture(scope="class")
def pinning_server(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """Continuum with a short TTL on a 64-block KV cache; yields the URL and the KV
    status file (the same figures go to the ZMQ socket ``kv.sock`` beside it)."""
    folder = tmp_path_factory.mktemp("pinning")
    status = folder / "kv.json"
    config = VllmServerConfig(
        python=vllm_python,
        model=tiny_model,
        max_model_len=8000,
        num_blocks=KV_BLOCKS,
        cores=vllm_core(),  # see ordering_server
        extra_args=("--scheduler-cls", PLUGIN),
    )
    env = {
        "AGENTMARS_POLICY": "continuum",
        "AGENTMARS_POLICY_SETTINGS": json.dumps({"ttl_s": PIN_TTL_S}),
        "AGENTMARS_KV_STATUS_FILE": str(status),
        "AGENTMARS_KV_STATUS_ADDR": f"ipc://{folder / 'kv.sock'}",
        # Continuum follows the tools' durations, so it needs the gateway's events (none
        # come here: no tool's mean duration is known, and every TTL is PIN_TTL_S).
        "AGENTMARS_HINTS_ADDR": f"ipc://{folder / 'hints.sock'}",
        # Serves POST /reset_prefix_cache.
        "VLLM_SERVER_DEV_MODE": "1",
    }
    with serve_vllm(config, folder / "server.log", env=env) as base_url:
        yield base_url, status


@pytest.fixture
def kv(pinning_server: tuple[str, Path]) -> Iterator[tuple[httpx.Client, Path]]:
    """A client of the pinning server, starting from an empty cache with no pins."""
    base_url, status = pinning_server
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
        assert client.post("/reset_prefix_cache").status_code == 200
        assert blocks(kv_status(status)) == (USABLE_BLOCKS, 0, 0)
        yield client, status


def _hits(client: httpx.Client) -> float:
    return metric_total(client.get("/metrics").text, "vllm:prefix_cache_hits")


def _turn(client: httpx.Client, prompt: list[int], session: str | None, turn: int = 0) -> None:
    xargs = {} if session is None else {"vllm_xargs": {"session_id": session, "turn": turn}}
    _complete(client, prompt, 4, **xargs)


def _displace(client: httpx.Client, vocab_size: int) -> None:
    for seed in range(DISPLACING_CALLS):
        _complete(client, random_prompt(DISPLACING_TOKENS, vocab_size, 100 + seed), 1)


SUBSCRIBER = textwrap.dedent(
    """
    import json, sys, time, zmq
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.connect(sys.argv[1])
    socket.setsockopt(zmq.SUBSCRIBE, b"agentmars.kv")
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    stamps, payload = [], b""
    for _ in range(11):
        topic, payload = socket.recv_multipart()
        stamps.append(time.monotonic())
    print(json.dumps({"span_s": stamps[-1] - stamps[0], "payload": payload.decode()}))
    """
)


class TestPinningServer:
    """The tests that share the Continuum server with a 64-block cache."""

    @pytest.mark.slow
    def test_pinned_session_keeps_its_prefix_while_an_unpinned_one_is_displaced(
        self, kv: tuple[httpx.Client, Path], vocab_size: int
    ) -> None:
        client, status = kv
        start = kv_status(status)
        context = random_prompt(CONTEXT_TOKENS, vocab_size, seed=11)
        _turn(client, context, "pinned")
        figures = kv_status(status)
        assert released(figures, start) == {}
        assert blocks(figures) == (USABLE_BLOCKS - CONTEXT_BLOCKS, CONTEXT_BLOCKS, 1)
        _displace(client, vocab_size)
        before = _hits(client)
        _turn(client, context + random_prompt(20, vocab_size, seed=12), "pinned", turn=1)
        assert _hits(client) - before == CONTEXT_BLOCKS * CPU_BLOCK_SIZE  # 1,280 tokens
        # Its next call took over the blocks, and pinned them again when it ended.
        assert released(kv_status(status), figures) == {"next_call": 1}

        # A call of no session is never pinned: the same traffic evicts all of its blocks.
        other = random_prompt(CONTEXT_TOKENS, vocab_size, seed=13)
        _turn(client, other, None)
        assert kv_status(status).pins == 1  # only the pinned session's own
        _displace(client, vocab_size)
        before = _hits(client)
        _turn(client, other + random_prompt(20, vocab_size, seed=14), None)
        assert _hits(client) - before == 0

    @pytest.mark.slow
    def test_pin_expires_after_its_ttl(
        self, kv: tuple[httpx.Client, Path], vocab_size: int
    ) -> None:
        client, status = kv
        _turn(client, random_prompt(CONTEXT_TOKENS, vocab_size, seed=21), "expiring")
        pinned_at = time.time()
        pinned = kv_status(status)
        assert pinned.pins == 1
        time.sleep(PIN_TTL_S + 0.5)
        # Expiry is checked when vLLM schedules: an idle engine keeps the pin until then.
        assert kv_status(status).pins == 1
        _complete(client, random_prompt(10, vocab_size, seed=22), 1)
        figures = kv_status(status)
        assert figures.wall_ns / 1e9 - pinned_at > PIN_TTL_S
        assert blocks(figures) == (USABLE_BLOCKS, 0, 0)
        assert released(figures, pinned) == {"expired": 1}

    @pytest.mark.slow
    def test_pins_go_under_pressure_before_any_preemption(
        self, kv: tuple[httpx.Client, Path], vocab_size: int
    ) -> None:
        """A 7,000-token prompt needs 55 blocks (vLLM admits a prompt only when all of it
        fits), and 53 are free beside the 10-block pin: the pin goes, nothing is preempted."""
        client, status = kv
        _turn(client, random_prompt(CONTEXT_TOKENS, vocab_size, seed=31), "squeezed")
        pinned = kv_status(status)
        assert pinned.free_blocks == USABLE_BLOCKS - CONTEXT_BLOCKS == 53
        preemptions = metric_total(client.get("/metrics").text, "vllm:num_preemptions")
        _complete(client, random_prompt(7000, vocab_size, seed=32), 1)
        assert metric_total(client.get("/metrics").text, "vllm:num_preemptions") == preemptions
        figures = kv_status(status)
        assert blocks(figures) == (USABLE_BLOCKS, 0, 0)
        assert released(figures, pinned) == {"pressure": 1}

    @pytest.mark.slow
    def test_next_call_takes_over_the_pin_and_an_aborted_call_leaves_none(
        self, kv: tuple[httpx.Client, Path], vocab_size: int
    ) -> None:
        client, status = kv
        context = random_prompt(CONTEXT_TOKENS, vocab_size, seed=41)
        _turn(client, context, "aborting")
        pinned = kv_status(status)
        assert pinned.pins == 1
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": context + random_prompt(20, vocab_size, seed=42),
            "max_tokens": 6000,
            "ignore_eos": True,
            "stream": True,
            "vllm_xargs": {"session_id": "aborting", "turn": 1},
        }
        with client.stream("POST", "/v1/completions", json=body) as stream:
            next(stream.iter_lines())
            running = kv_status(status)
            # The running call holds the blocks itself now; the pin is gone.
            assert (running.pinned_blocks, running.pins) == (0, 0)
            assert released(running, pinned) == {"next_call": 1}
        # Leaving the block closed the connection: vLLM aborts the call, which pins nothing
        # (a call that ran to its end would have pinned again).
        _wait_for_metric(str(client.base_url).rstrip("/"), "vllm:num_requests_running", 0.0)
        assert blocks(kv_status(status)) == (USABLE_BLOCKS, 0, 0)

    @pytest.mark.slow
    def test_prefix_cache_reset_releases_pins(
        self, kv: tuple[httpx.Client, Path], vocab_size: int
    ) -> None:
        client, status = kv
        context = random_prompt(CONTEXT_TOKENS, vocab_size, seed=51)
        _turn(client, context, "reset")
        pinned = kv_status(status)
        assert pinned.pinned_blocks == CONTEXT_BLOCKS
        assert client.post("/reset_prefix_cache").status_code == 200
        figures = kv_status(status)
        assert blocks(figures) == (USABLE_BLOCKS, 0, 0)
        assert released(figures, pinned) == {"reset": 1}
        before = _hits(client)
        _turn(client, context, "reset", turn=1)
        assert _hits(client) - before == 0  # the reset emptied the cache, pins included

    @pytest.mark.slow
    def test_kv_figures_are_published_on_zmq_at_10_hz(
        self, kv: tuple[httpx.Client, Path], vllm_python: Path
    ) -> None:
        """Eleven messages span ten intervals: about 1 s at 10 Hz."""
        _, status = kv
        address = f"ipc://{status.parent / 'kv.sock'}"
        done = subprocess.run(
            [vllm_python, "-c", SUBSCRIBER, address],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        heard = json.loads(done.stdout)
        assert 0.8 < heard["span_s"] < 1.5
        figures = decode_event(heard["payload"])
        assert isinstance(figures, KVStats) and figures.source == "engine"
        assert blocks(figures) == (USABLE_BLOCKS, 0, 0)
        assert (figures.used_blocks, figures.total_blocks) == (0, USABLE_BLOCKS)

    @pytest.mark.slow
    def test_preemption_with_the_policy_victim_completes_every_call(
        self, kv: tuple[httpx.Client, Path], vocab_size: int
    ) -> None:
        """Three sessions decode 2,000 tokens each after 1,300-token prompts: 26 blocks each
        at the end, 78 in all, more than the 63 there are, so vLLM must preempt (Continuum
        picks the victim); every call still ends with all its tokens, and the blocks left in
        use afterwards are exactly the pinned ones."""
        client, status = kv
        preemptions = metric_total(client.get("/metrics").text, "vllm:num_preemptions")
        answers: dict[str, int] = {}

        def run(session: str, seed: int) -> None:
            with httpx.Client(base_url=client.base_url, timeout=TIMEOUT_S) as own:
                body = {"vllm_xargs": {"session_id": session, "turn": 0}}
                prompt = random_prompt(CONTEXT_TOKENS, vocab_size, seed)
                answers[session] = _complete(own, prompt, 2000, **body)["usage"][
                    "completion_tokens"
                ]

        threads = [threading.Thread(target=run, args=(f"s{seed}", seed)) for seed in (61, 62, 63)]
        for thread in threads:
            thread.start()
            time.sleep(0.1)
        for thread in threads:
            thread.join(TIMEOUT_S)
        assert answers == {"s61": 2000, "s62": 2000, "s63": 2000}
        assert metric_total(client.get("/metrics").text, "vllm:num_preemptions") > preemptions
        figures = kv_status(status)
        assert figures.used_blocks == figures.pinned_blocks > 0


# --- allocations routed past the pins' wrapper ------------------------------------------

ROUTING_PROBE = """
import collections, json, sys
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.request import RequestStatus
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

seen = collections.Counter()
scheduler = None
allocate = KVCacheManager.allocate_slots

def recorded(manager, request, *args, **kwargs):
    wrapped = manager.__dict__["allocate_slots"] is scheduler._allocate_with_pins
    route = "wrapped" if wrapped else "direct"
    blocks = allocate(manager, request, *args, **kwargs)
    status = "running" if request.status is RequestStatus.RUNNING else "waiting"
    seen[f"{route} {status}"] += 1
    if blocks is None:
        seen[f"{route} {status} failed"] += 1
    if route == "direct" and status == "waiting" and scheduler.pin_table.pins:
        seen["direct waiting with pins"] += 1
    return blocks

KVCacheManager.allocate_slots = recorded
shape = b.SchedulerShape()
scheduler = b.make_scheduler(sys.argv[1], ensure_tiny_model(), shape)
result = b.drive(scheduler, sys.argv[1], b.build_sessions(b.QueueShape()), shape.block_size)
seen["pressure releases"] = scheduler.pin_table.released["pressure"]
seen["calls"] = len(result.output_tokens)
print(json.dumps(seen))
"""


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mars", "continuum"])
def test_allocations_routed_past_the_wrapper_are_those_it_would_pass_through(
    vllm_python: Path, policy: str
) -> None:
    """On bench_schedule's queue (pins, pressure and preemptions), an allocation that
    skips the pins' wrapper is a running call's that succeeds, or a waiting call's
    while no pin is held: the two cases where the wrapper does nothing. The others went
    through it, and some of those failed and were answered with pins reclaimed."""
    done = subprocess.run(
        [vllm_python, "-c", ROUTING_PROBE, policy],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["calls"] == 256
    assert seen["direct running"] > 0 and seen["direct waiting"] > 0
    assert seen.get("direct running failed", 0) == 0
    assert seen.get("direct waiting with pins", 0) == 0
    assert seen.get("wrapped running failed", 0) + seen.get("wrapped waiting failed", 0) > 0
    assert seen["pressure releases"] > 0
