"""What the real-engine tests share: the tiny model, the plugin's KV status file,
vLLM's Prometheus counters, and vLLM with the plugin linked to a gateway by the side
channel as ``agentmars serve`` links them."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import zmq

from agentmars.sdk.events import AnyEvent, EventError, KVStats, decode_event
from agentmars.server.engines.vllm.launch import CPU_BLOCK_SIZE, VllmServerConfig, serve_vllm
from agentmars.server.engines.vllm.smoke import metric_total
from agentmars.server.engines.vllm.tiny_model import tiny_model_made_by
from agentmars.server.gateway.app import Gateway, GatewayConfig, create_gateway_app
from agentmars.server.policies.interface import Policy
from agentmars.server.web.serving import serve_in_thread

PLUGIN = "agentmars.server.engines.vllm.plugin.AgentmarsScheduler"
"""``--scheduler-cls`` of the agentmars plugin (the CPU backend's synchronous one)."""
REPO = Path(__file__).resolve().parents[4]
"""The repository's root: on vLLM's ``PYTHONPATH``, so ``AGENTMARS_POLICY_MODULES`` may
name a test module (``tests.server.engines.vllm...``) whatever the working directory."""


def kv_status(path: Path, newer_than: float | None = None) -> KVStats:
    """The plugin's KV figures (the ``kv_stats`` event in its status file), sampled
    after ``newer_than`` (wall-clock seconds; default: now)."""
    newer_than = time.time() if newer_than is None else newer_than
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, EventError):
            figures = decode_event(path.read_bytes())
            assert isinstance(figures, KVStats), figures
            if figures.wall_ns / 1e9 > newer_than:
                return figures
        time.sleep(0.02)
    raise AssertionError(f"no fresh KV status in {path}")


def blocks(figures: KVStats) -> tuple[int, int, int]:
    """Free and pinned blocks, and pins: what most checks compare at once."""
    return figures.free_blocks, figures.pinned_blocks, figures.pins


def released(figures: KVStats, before: KVStats) -> dict[str, int]:
    """Pins released between two status samples, by reason (reasons with none left out)."""
    counts = {reason: n - before.released.get(reason, 0) for reason, n in figures.released.items()}
    return {reason: n for reason, n in counts.items() if n}


def labelled_total(exposition: str, name: str, **labels: str) -> float:
    """Like ``metric_total``, over the samples carrying all of ``labels`` only."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    lines = [line for line in exposition.splitlines() if all(w in line for w in wanted)]
    return metric_total("\n".join(lines), name)


def admitted_sessions(exposition: str) -> float:
    """The sessions a gateway's ``/metrics`` counts as admitted (all but the waiting)."""
    states = ("engine", "tool", "idle")
    return sum(labelled_total(exposition, "agentmars_sessions", state=s) for s in states)


