"""What the plugin provides a policy's engine half, on the real vLLM CPU engine with the
tiny model: a half that needs more is refused when vLLM starts (``thunderagent-cpu``
started without the agentmars CPU KV tier, which it offloads to; each capability's
refusal is checked on the plugin's configuration in ``test_plugin.py``, without a
start), and ``continuum-dy`` with a profile and the side channel serves calls and
takes its dynamic TTL, which weighs a tool's past durations (the gateway's
``tool_end`` events, through the hints socket) against the profile's estimate of the
context's prefill time.

Two vLLM servers start, one at a time: one that fails at start, one that serves."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.sdk.events import ToolEnd
from agentmars.server.engines.vllm.launch import (
    CPU_BLOCK_SIZE,
    SERVED_MODEL_NAME,
    VllmServerConfig,
    serve_vllm,
)
from agentmars.server.engines.vllm.smoke import model_vocab_size, random_prompt
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.profiles.cost_model import CostModel, load_profile
from tests.server.engines.vllm.helpers import (
    PLUGIN,
    blocks,
    kv_status,
    released,
    send_hints,
    vllm_core,
)

TIMEOUT_S = 120.0
KV_BLOCKS = 64
USABLE_BLOCKS = KV_BLOCKS - 1
"""vLLM keeps block 0 as its null block."""
PROFILE = "cpu-tiny"
FIXED_TTL_S = 2.0
"""Continuum's fixed TTL (the default), which continuum-dy keeps until it has
``min_samples`` tool durations."""
CONTEXT_TOKENS = 1300
"""A session's first prompt: 10 full blocks (1,280 tokens) are hashed, and pinned."""
CONTEXT_BLOCKS = CONTEXT_TOKENS // CPU_BLOCK_SIZE
OUTPUT_TOKENS = 4
RELOAD_S = CostModel(load_profile(PROFILE)).prefill_time(CONTEXT_TOKENS + OUTPUT_TOKENS)
"""The profile's estimate of computing a finished call's context again: about 22 ms."""
QUICK_TOOL_S = 0.01
"""A tool shorter than ``RELOAD_S``: pinning for its duration pays (tau* = 10 ms)."""
SLOW_TOOL_S = 1.0
"""A tool longer than ``RELOAD_S``, though under the fixed TTL: no pin pays."""


def _config(vllm_python: Path) -> VllmServerConfig:
    return VllmServerConfig(
        python=vllm_python,
        model=tiny_model_made_by(vllm_python),
        max_model_len=4096,
        num_blocks=KV_BLOCKS,
        # vLLM's compute threads keep to one core (vllm_core); this process has the other, so the
        # sleeps here are not stretched by vLLM starving it (test_plugin's servers).
        cores=vllm_core(),
        extra_args=("--scheduler-cls", PLUGIN),
    )


# --- refused at start -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "missing"),
    [
        # The plugin ticks and pauses, but vLLM runs no CPU KV tier here (no
        # --kv-transfer-config: test_cpu_tier_on_vllm.py starts one).
        ("thunderagent-cpu", "it needs cpu-tier, which the vLLM plugin does not provide"),
    ],
)
def test_a_policy_needing_what_the_plugin_lacks_is_refused_at_start(
    vllm_python: Path, tmp_path: Path, policy: str, missing: str
) -> None:
    env = {
        "AGENTMARS_POLICY": policy,
        "AGENTMARS_HINTS_ADDR": f"ipc://{tmp_path / 'hints.sock'}",
    }
    log = tmp_path / "server.log"
    with (
        pytest.raises(RuntimeError, match="server exited"),
        serve_vllm(_config(vllm_python), log, env=env),
    ):
        pass  # pragma: no cover (vLLM must not come up)
    text = log.read_text()
    assert f"the vLLM plugin cannot run policy {policy!r}: {missing}" in text, text[-3000:]


# --- continuum-dy served --------------------------------------------------------------


@dataclass
class Server:
    url: str
    status: Path
    hints: str
    """The plugin's hints address (``AGENTMARS_HINTS_ADDR``): the gateway's events in."""


