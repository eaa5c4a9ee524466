"""Displacement in the vLLM plugin (``EngineHalf.preemptive``): a waiting call ranked
before a running one that cannot start preempts the running calls ranked after it,
the last-ranked first; under a policy that is not preemptive it waits (vLLM's rule).

- The loop (``engines/vllm/displacement.py``) on plain values.
- vLLM's own ``Scheduler`` with the plugin in one process, built as
  ``engines.vllm.bench_schedule`` builds it (the real scheduler, KV cache manager,
  block pool and prefix cache; no model: each step's output is made up), so every
  step's decisions are exact: a full batch, too few free blocks, a call ranked no
  better, pins dropped first, a prefix hit held by a running call, a partial start.
- The real vLLM CPU engine with the tiny model: the urgent call's answer comes while
  the call it displaced is still to finish, and ``vllm:num_preemptions`` counts it.

The test policy (``urgent_policy``: ``agent`` "urgent" first) is loaded in vLLM's
process with ``AGENTMARS_POLICY_MODULES``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.server.engines.vllm.displacement import displace
from agentmars.server.engines.vllm.launch import SERVED_MODEL_NAME, VllmServerConfig, serve_vllm
from agentmars.server.engines.vllm.smoke import metric_total, model_vocab_size, random_prompt
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from tests.server.engines.vllm.helpers import PLUGIN, REPO, vllm_core, wait_for_metric
from tests.server.engines.vllm.urgent_policy import NAME, URGENT

MODULE = "tests.server.engines.vllm.urgent_policy"

# --- the loop, on plain values ---------------------------------------------------------


class Batch:
    """Running calls named by their rank, and a waiting call that needs ``seats`` free
    of ``size``."""

    def __init__(self, running: list[int], size: int, refuse: frozenset[int] = frozenset()):
        self.running = running
        self.size = size
        self.refuse = refuse
        self.ranked: list[int] = []
        self.asked = 0

    def rank(self, call: int) -> int:
        self.ranked.append(call)
        return call

    def blocked(self) -> bool:
        self.asked += 1
        return len(self.running) >= self.size

    def preempt(self, call: int) -> bool:
        if call in self.refuse:
            return False
        self.running.remove(call)
        return True


def test_the_last_ranked_running_calls_go_first_until_the_waiting_call_can_start() -> None:
    batch = Batch([3, 9, 1, 7], size=3)
    assert displace(2, batch.running, batch.rank, batch.blocked, batch.preempt) == [9, 7]
    assert batch.running == [3, 1]
    assert sorted(batch.ranked) == [1, 3, 7, 9]  # each running call ranked once
    assert batch.asked == 3


def test_no_running_call_ranked_before_or_with_the_waiting_one_is_displaced() -> None:
    batch = Batch([1, 4, 2], size=1)
    assert displace(3, batch.running, batch.rank, batch.blocked, batch.preempt) == [4]
    assert batch.running == [1, 2]  # still blocked, but both rank before 3
    # Equal ranks displace nothing either (the plugin's ranks end with the request id).
    batch = Batch([5], size=1)
    assert displace(5, batch.running, batch.rank, batch.blocked, batch.preempt) == []


def test_a_call_that_can_start_ranks_no_running_call() -> None:
    batch = Batch([9, 8], size=4)
    assert displace(0, batch.running, batch.rank, batch.blocked, batch.preempt) == []
    assert batch.ranked == [] and batch.asked == 1


def test_a_call_that_cannot_be_preempted_now_ends_the_loop() -> None:
    batch = Batch([3, 9, 7], size=1, refuse=frozenset({7}))
    assert displace(0, batch.running, batch.rank, batch.blocked, batch.preempt) == [9]
    assert batch.running == [3, 7]


# --- vLLM's scheduler in this process ---------------------------------------------------

SCHEDULER_PROBE = """
import json, os, random, sys
from vllm import SamplingParams
from vllm.v1.request import Request
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

def tokens(segments):
    out = []
    for seed, n in segments:
        rng = random.Random(seed)
        out += [rng.randrange(1, b.VOCAB) for _ in range(n)]
    return out