def engine_metric(base_url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` with ``labels`` on ``base_url/metrics``."""
    return labelled_total(httpx.get(f"{base_url}/metrics", timeout=10.0).text, name, **labels)


def wait_for_metric(base_url: str, name: str, value: float, timeout_s: float = 30.0) -> None:
    """Wait until vLLM's ``name`` reads ``value``."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = engine_metric(base_url, name)
        if seen == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} stayed {seen}, not {value}")


def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait until ``condition()`` holds (polling every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


# --- vLLM and the gateway linked by the side channel ---------------------------------


def vllm_core() -> str:
    """The core this test process's vLLM servers keep to: 1 on ``make test``'s second
    worker (gw1), else 0, so that the vLLM modules the two workers run at once
    (tests/conftest.py) never share a core."""
    return "1" if os.environ.get("PYTEST_XDIST_WORKER") == "gw1" else "0"


@dataclass(frozen=True)
class LinkedEngine:
    """A vLLM server with the plugin, its KV figures published on a ZMQ socket (and
    written to ``status``) and the gateway's events taken in on another, as ``agentmars
    serve`` starts it (``AGENTMARS_KV_STATUS_ADDR`` / ``AGENTMARS_HINTS_ADDR``)."""

    url: str
    folder: Path
    config: VllmServerConfig

    @property
    def status(self) -> Path:
        return self.folder / "kv.json"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    @property
    def kv_address(self) -> str:
        return f"ipc://{self.folder / 'kv.sock'}"

    @property
    def hints_address(self) -> str:
        return f"ipc://{self.folder / 'hints.sock'}"


@contextlib.contextmanager
def linked_vllm(
    python: Path,
    folder: Path,
    policy: str,
    *,
    settings: Mapping[str, Any] | None = None,
    modules: Sequence[str] = (),
    num_blocks: int = 64,
    max_model_len: int = 4096,
    cpu_kv_blocks: int = 0,
) -> Iterator[LinkedEngine]:
    """vLLM (the tiny model, ``num_blocks`` KV blocks of 128 tokens, on ``vllm_core()``) with the
    plugin running ``policy`` and the side channel's sockets in ``folder``, and a CPU KV
    tier of ``cpu_kv_blocks`` blocks (0: none). NOTE:
    ``--enforce-eager``: no torch.compile at start, which saves ~10 of the ~38 s a start
    takes on a CI runner; the scheduler, and so the plugin, are the same."""
    config = VllmServerConfig(
        python=python,
        model=tiny_model_made_by(python),
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        # vLLM's compute threads keep to one core (vllm_core); this process (the gateway, the
        # clients) has the other (test_gateway_e2e).
        cores=vllm_core(),
        cpu_kv_blocks=cpu_kv_blocks,
        extra_args=("--scheduler-cls", PLUGIN, "--enforce-eager"),
    )
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        "PYTHONPATH": os.pathsep.join(paths),
        "AGENTMARS_POLICY": policy,
        "AGENTMARS_POLICY_SETTINGS": json.dumps(dict(settings or {})),
        "AGENTMARS_POLICY_MODULES": ",".join(modules),
        "AGENTMARS_KV_STATUS_FILE": str(folder / "kv.json"),
        "AGENTMARS_KV_STATUS_ADDR": f"ipc://{folder / 'kv.sock'}",
        "AGENTMARS_HINTS_ADDR": f"ipc://{folder / 'hints.sock'}",
    }
    with serve_vllm(config, folder / "server.log", env=env) as url:
        yield LinkedEngine(url, folder, config)


@contextlib.contextmanager
def linked_gateway(
    engine: LinkedEngine,
    token: str,
    policy: str,
    *,
    admitting: Policy | None = None,
    **config: Any,
) -> Iterator[tuple[httpx.Client, Gateway]]:
    """A gateway in this process in front of ``engine``, linked to its plugin by the
    side channel (``plugin_kv_address`` / ``plugin_hints_address``, the engine's block
    size), and a client of it; ``admitting``: a policy object for its admission (else
    ``policy`` by name, with ``config``'s ``policy_settings``)."""
    app = create_gateway_app(
        GatewayConfig(
            upstream_url=engine.url,
            token=token,
            policy=policy,
            block_size=CPU_BLOCK_SIZE,
            plugin_kv_address=engine.kv_address,
            plugin_hints_address=engine.hints_address,
            **config,
        ),
        policy=admitting,
    )
    with (
        serve_in_thread(app) as url,
        httpx.Client(base_url=url, timeout=120.0) as client,
    ):
        yield client, app.state.gateway


def post_events(client: httpx.Client, token: str, *events: AnyEvent) -> None:
    """Post events to the gateway as the SDK's ``HttpSink`` does (JSONL, bearer token)."""
    response = client.post(
        "/v1/events",
        content="".join(event.to_json() + "\n" for event in events),
        headers={"authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.text


@dataclass
class Background:
    """A blocking call run on a thread: its result (or error) once it returned."""

    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def join(self, timeout_s: float = 120.0) -> Any:
        assert self.done.wait(timeout_s), "the background call did not return"
        if self.error is not None:
            raise self.error
        return self.result


def in_background(call: Callable[[], Any]) -> Background:
    background = Background()

    def run() -> None:
        try:
            background.result = call()
        except BaseException as error:  # handed to join()
            background.error = error
        finally:
            background.done.set()

    threading.Thread(target=run, daemon=True).start()
    return background


def send_hints(address: str, *events: AnyEvent) -> None:
    """Push events to the plugin as the gateway's side channel does (``PluginLink``)."""
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 5000)
        push.connect(address)
        for event in events:
            push.send(event.to_json().encode())
        push.close()  # lingers until sent
    finally:
        context.term()