@pytest.fixture(scope="module")
def continuum_dy(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """continuum-dy taking its dynamic TTL after one tool duration (``min_samples=1``),
    with the ``cpu-tiny`` cost profile and a hints socket; no gateway (the test sends
    the gateway's events itself)."""
    folder = tmp_path_factory.mktemp("continuum-dy")
    hints = f"ipc://{folder / 'hints.sock'}"
    env = {
        "AGENTMARS_POLICY": "continuum-dy",
        "AGENTMARS_POLICY_SETTINGS": json.dumps({"min_samples": 1}),
        "AGENTMARS_PROFILE": PROFILE,
        "AGENTMARS_HINTS_ADDR": hints,
        "AGENTMARS_KV_STATUS_FILE": str(folder / "kv.json"),
    }
    with serve_vllm(_config(vllm_python), folder / "server.log", env=env) as url:
        yield Server(url, folder / "kv.json", hints)


def _turn(client: httpx.Client, prompt: list[int], session: str | None, **xargs: Any) -> None:
    body: dict[str, Any] = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": OUTPUT_TOKENS if session else 1,
        "ignore_eos": True,
    }
    if session is not None:
        # As the gateway forwards an agent's call that will end in a tool call.
        body["vllm_xargs"] = {"session_id": session, "turn": 0, "expects_tool": 1, **xargs}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text


@pytest.mark.slow
def test_continuum_dy_pins_for_the_ttl_its_tool_durations_and_costs_give(
    continuum_dy: Server, vllm_python: Path
) -> None:
    """Before any tool duration is known a finished call is pinned for the fixed 2 s.
    After one ``tool_end`` of a 10 ms ``bash``, a call whose next tool is ``bash`` is
    pinned for tau* = 10 ms (the CDF's one sample, as reloading its context is
    estimated at 22 ms): the pin is gone well before 2 s. After one ``tool_end`` of a
    1 s ``build`` (under the fixed TTL, so plain Continuum would pin), a call whose next
    tool is ``build`` is not pinned at all: reloading costs less than waiting."""
    assert QUICK_TOOL_S < RELOAD_S < SLOW_TOOL_S < FIXED_TTL_S
    server = continuum_dy
    vocab_size = model_vocab_size(tiny_model_made_by(vllm_python))
    with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as client:

        def trigger(seed: int) -> None:
            """A call of no session: vLLM schedules, so the plugin checks pins' expiry
            (an idle engine never does) and takes the hints sent so far."""
            _turn(client, random_prompt(10, vocab_size, seed), None)

        start = kv_status(server.status)
        assert blocks(start) == (USABLE_BLOCKS, 0, 0)

        # No tool duration yet: the fixed TTL.
        _turn(client, random_prompt(CONTEXT_TOKENS, vocab_size, 1), "fixed", next_tool="bash")
        pinned_at = time.time()
        fixed = kv_status(server.status)
        assert blocks(fixed) == (USABLE_BLOCKS - CONTEXT_BLOCKS, CONTEXT_BLOCKS, 1)
        time.sleep(0.5)
        trigger(2)
        kept = kv_status(server.status)
        assert time.time() - pinned_at < FIXED_TTL_S, "too slow to tell the TTLs apart"
        assert (kept.pins, released(kept, start)) == (1, {})
        time.sleep(max(pinned_at + FIXED_TTL_S + 0.2 - time.time(), 0.0))
        trigger(3)
        expired = kv_status(server.status)
        assert blocks(expired) == (USABLE_BLOCKS, 0, 0)
        assert released(expired, kept) == {"expired": 1}

        # One quick bash seen: the dynamic TTL, 10 ms.
        bash = ToolEnd(
            session_id="earlier", call_id="t1", turn=0, tool="bash", duration_s=QUICK_TOOL_S
        )
        send_hints(server.hints, bash)
        time.sleep(0.3)  # received by the plugin's thread
        trigger(4)  # taken at this step: the half has its sample before the next call
        _turn(client, random_prompt(CONTEXT_TOKENS, vocab_size, 5), "dynamic", next_tool="bash")
        pinned_at = time.time()
        dynamic = kv_status(server.status)
        assert blocks(dynamic) == (USABLE_BLOCKS - CONTEXT_BLOCKS, CONTEXT_BLOCKS, 1)
        time.sleep(0.5)
        trigger(6)
        gone = kv_status(server.status)
        assert time.time() - pinned_at < FIXED_TTL_S, "too slow to tell the TTLs apart"
        assert blocks(gone) == (USABLE_BLOCKS, 0, 0)
        assert released(gone, dynamic) == {"expired": 1}

        # One slow build seen: pinning for it does not pay, so nothing is pinned.
        build = ToolEnd(
            session_id="earlier", call_id="t2", turn=1, tool="build", duration_s=SLOW_TOOL_S
        )
        send_hints(server.hints, build)
        time.sleep(0.3)
        trigger(7)
        _turn(client, random_prompt(CONTEXT_TOKENS, vocab_size, 8), "slow", next_tool="build")
        unpinned = kv_status(server.status)
        assert blocks(unpinned) == (USABLE_BLOCKS, 0, 0)
        assert released(unpinned, gone) == {}
