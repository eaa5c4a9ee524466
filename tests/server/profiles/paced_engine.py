"""A loopback OpenAI-compatible server whose steps last what a ``FittedCost`` of known
coefficients says: the wall-clock twin (``engines.twin``) on a profile made of
those coefficients, under FCFS. Sleeping out the step *is* the modelled work;
``agentmars calibrate`` measured against it must recover the coefficients. Run as a
script for a subprocess server (own GIL, steadier timing)::

    python paced_engine.py --port 8000
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

from agentmars.server.engines.twin.app import create_live_app
from agentmars.server.engines.twin.engine import LiveEngine
from agentmars.server.policies.fcfs import FCFS
from agentmars.server.profiles.cost_model import EngineLimits, FittedCost, Profile

MODEL = "paced-tiny"
COST = FittedCost(c0=15e-3, c1=1e-4, c2=4e-8, c3=1.5e-3, c4=8e-6)
ENGINE = EngineLimits(
    block_size=16,
    num_gpu_blocks=1024,
    max_model_len=4096,
    max_num_seqs=32,
    max_num_batched_tokens=1024,
    kv_bytes_per_token=1024,
)


def create_app(cost: FittedCost = COST, engine: EngineLimits = ENGINE) -> FastAPI:
    profile = Profile(
        **engine.model_dump(),
        name=MODEL,
        description="known coefficients for the calibration tests",
        sources=["tests.server.profiles.paced_engine.py"],
        cpu_kv_blocks=0,
        cpu_kv_bandwidth_bytes_s=1.0,
        cost=cost,
    )
    app = create_live_app(LiveEngine(profile, FCFS()), model=MODEL)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    uvicorn.run(create_app(), host="127.0.0.1", port=port, log_level="warning")
