"""A loopback OpenAI-compatible server that paces its tokens like a batching engine.

A miniature of vLLM's continuous batching: each step decodes every running stream by
one token and fills the rest of a token budget with prompt chunks (first come, first
served), and lasts exactly what a ``FittedCost`` of known coefficients says. Sleeping
out the step *is* the modelled work; ``agentmars calibrate`` measured against it must
recover the coefficients. Run as a script for a subprocess server (own GIL, steadier
timing)::

    python paced_engine.py --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from agentmars.server.sim.cost_model import (
    EngineLimits,
    FittedCost,
    StepShape,
    chunk_attention,
    fitted_step_time,
)

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


@dataclass(eq=False)
class _Request:
    prompt_tokens: int
    max_tokens: int
    computed: int = 0
    outputs: int = 0
    tokens: asyncio.Queue[bool] = field(default_factory=asyncio.Queue)
    """True per token; False after the last."""


class PacedEngine:
    """Steps over the admitted requests, paced by ``cost``."""

    def __init__(self, cost: FittedCost, engine: EngineLimits) -> None:
        self.step_time = fitted_step_time(cost)
        self.engine = engine
        self.running: list[_Request] = []
        self.work = asyncio.Event()

    def submit(self, request: _Request) -> None:
        self.running.append(request)
        self.work.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.running:
                self.work.clear()
                await self.work.wait()
            started = loop.time()
            batch, shape = self._schedule()
            await asyncio.sleep(max(0.0, started + self.step_time(shape) - loop.time()))
            self._finish(batch)

    def _schedule(self) -> tuple[list[tuple[_Request, int]], StepShape]:
        budget = self.engine.max_num_batched_tokens
        batch: list[tuple[_Request, int]] = []
        prefill = attention = seqs = context = 0
        for request in self.running[: self.engine.max_num_seqs]:
            if request.computed >= request.prompt_tokens and budget > 0:
                batch.append((request, 1))
                seqs += 1
                context += request.prompt_tokens + request.outputs
                budget -= 1
        for request in self.running[: self.engine.max_num_seqs]:
            if request.computed < request.prompt_tokens and budget > 0:
                chunk = min(budget, request.prompt_tokens - request.computed)
                batch.append((request, chunk))
                prefill += chunk
                attention += chunk_attention(chunk, request.computed)
                budget -= chunk
        return batch, StepShape(prefill, attention, seqs, context)

    def _finish(self, batch: list[tuple[_Request, int]]) -> None:
        for request, tokens in batch:
            if request.computed < request.prompt_tokens:
                request.computed += tokens
                if request.computed < request.prompt_tokens:
                    continue
            request.outputs += 1
            request.tokens.put_nowait(True)
            if request.outputs == request.max_tokens:
                request.tokens.put_nowait(False)
                self.running.remove(request)


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _stream(request: _Request, created: int) -> AsyncIterator[str]:
    sent = 0
    while await request.tokens.get():
        sent += 1
        finish = "length" if sent == request.max_tokens else None
        choice = {"index": 0, "text": f"t{sent} ", "finish_reason": finish}
        yield _sse({"id": "cmpl-paced", "object": "text_completion", "created": created,
                    "model": MODEL, "choices": [choice]})  # fmt: skip
    usage = {"prompt_tokens": request.prompt_tokens, "completion_tokens": sent,
             "total_tokens": request.prompt_tokens + sent}  # fmt: skip
    yield _sse({"id": "cmpl-paced", "object": "text_completion", "created": created,
                "model": MODEL, "choices": [], "usage": usage})  # fmt: skip
    yield "data: [DONE]\n\n"


def create_app(cost: FittedCost = COST, engine: EngineLimits = ENGINE) -> FastAPI:
    paced = PacedEngine(cost, engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(paced.run())
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": MODEL, "object": "model", "max_model_len": engine.max_model_len}
        return {"object": "list", "data": [entry]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        labels = f'block_size="{engine.block_size}",num_gpu_blocks="{engine.num_gpu_blocks}"'
        return PlainTextResponse(f"vllm:cache_config_info{{{labels}}} 1.0\n")

    @app.post("/v1/completions")
    async def completions(http: Request) -> StreamingResponse:
        body = await http.json()
        prompt = body.get("prompt")
        if body.get("model") != MODEL or not isinstance(prompt, list) or not body.get("stream"):
            raise HTTPException(400, "expects a streamed token-id prompt for " + MODEL)
        request = _Request(len(prompt), int(body["max_tokens"]))
        paced.submit(request)
        return StreamingResponse(_stream(request, int(time.time())), media_type="text/event-stream")

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    uvicorn.run(create_app(), host="127.0.0.1", port=port, log_level="warning")
