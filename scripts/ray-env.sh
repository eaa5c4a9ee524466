#!/usr/bin/env bash
# The Ray Serve environment (Python 3.12, requirements/ray.txt), built and cached by
# scripts/locked-env.sh; prints its python's path as the last line of stdout. It runs
# the session-affinity request router over twin replicas (docs/ray-serve.md).
#   scripts/ray-env.sh          # env from requirements/ray.lock (exact versions)
#   scripts/ray-env.sh --lock   # re-resolve requirements/ray.txt into ray.lock
set -euo pipefail
name=ray
want=3.12
# What the env must import: Ray Serve's request-router API, the twin the replicas
# wrap, and the router of this clone.
imports="import ray, ray.serve; from ray.serve.request_router import RequestRouter; \
import agentmars.server.engines.twin.app, agentmars.server.routing.ray_router"
unwanted=()
source "$(dirname "$0")/locked-env.sh"
reqs=$root/requirements/ray.txt lock=$root/requirements/ray.lock
locked_env_main "$@"
