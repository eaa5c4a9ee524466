"""Session affinity with the agentmars policy's placement as a Ray Serve request router
(``ray.serve.request_router.RequestRouter``, the API of Ray Serve LLM's
``PrefixCacheAffinityRouter``; docs/ray-serve.md).

A deployment names it with
``request_router_config=RequestRouterConfig(request_router_class=SessionAffinityRouter,
request_router_kwargs={"policy": "mori", "block_size": ...})``; Ray Serve builds one in
every process that holds a handle to the deployment and calls its ``choose_replicas``
for each request. The request is an ``affinity.EngineRequest`` (the first positional
argument): the route, the headers and the JSON body, read for the session as the
gateway reads them (``X-Session-ID``, ``session_id``, ``vllm_xargs.session_id``...).
Which replica a session goes to is ``affinity.SessionPlacer``'s: the policy's
``admit`` and ``place`` for its first call, the same replica after while it is alive.
The replicas' KV figures come from their ``record_routing_stats`` (``routing_stats``),
which Ray Serve polls every ``request_routing_stats_period_s`` and hands the router as
``RunningReplica.routing_stats``.

Needs Ray (the env of scripts/ray-env.sh). NOTE: ours — the main env has no Ray, so
for its type check the Ray imports carry ``import-not-found`` ignores (unused where
Ray is installed, hence ``unused-ignore``) and the class subclasses what is ``Any``
there (``misc``).
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import (  # type: ignore[import-not-found, unused-ignore]
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from agentmars.server.gateway.call_meta import CallMeta
from agentmars.server.routing.affinity import EngineRequest, SessionPlacer

DEFAULT_POLICY = "mori"


def _request_of(pending: PendingRequest | None) -> EngineRequest | None:
    if pending is None:
        return None
    return next((arg for arg in pending.args if isinstance(arg, EngineRequest)), None)


class SessionAffinityRouter(RequestRouter):  # type: ignore[misc, unused-ignore]
    """Each session on one replica, placed by the policy (module docstring)."""

    def initialize_state(self, policy: str = DEFAULT_POLICY, block_size: int = 16) -> None:
        """Called by Ray Serve with ``request_router_kwargs``."""
        self.placer = SessionPlacer(policy, block_size=block_size)
        self._asking: dict[str, CallMeta] = {}
        """Ray's internal request id -> the call, from its first ``choose_replicas``
        until it is routed (read once: a call that names no session gets a fresh one
        each time ``call_metadata`` reads it)."""
        self._calls: dict[str, CallMeta] = {}
        """Ray's internal request id -> the call routed, until it completes."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """One rank with the session's replica; none while the policy holds a new
        session (Ray Serve asks again after its backoff). A request that is not an
        engine call, or whose session cannot be read, may go to any replica."""
        meta = self._meta(pending_request)
        if meta is None or pending_request is None:
            return [candidate_replicas]
        # Retry after Ray's backoff, not at once, when no replica is given or the one
        # given is full (``max_ongoing_requests``).
        pending_request.routing_context.should_backoff = True
        replicas = sorted(candidate_replicas, key=lambda replica: replica.replica_id.unique_id)
        key = self.placer.choose(
            meta, [(replica.replica_id.unique_id, replica.routing_stats) for replica in replicas]
        )
        return [[replica for replica in replicas if replica.replica_id.unique_id == key]]

    def _meta(self, pending: PendingRequest | None) -> CallMeta | None:
        request = _request_of(pending)
        if pending is None or request is None:
            return None
        request_id = pending.metadata.internal_request_id
        meta = self._asking.get(request_id)
        if meta is None:
            meta = request.meta()
            if meta is not None:
                self._asking[request_id] = meta
        return meta

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        request_id = pending_request.metadata.internal_request_id
        meta = self._asking.pop(request_id, None)
        if meta is not None:
            self._calls[request_id] = meta

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        meta = self._calls.pop(internal_request_id, None)
        if meta is not None:
            self.placer.call_ended(meta)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.placer.forget(replica_id.unique_id)