def run(scenario):
    os.environ["AGENTMARS_POLICY_SETTINGS"] = json.dumps(scenario["settings"])
    shape = b.SchedulerShape(**scenario["shape"])
    scheduler = b.make_scheduler(sys.argv[2], ensure_tiny_model(), shape)
    hasher = b.RequestFactory(shape.block_size)._hasher
    pool, pins = scheduler.kv_cache_manager.block_pool, scheduler.pin_table
    pending, live, everyone, steps = list(scenario["calls"]), {}, {}, []
    while (pending or live) and len(steps) < 500:
        for call in [c for c in pending if c["at"] == len(steps)]:
            pending.remove(call)
            xargs = {"agent": call.get("agent", "")}
            if call.get("session"):
                xargs["session_id"] = call["session"]
            request = Request(
                request_id=call["id"],
                prompt_token_ids=tokens(call["prompt"]),
                sampling_params=SamplingParams(
                    max_tokens=call["max_tokens"], ignore_eos=True, extra_args=xargs
                ),
                pooling_params=None,
                block_hasher=hasher,
            )
            live[call["id"]] = everyone[call["id"]] = request
            scheduler.add_request(request)
        before = {r: request.num_preemptions for r, request in everyone.items()}
        output = scheduler.schedule()
        scheduler.update_from_output(output, b.synthetic_output(output, live))
        done = sorted(r for r, request in live.items() if request.is_finished())
        steps.append({
            "tokens": dict(output.num_scheduled_tokens),
            "preempted": sorted(
                r for r, request in everyone.items() if request.num_preemptions > before[r]
            ),
            "finished": done,
            "free": pool.get_num_free_blocks(),
            "pins": len(pins),
            "released": {k: v for k, v in pins.released.items() if v},
        })
        for request_id in done:
            live.pop(request_id)
    scheduler.shutdown()
    return steps

