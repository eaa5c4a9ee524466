"""Run by ``test_ray_router.py`` with the Ray env's python (not collected by pytest):
a local Ray cluster, two twin replicas behind ``SessionAffinityRouter``, several
sessions' calls interleaved; prints which replica answered each call (one line after
``RESULT``), then shuts Ray down.

    python tests/server/routing/ray_driver.py TEMP_DIR PORT POLICY SESSIONS TURNS
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx

from agentmars.server.routing.ray_serve import REPLICA_HEADER, deploy, start_ray, stop_ray

RESULT = "ray-driver result: "
"""Marks the result line among what Ray prints on stdout."""


async def _calls(url: str, sessions: int, turns: int) -> dict[str, list[str]]:
    """Turn after turn, every session's call of that turn at once (interleaved)."""
    seen: dict[str, list[str]] = {f"s{i}": [] for i in range(sessions)}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def call(session: str, turn: int) -> None:
            # Prompts of different sizes, so that the KV room differs between replicas.
            prompt = f"turn {turn} of {session}: " + "tokens " * (40 * (1 + int(session[1:])))
            answer = await client.post(
                "/v1/completions",
                headers={"X-Session-ID": session},
                json={"prompt": prompt, "max_tokens": 4},
            )
            answer.raise_for_status()
            assert answer.json()["choices"], answer.text
            seen[session].append(answer.headers[REPLICA_HEADER])

        for turn in range(turns):
            await asyncio.gather(*(call(session, turn) for session in seen))
    return seen


def main() -> None:
    temp_dir, port, policy, sessions, turns = sys.argv[1:]
    start_ray(num_cpus=2, object_store_mb=80, temp_dir=temp_dir)
    try:
        url = deploy(int(port), replicas=2, policy=policy)
        seen = asyncio.run(_calls(url, int(sessions), int(turns)))
        print(RESULT + json.dumps(seen), flush=True)
    finally:
        stop_ray()


if __name__ == "__main__":
    main()
