"""Twin engine replicas on Ray Serve behind the session-affinity router
(docs/ray-serve.md).

Two deployments, as Ray Serve LLM has (its OpenAI ingress in front of the LLM server
whose handle carries the request router):

- ``Ingress`` (HTTP, on Ray Serve's proxy at 127.0.0.1): reads each OpenAI-style call
  whole and hands it as an ``EngineRequest`` to the engine deployment's handle. It is
  there because the router sees the arguments of a handle call, and an HTTP request's
  body reaches a replica only after routing (Ray's proxy streams it).
- ``TwinReplica`` (``--replicas`` of them): the wall-clock twin (``create_live_app``
  on the ``cpu-tiny`` profile with a small KV pool) under the policy's engine half,
  answering ``EngineRequest`` in-process and its KV figures to
  ``record_routing_stats``. Each answer names the replica in ``x-agentmars-replica``.

    python -m agentmars.server.routing.ray_serve --replicas 2 --policy mori

starts a local Ray cluster (no dashboard), deploys, and serves
``POST /v1/completions`` and ``/v1/chat/completions`` on ``--port`` until interrupted.
Answers are whole: a call asking for ``stream`` is refused (400). NOTE: ours — one
ingress replica: the router's affinity lives in the process that holds the handle, so
several ingress replicas would each place sessions on their own.

Needs Ray (scripts/ray-env.sh); type-checked without it as ``ray_router`` is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from typing import Any

import httpx
from ray import serve  # type: ignore[import-not-found, unused-ignore]
from ray.serve.config import RequestRouterConfig  # type: ignore[import-not-found, unused-ignore]
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.policies.registry import make_policy
from agentmars.server.profiles.cost_model import Profile, load_profile
from agentmars.server.routing.affinity import EngineRequest, routing_stats
from agentmars.server.routing.ray_router import DEFAULT_POLICY, SessionAffinityRouter

PROFILE = "cpu-tiny"
GPU_BLOCKS = 64
"""KV blocks of each twin replica (of ``PROFILE``'s 128 tokens): a small pool, so that
where sessions go shows in its figures."""
STATS_PERIOD_S = 0.5
"""How often Ray Serve asks each replica for its KV figures (its default is 10 s)."""
REPLICA_HEADER = "x-agentmars-replica"
FORWARDED = ("content-type", "x-session-id", "traceparent")
"""The headers the twin reads, forwarded with the body (not the proxy's own)."""


def twin_profile(gpu_blocks: int = GPU_BLOCKS) -> Profile:
    """``PROFILE`` with ``gpu_blocks`` KV blocks (its context cut to fit them)."""
    profile = load_profile(PROFILE)
    context = min(profile.max_model_len, gpu_blocks * profile.block_size)
    return profile.model_copy(update={"num_gpu_blocks": gpu_blocks, "max_model_len": context})


class TwinReplica:
    """One twin engine, its API served in-process (module docstring)."""

    def __init__(self, policy: str, gpu_blocks: int) -> None:
        self.engine = LiveEngine(twin_profile(gpu_blocks), make_policy(policy))
        self.app = create_live_app(self.engine)
        self.name = serve.get_replica_context().replica_id.unique_id
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self._client: httpx.AsyncClient | None = None

    async def _started(self) -> httpx.AsyncClient:
        """The twin's step loop runs (its app's lifespan, entered once, on the loop that
        serves the calls)."""
        if self._client is None:
            self._lifespan = self.app.router.lifespan_context(self.app)
            await self._lifespan.__aenter__()
            transport = httpx.ASGITransport(app=self.app)
            self._client = httpx.AsyncClient(transport=transport, base_url="http://twin")
        return self._client

    async def __call__(self, request: EngineRequest) -> tuple[int, str, bytes, str]:
        """The twin's answer: status, content type, body, and this replica's id."""
        client = await self._started()
        headers = {name: value for name, value in request.headers.items() if name in FORWARDED}
        answer = await client.post(
            request.path, content=json.dumps(request.body).encode(), headers=headers
        )
        content_type = answer.headers.get("content-type", "application/json")
        return answer.status_code, content_type, answer.content, self.name

    async def record_routing_stats(self) -> dict[str, Any]:
        """Polled by Ray Serve for the router (``affinity.routing_stats``)."""
        await self._started()
        return routing_stats(self.engine.kv_stats(), self.engine.active_sessions)

    async def __del__(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._lifespan is not None:
            await self._lifespan.__aexit__(None, None, None)


class Ingress:
    """OpenAI-style calls over HTTP, handed to the twin replicas' handle."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if request.method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return _error(404, f"no route {request.method} {path}")
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        if body.get("stream"):
            return _error(400, "streamed answers are not served through the Ray router")
        headers = {name.lower(): value for name, value in request.headers.items()}
        status, content_type, content, replica = await self.engine.remote(
            EngineRequest(path, headers, body)
        )
        return Response(
            content, status_code=status, media_type=content_type, headers={REPLICA_HEADER: replica}
        )


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}},
        status_code=status,
    )


def build_app(replicas: int = 2, policy: str = DEFAULT_POLICY, gpu_blocks: int = GPU_BLOCKS) -> Any:
    """The application: the ingress over ``replicas`` twins behind the router."""
    router = RequestRouterConfig(
        request_router_class=SessionAffinityRouter,
        request_router_kwargs={"policy": policy, "block_size": twin_profile().block_size},
        request_routing_stats_period_s=STATS_PERIOD_S,
    )
    twins = serve.deployment(
        TwinReplica,
        num_replicas=replicas,
        request_router_config=router,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=64,
    )
    ingress = serve.deployment(Ingress, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
    return ingress.bind(twins.bind(policy, gpu_blocks))


def start_ray(num_cpus: int = 2, object_store_mb: int = 100, temp_dir: str | None = None) -> None:
    """A local Ray cluster without the dashboard (``temp_dir``: where its sessions,
    logs and sockets go; Ray's default /tmp/ray). NOTE: Ray's own servers (GCS,
    raylet, workers, the per-node agent) listen on every interface whatever
    ``_node_ip_address`` says (Ray turns a loopback address into the node's routable
    one, ``services.resolve_ip_for_localhost``), behind Ray's token authentication
    (on by default in 2.60); only the HTTP proxy is bound to 127.0.0.1 (``deploy``)."""
    import ray  # type: ignore[import-not-found, unused-ignore]

    ray.init(
        num_cpus=num_cpus,
        object_store_memory=object_store_mb * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
    )


def deploy(port: int, replicas: int, policy: str, gpu_blocks: int = GPU_BLOCKS) -> str:
    """Serve the application on Ray Serve's proxy at 127.0.0.1:``port``; its URL."""
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(replicas, policy, gpu_blocks), name="agentmars", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def stop_ray() -> None:
    import ray  # type: ignore[import-not-found, unused-ignore]

    with contextlib.suppress(Exception):
        serve.shutdown()
    ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--gpu-blocks", type=int, default=GPU_BLOCKS)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args(argv)
    start_ray(args.num_cpus)
    try:
        url = deploy(args.port, args.replicas, args.policy, args.gpu_blocks)
        print(f"serving {args.replicas} twin replicas under {args.policy} at {url}", flush=True)
        asyncio.run(_until_interrupted())
    finally:
        stop_ray()


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


if __name__ == "__main__":
    main()