scenarios = json.loads(sys.argv[1])
print(json.dumps({name: run(scenario) for name, scenario in scenarios.items()}))
"""
"""Runs each scenario (``calls``: id, prompt as seeded segments ``[seed, tokens]``,
``max_tokens``, ``agent``, ``session``, the step ``at`` which it is added) on a fresh
plugin scheduler of ``shape`` with the test policy's ``settings``; prints, for each
step, the tokens scheduled per call, the calls preempted and finished in it, and the
free blocks, the pins and the pins released after it."""

BLOCK = 16
SEATS = {"kv_blocks": 64, "block_size": BLOCK, "max_num_seqs": 2, "max_model_len": 1024}
"""Room in the KV cache for everyone; two calls run at once."""
SCARCE = {"kv_blocks": 24, "block_size": BLOCK, "max_num_seqs": 4, "max_model_len": 1024}
"""24 blocks of 16 tokens (vLLM adds its null block)."""
LOW_PROMPT = 256
"""16 blocks; 17 once its first output tokens are decoded."""
URGENT_PROMPT = 160
"""10 blocks: more than the 7 free beside the low call (24 - 17)."""
URGENT_AT = 2


def _seats(preemptive: bool) -> dict[str, Any]:
    """Two low calls fill the batch; an urgent one arrives at step 4."""
    return {
        "shape": SEATS,
        "settings": {"preemptive": preemptive},
        "calls": [
            {"id": "low1", "prompt": [[1, 16]], "max_tokens": 30, "at": 0},
            {"id": "low2", "prompt": [[2, 16]], "max_tokens": 30, "at": 0},
            {"id": "urgent", "prompt": [[3, 16]], "max_tokens": 3, "agent": URGENT, "at": 4},
        ],
    }


def _blocks(preemptive: bool, **settings: bool) -> dict[str, Any]:
    """A low call holds 17 of the 24 blocks; an urgent call needing 10 arrives."""
    return {
        "shape": SCARCE,
        "settings": {"preemptive": preemptive, **settings},
        "calls": [
            {"id": "low", "prompt": [[1, LOW_PROMPT]], "max_tokens": 60, "at": 0},
            {
                "id": "urgent",
                "prompt": [[2, URGENT_PROMPT]],
                "max_tokens": 3,
                "agent": URGENT,
                "at": URGENT_AT,
            },
        ],
    }


SCENARIOS: dict[str, dict[str, Any]] = {
    "seats": _seats(True),
    "seats-fcfs": _seats(False),
    "blocks": _blocks(True),
    "blocks-fcfs": _blocks(False),
    # Both urgent, one seat: the second ranks after the first (arrival), so it waits.
    "no-better": {
        "shape": {**SEATS, "max_num_seqs": 1},
        "settings": {"preemptive": True},
        "calls": [
            {"id": "first", "prompt": [[1, 16]], "max_tokens": 20, "agent": URGENT, "at": 0},
            {"id": "second", "prompt": [[2, 16]], "max_tokens": 3, "agent": URGENT, "at": 2},
        ],
    },
    # A finished call of session s pins its 10 blocks; the low call then takes 9 (8 and
    # one decode block), leaving 5 free; the urgent call needs 6: the pin goes, and
    # that is room enough, so nothing is preempted.
    "pins": {
        "shape": SCARCE,
        "settings": {"preemptive": True, "pin": True},
        "calls": [
            {"id": "ctx", "prompt": [[5, 160]], "max_tokens": 1, "session": "s", "at": 0},
            {"id": "low", "prompt": [[1, 128]], "max_tokens": 60, "at": 1},
            {"id": "urgent", "prompt": [[2, 96]], "max_tokens": 3, "agent": URGENT, "at": 3},
        ],
    },
    # The urgent prompt is the low call's 256 tokens and 32 more: 18 blocks, 16 of them
    # held by the running low call (a prefix hit), so it needs only 2 of the 7 free.
    "prefix": {
        "shape": SCARCE,
        "settings": {"preemptive": True},
        "calls": [
            {"id": "low", "prompt": [[1, LOW_PROMPT]], "max_tokens": 60, "at": 0},
            {
                "id": "urgent",
                "prompt": [[1, LOW_PROMPT], [9, 32]],
                "max_tokens": 3,
                "agent": URGENT,
                "at": URGENT_AT,
            },
        ],
    },
    # The policy lets the urgent call start on the 7 free blocks (112 tokens).
    "partial": _blocks(True, partial=True),
}


@pytest.fixture(scope="module")
def traces(vllm_python: Path) -> dict[str, list[dict[str, Any]]]:
    started = time.monotonic()
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    done = subprocess.run(
        [str(vllm_python), "-c", SCHEDULER_PROBE, json.dumps(SCENARIOS), NAME],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            "AGENTMARS_POLICY_MODULES": MODULE,
        },
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    found: dict[str, list[dict[str, Any]]] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"scheduler probe: {time.monotonic() - started:.1f} s")
    return found


def _first(trace: list[dict[str, Any]], call: str) -> int:
    """The step that first scheduled ``call``."""
    return next(i for i, step in enumerate(trace) if call in step["tokens"])


def _finished_at(trace: list[dict[str, Any]], call: str) -> int:
    return next(i for i, step in enumerate(trace) if call in step["finished"])


def _preempted(trace: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(i, call) for i, step in enumerate(trace) for call in step["preempted"]]


def _everyone_finished(trace: list[dict[str, Any]], scenario: str) -> None:
    ids = {call["id"] for call in SCENARIOS[scenario]["calls"]}
    assert {call for step in trace for call in step["finished"]} == ids


@pytest.mark.slow
def test_a_full_batch_gives_up_its_last_ranked_call(
    traces: dict[str, list[dict[str, Any]]],
) -> None:
    """Preemptive: at step 4 the urgent call takes low2's seat (low2 arrived last, so
    it ranks last) and runs at once; low2 is recomputed once it ends. Not preemptive:
    it waits for a seat, which comes when the low calls end."""
    trace = traces["seats"]
    assert _preempted(trace) == [(4, "low2")]
    assert _first(trace, "urgent") == 4
    assert trace[4]["tokens"] == {"low1": 1, "urgent": 16}
    urgent_end = _finished_at(trace, "urgent")
    assert urgent_end < _finished_at(trace, "low1") < _finished_at(trace, "low2")
    # low2 comes back after the urgent call: its 16 prompt and 4 output tokens again,
    # less its prompt's block, still in the prefix cache.
    assert trace[urgent_end + 1]["tokens"]["low2"] == 16 + 4 - BLOCK
    _everyone_finished(trace, "seats")

    fcfs = traces["seats-fcfs"]
    assert _preempted(fcfs) == []
    low_end = min(_finished_at(fcfs, "low1"), _finished_at(fcfs, "low2"))
    assert _first(fcfs, "urgent") == low_end + 1
    _everyone_finished(fcfs, "seats-fcfs")


@pytest.mark.slow
def test_too_few_free_blocks_displace_the_call_ranked_after(
    traces: dict[str, list[dict[str, Any]]],
) -> None:
    """The urgent call's 10 blocks are not free beside the low call's 17: preemptive,
    the low call goes and the urgent one computes its whole prompt in the same step;
    the low call waits for the blocks until the urgent call ends. Not preemptive, the
    urgent call waits for the low call's end."""
    trace = traces["blocks"]
    assert trace[URGENT_AT - 1]["free"] == 24 - 17
    assert _preempted(trace) == [(URGENT_AT, "low")]
    assert trace[URGENT_AT]["tokens"] == {"urgent": URGENT_PROMPT}
    urgent_end = _finished_at(trace, "urgent")
    assert "low" not in trace[urgent_end]["tokens"]  # no room beside the urgent call
    assert "low" in trace[urgent_end + 1]["tokens"]
    _everyone_finished(trace, "blocks")

    fcfs = traces["blocks-fcfs"]
    assert _preempted(fcfs) == []
    assert _first(fcfs, "urgent") == _finished_at(fcfs, "low") + 1
    _everyone_finished(fcfs, "blocks-fcfs")


@pytest.mark.slow
def test_a_call_ranked_no_better_than_the_running_ones_waits(
    traces: dict[str, list[dict[str, Any]]],
) -> None:
    trace = traces["no-better"]
    assert _preempted(trace) == []
    assert _first(trace, "second") == _finished_at(trace, "first") + 1


@pytest.mark.slow
def test_pins_go_before_any_running_call_is_displaced(
    traces: dict[str, list[dict[str, Any]]],
) -> None:
    trace = traces["pins"]
    assert trace[0]["pins"] == 1 and trace[2]["free"] == 24 - 10 - 9
    assert _preempted(trace) == []
    assert _first(trace, "urgent") == 3
    assert trace[3]["tokens"] == {"low": 1, "urgent": 96}
    assert trace[3]["pins"] == 0 and trace[3]["released"] == {"pressure": 1}


@pytest.mark.slow
def test_a_prefix_held_by_a_running_call_needs_no_free_blocks(
    traces: dict[str, list[dict[str, Any]]],
) -> None:
    """The urgent call's whole prompt is 18 blocks, more than the 7 free, but 16 are
    the low call's (vLLM shares them): it needs 2, so it starts without displacing
    anything, computing only its 32 new tokens."""
    trace = traces["prefix"]
    assert _preempted(trace) == []
    assert trace[URGENT_AT]["tokens"] == {"low": 1, "urgent": 32}


@pytest.mark.slow
def test_a_call_the_policy_lets_start_on_what_fits_displaces_nothing(
    traces: dict[str, list[dict[str, Any]]],
) -> None:
    """The same queue as the blocks test, but the policy lets the urgent call start
    partially: its first chunk, 7 blocks (112 tokens), fits, so the low call stays."""
    trace = traces["partial"]
    assert _preempted(trace[: URGENT_AT + 1]) == []
    assert trace[URGENT_AT]["tokens"] == {"low": 1, "urgent": 7 * BLOCK}


# --- the real engine ---------------------------------------------------------------------

TIMEOUT_S = 180.0
KV_BLOCKS = 64
"""63 usable blocks of 128 tokens (vLLM keeps block 0 as its null block)."""
LOW_TOKENS = 3000
"""What each low call generates: long enough to be running when the urgent one comes."""
HOLDING_PROMPT = 4500
"""36 blocks: with its output, more than half of the 63."""
NEEDING_PROMPT = 3500
"""28 blocks: more than are free beside ``HOLDING_PROMPT`` (at most 27)."""


@pytest.fixture(scope="session")
def vocab_size(vllm_python: Path) -> int:
    return model_vocab_size(tiny_model_made_by(vllm_python))


@pytest.fixture(
    scope="class", params=[True, False], ids=["preemptive", "not-preemptive"]
)  # fmt: skip
def engine(
    request: pytest.FixtureRequest, vllm_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, bool]]:
    """The plugin with the test policy, preemptive or not, two calls at a time on a
    64-block cache; yields the URL and whether the policy is preemptive. One server at
    a time: pytest stops the first before it starts the second."""
    preemptive: bool = request.param
    folder = tmp_path_factory.mktemp("displacing" if preemptive else "waiting")
    config = VllmServerConfig(
        python=vllm_python,
        model=tiny_model_made_by(vllm_python),
        max_model_len=8000,
        num_blocks=KV_BLOCKS,
        # vLLM's compute threads keep to one core (vllm_core); the test's clients have the other.
        cores=vllm_core(),
        extra_args=("--scheduler-cls", PLUGIN, "--max-num-seqs", "2", "--enforce-eager"),
    )
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        "PYTHONPATH": os.pathsep.join(paths),
        "AGENTMARS_POLICY": NAME,
        "AGENTMARS_POLICY_SETTINGS": json.dumps({"preemptive": preemptive}),
        "AGENTMARS_POLICY_MODULES": MODULE,
    }
    with serve_vllm(config, folder / "server.log", env=env) as url:
        yield url, preemptive


class Calls:
    """Completions run on threads, and the order in which they returned."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.finished: list[str] = []
        self.took: dict[str, float] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, name: str, prompt: list[int], max_tokens: int, agent: str = "") -> None:
        thread = threading.Thread(target=self.run, args=(name, prompt, max_tokens, agent))
        self._threads.append(thread)
        thread.start()

    def run(self, name: str, prompt: list[int], max_tokens: int, agent: str = "") -> None:
        started = time.monotonic()
        with httpx.Client(base_url=self.url, timeout=TIMEOUT_S) as client:
            response = client.post(
                "/v1/completions",
                json={
                    "model": SERVED_MODEL_NAME,
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                    "vllm_xargs": {"agent": agent},
                },
            )
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == max_tokens
        with self._lock:
            self.finished.append(name)
            self.took[name] = time.monotonic() - started

    def join(self) -> None:
        for thread in self._threads:
            thread.join(TIMEOUT_S)
        assert not any(thread.is_alive() for thread in self._threads)


def _preemptions(url: str) -> float:
    return metric_total(httpx.get(f"{url}/metrics", timeout=10.0).text, "vllm:num_preemptions")


class TestOnTheEngine:
    @pytest.mark.slow
    def test_an_urgent_call_takes_the_seat_of_a_low_one(
        self, engine: tuple[str, bool], vocab_size: int
    ) -> None:
        """Two low calls fill the batch (``--max-num-seqs 2``); an urgent call comes.
        Preemptive: it is answered while both low calls go on, one of them preempted.
        Not: it waits for a low call to end."""
        url, preemptive = engine
        before = _preemptions(url)
        calls = Calls(url)
        for running, name in enumerate(("low1", "low2"), start=1):
            calls.start(name, random_prompt(20, vocab_size, running), LOW_TOKENS)
            wait_for_metric(url, "vllm:num_requests_running", float(running))
        calls.run("urgent", random_prompt(20, vocab_size, 3), 8, agent=URGENT)
        lows_done_then = [name for name in calls.finished if name != "urgent"]
        calls.join()
        print(f"seats, preemptive={preemptive}: {calls.finished} {calls.took}")
        if preemptive:
            assert lows_done_then == []
            assert calls.finished[0] == "urgent"
            assert _preemptions(url) - before == 1
        else:
            # It took the seat of the first low call to end (the other may end later):
            # it waited about as long as the low calls ran. Read from its own latency,
            # not from which answer its client heard first (a low call's answer may
            # reach its client after the urgent one's, on a loaded machine).
            assert calls.took["urgent"] > 0.5 * min(calls.took["low1"], calls.took["low2"])
            assert _preemptions(url) == before

    @pytest.mark.slow
    def test_an_urgent_call_takes_the_blocks_of_a_low_one(
        self, engine: tuple[str, bool], vocab_size: int
    ) -> None:
        """A low call's 4,500-token prompt holds 36 of the 63 blocks; an urgent call's
        3,500 tokens need 28. Preemptive: the low call is preempted and the urgent one
        answered while it waits. Not: the urgent call waits for the low call's end."""
        url, preemptive = engine
        before = _preemptions(url)
        calls = Calls(url)
        calls.start("low", random_prompt(HOLDING_PROMPT, vocab_size, 11), LOW_TOKENS)
        wait_for_metric(url, "vllm:num_requests_running", 1.0)
        calls.run("urgent", random_prompt(NEEDING_PROMPT, vocab_size, 12), 8, agent=URGENT)
        low_done_then = "low" in calls.finished
        calls.join()
        print(f"blocks, preemptive={preemptive}: {calls.finished} {calls.took}")
        if preemptive:
            assert not low_done_then
            assert calls.finished == ["urgent", "low"]
            assert _preemptions(url) - before == 1
        else:
            # It waited for the low call's end (its latency, as above).
            assert calls.took["urgent"] > 0.5 * calls.took["low"]
            assert _preemptions(url) == before
