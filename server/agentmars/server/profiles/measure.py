"""Measure a running vLLM (OpenAI-compatible) server for ``agentmars calibrate``.

Probes stream ``/v1/completions`` with token-id prompts, ``ignore_eos`` and a fixed
``max_tokens``, and record when each token arrives (``calibrate`` turns the timings
into equations). Every prompt is fresh random token ids, so no probe reuses another's
prefix-cache blocks. The probes are designed to fit in the server's KV cache: a
preemption would put recompute time into the timings.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agentmars.server.profiles.calibrate import (
    ProbeKind,
    ProbeRecord,
    Recording,
    StreamRecord,
)
from agentmars.server.profiles.cost_model import EngineLimits

REQUEST_TIMEOUT_S = 600.0
FIRST_PLAIN_TOKEN = 3
CACHE_CONFIG_METRIC = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


class CalibrationError(RuntimeError):
    """The server cannot be measured; the message says why."""


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """One probe to run: the prompt length and output length of each stream. For
    ``mixed``, the last stream is sent once every other stream has ``inject_after``
    tokens."""

    kind: ProbeKind
    prompt_tokens: tuple[int, ...]
    max_tokens: tuple[int, ...]
    inject_after: int = 0


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the server tells about itself (None: it does not say)."""

    max_model_len: int | None
    block_size: int | None
    num_gpu_blocks: int | None


# --- the probe grid ---------------------------------------------------------------------


def _powers_of_two(low: int, high: int) -> list[int]:
    values, value = [], low
    while value <= high:
        values.append(value)
        value *= 2
    return values


def design_probes(engine: EngineLimits, repeats: int = 2, quick: bool = False) -> list[ProbePlan]:
    """Probes spanning the engine's limits; the grid is run ``repeats`` times.

    Prefill lengths double from 64 up to the longest prompt that fits (so some are
    chunked and attention grows large); single-stream decodes at short and long
    contexts; batches of 2 up to ``max_num_seqs`` streams at two prompt lengths; and
    prompts injected into decoding batches, using up to all of a step's budget.
    ``quick`` keeps every prefill length and a few of the others (protocol tests)."""
    budget = engine.max_num_batched_tokens
    kv_tokens = engine.num_gpu_blocks * engine.block_size
    longest = min(engine.max_model_len, kv_tokens) - 64
    if longest < 64:
        raise CalibrationError(f"the server's KV cache ({kv_tokens} tokens) is too small to probe")
    decode_tokens = 24 if quick else 48
    plans: list[ProbePlan] = []
    for length in _powers_of_two(64, longest):
        plans.append(ProbePlan("prefill", (length,), (1,)))
    for context in sorted({64, longest // 4, longest // 2 if not quick else 64}):
        plans.append(ProbePlan("decode", (context,), (decode_tokens,)))
    for prompt in (128,) if quick else (128, 1024):
        for seqs in _powers_of_two(2, engine.max_num_seqs)[: 3 if quick else 6]:
            if seqs * (prompt + decode_tokens) <= kv_tokens:
                plans.append(ProbePlan("batch", (prompt,) * seqs, (decode_tokens,) * seqs))
    batch_prompt = 128
    for seqs in (4,) if quick else (4, 16):
        if seqs > engine.max_num_seqs - 1:
            continue
        for injected in sorted({budget // 8, budget // 2, budget - seqs}):
            need = seqs * (batch_prompt + 2 * decode_tokens) + injected + 1
            if injected < 16 or injected > longest or need > kv_tokens:
                continue
            prompts = (batch_prompt,) * seqs + (injected,)
            outputs = (2 * decode_tokens,) * seqs + (1,)
            plans.append(ProbePlan("mixed", prompts, outputs, inject_after=decode_tokens // 2))
    # A session's next call: its context so far (cached), then an append to prefill.
    for cached in (longest // 4,) if quick else (longest // 4, longest // 2, 3 * longest // 4):
        for append in (128,) if quick else (128, 512, budget):
            if cached + append <= longest and 2 * cached + append + 2 <= kv_tokens:
                plans.append(ProbePlan("resume", (cached, cached + append), (1, 1)))
    # NOTE: the whole grid again per repeat, not each probe `repeats` times in a row: a
    # burst of load from another process then slows one run of several probes, which
    # the robust fit sets aside, rather than every run of one probe.
    return plans * repeats


# --- talking to the server --------------------------------------------------------------


def server_facts(url: str, model: str, timeout_s: float = 10.0) -> ServerFacts:
    """Check that ``url`` is an OpenAI-compatible server serving ``model`` and read what
    it says of its limits (``/v1/models``; vLLM's ``/metrics``)."""
    try:
        with httpx.Client(base_url=url, timeout=timeout_s) as client:
            models = client.get("/v1/models")
            metrics = client.get("/metrics")
    except httpx.HTTPError as exc:
        raise CalibrationError(f"no server answers at {url}: {exc}") from None
    entry = _served_model(url, models, model)
    labels = _cache_config_labels(metrics) if metrics.status_code == 200 else {}
    return ServerFacts(
        max_model_len=_int_or_none(entry.get("max_model_len")),
        block_size=_int_or_none(labels.get("block_size")),
        num_gpu_blocks=_int_or_none(labels.get("num_gpu_blocks")),
    )


def _served_model(url: str, response: httpx.Response, model: str) -> dict[str, Any]:
    try:
        entries = response.json()["data"]
        served = {str(entry["id"]): entry for entry in entries}
    except (ValueError, KeyError, TypeError):
        excerpt = response.text[:200].replace("\n", " ")
        raise CalibrationError(
            f"{url} is not an OpenAI-compatible server: GET /v1/models answered "
            f"{response.status_code} {excerpt!r}"
        ) from None
    if model not in served:
        raise CalibrationError(
            f"{url} does not serve {model!r}; it serves: {', '.join(sorted(served)) or 'nothing'}"
        )
    entry: dict[str, Any] = served[model]
    return entry


def _cache_config_labels(response: httpx.Response) -> dict[str, str]:
    match = CACHE_CONFIG_METRIC.search(response.text)
    return dict(LABEL.findall(match.group("labels"))) if match else {}


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


@dataclass(slots=True)
class _Stream:
    """A stream in flight: its token arrivals so far."""

    prompt: list[int]
    max_tokens: int
    sent_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    token_s: list[float] = field(default_factory=list)
    session: str | None = None
    """Sent as ``X-Session-ID`` (a resume's two calls are one session's, which an
    engine that caches per session, such as the twin, needs)."""

    def record(self) -> StreamRecord:
        # Microseconds are finer than any step; the file stays small.
        return StreamRecord(
            prompt_tokens=self.prompt_tokens or len(self.prompt),
            cached_tokens=self.cached_tokens,
            sent_s=round(self.sent_s, 6),
            token_s=[round(t, 6) for t in self.token_s],
        )


class Prober:
    """Runs probe plans against one server and records their timings."""

    def __init__(
        self, url: str, model: str, *, vocab_size: int, seed: int, block_size: int = 1
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.vocab_size = vocab_size
        self.block_size = block_size
        """For the cached tokens of a server that does not report them."""
        self.random = random.Random(seed)
        self._sessions = itertools.count()

    def prompt(self, tokens: int) -> list[int]:
        """Fresh random token ids (never a cached prefix). Ids below 3 are left out:
        many tokenizers keep them for BOS, EOS and padding."""
        return [self.random.randrange(FIRST_PLAIN_TOKEN, self.vocab_size) for _ in range(tokens)]

    async def run(
        self, plans: Sequence[ProbePlan], on_probe: Callable[[ProbeRecord], None] | None = None
    ) -> list[ProbeRecord]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout, limits=limits) as client:
            await self._probe(client, ProbePlan("decode", (16,), (2,)))  # warm-up, not kept
            records = []
            for plan in plans:
                record = await self._probe(client, plan)
                records.append(record)
                if on_probe:
                    on_probe(record)
        return records

    async def _probe(self, client: httpx.AsyncClient, plan: ProbePlan) -> ProbeRecord:
        streams = [
            _Stream(self.prompt(tokens), outputs)
            for tokens, outputs in zip(plan.prompt_tokens, plan.max_tokens, strict=True)
        ]
        start = time.perf_counter()
        if plan.kind == "resume":
            first, second = streams
            session = f"calibrate-{next(self._sessions)}"
            first.session = second.session = session
            second.prompt = first.prompt + second.prompt[len(first.prompt) :]
            await self._send(client, first, start)
            await self._send(client, second, start, cached_guess=self._cached(first))
            return ProbeRecord(kind=plan.kind, streams=[s.record() for s in streams])
        if plan.kind == "mixed":
            *decoders, injected = streams
            ready = asyncio.Event()

            def all_decoding() -> None:
                if all(len(s.token_s) >= plan.inject_after for s in decoders):
                    ready.set()

            tasks = [self._send(client, s, start, all_decoding) for s in decoders]
            tasks.append(self._send_when(client, injected, start, ready))
        else:
            tasks = [self._send(client, s, start) for s in streams]
        await asyncio.gather(*tasks)
        return ProbeRecord(kind=plan.kind, streams=[s.record() for s in streams])

    async def _send_when(
        self, client: httpx.AsyncClient, stream: _Stream, start: float, ready: asyncio.Event
    ) -> None:
        await ready.wait()
        await self._send(client, stream, start)

    def _cached(self, earlier: _Stream) -> int:
        """The earlier prompt's whole blocks: what a prefix cache holds of it."""
        return len(earlier.prompt) // self.block_size * self.block_size

    async def _send(
        self,
        client: httpx.AsyncClient,
        stream: _Stream,
        start: float,
        after_chunk: Callable[[], None] | None = None,
        *,
        cached_guess: int = 0,
    ) -> None:
        body = {
            "model": self.model,
            "prompt": stream.prompt,
            "max_tokens": stream.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            # vLLM: usage on every chunk, so a token whose text is still empty (a
            # partial character) is counted too.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        headers = {"X-Session-ID": stream.session} if stream.session else {}
        stream.sent_s = time.perf_counter() - start
        try:
            async with client.stream(
                "POST", "/v1/completions", json=body, headers=headers
            ) as response:
                await _check_stream_response(response)
                usage = await _read_tokens(response, stream, start, after_chunk)
        except httpx.HTTPError as exc:
            raise CalibrationError(f"streaming from {self.url} failed: {exc!r}") from None
        _check_counts(stream, usage)
        details = usage.get("prompt_tokens_details") or {}
        reported = details.get("cached_tokens") if isinstance(details, dict) else None
        stream.cached_tokens = reported if isinstance(reported, int) else cached_guess


async def _read_tokens(
    response: httpx.Response,
    stream: _Stream,
    start: float,
    after_chunk: Callable[[], None] | None,
) -> dict[str, Any]:
    """Record each token's arrival; the last usage the server sent."""
    usage: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk = _decode_chunk(payload)
        arrived = time.perf_counter() - start
        tokens = _tokens_in(chunk, len(stream.token_s))
        stream.token_s.extend(arrived for _ in range(tokens))
        usage = chunk.get("usage") or usage
        if after_chunk:
            after_chunk()
    return usage


async def _check_stream_response(response: httpx.Response) -> None:
    if response.status_code != 200:
        text = (await response.aread()).decode(errors="replace")[:300]
        raise CalibrationError(f"POST /v1/completions answered {response.status_code}: {text}")
    kind = response.headers.get("content-type", "")
    if "text/event-stream" not in kind:
        raise CalibrationError(
            f"POST /v1/completions with stream=true answered {kind or 'no content type'}, "
            "not an event stream: not an OpenAI-compatible server"
        )


def _decode_chunk(payload: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except json.JSONDecodeError:
        raise CalibrationError(f"stream chunk is not JSON: {payload[:200]!r}") from None
    if not isinstance(chunk, dict) or ("choices" not in chunk and "error" not in chunk):
        raise CalibrationError(f"stream chunk is not an OpenAI completion chunk: {payload[:200]!r}")
    if "error" in chunk:
        raise CalibrationError(f"the server reported an error: {chunk['error']}")
    return chunk


def _tokens_in(chunk: dict[str, Any], counted: int) -> int:
    """Output tokens a chunk carries: what its running usage adds when it has one (vLLM
    with ``continuous_usage_stats``), else one per choice except a bare end marker."""
    choices = chunk.get("choices") or []
    if not choices:
        return 0
    completion = (chunk.get("usage") or {}).get("completion_tokens")
    if isinstance(completion, int):
        return max(0, completion - counted)
    return sum(1 for c in choices if not (c.get("text") == "" and c.get("finish_reason")))


def _check_counts(stream: _Stream, usage: dict[str, Any]) -> None:
    received = len(stream.token_s)
    expected = usage.get("completion_tokens", stream.max_tokens)
    if received != expected or received != stream.max_tokens:
        raise CalibrationError(
            f"asked for {stream.max_tokens} tokens, received {received} chunks for "
            f"{expected} tokens: the server must stream one chunk per token and honour "
            "ignore_eos"
        )
    stream.prompt_tokens = int(usage.get("prompt_tokens") or len(stream.prompt))


def record(
    url: str,
    model: str,
    engine: EngineLimits,
    plans: Sequence[ProbePlan],
    *,
    vocab_size: int,
    seed: int = 0,
    on_probe: Callable[[ProbeRecord], None] | None = None,
) -> Recording:
    """Run ``plans`` against the server and return the recording."""
    prober = Prober(url, model, vocab_size=vocab_size, seed=seed, block_size=engine.block_size)
    probes = asyncio.run(prober.run(plans, on_probe))
    return Recording(
        url=url,
        model=model,
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        host=host_cpu_description(),
        engine=engine,
        probes=probes,
    )


#: The CPU features that change a CPU engine's speed most (vLLM's CPU backend uses
#: AVX-512 / AMX kernels where present and falls back to oneDNN's AVX2 paths).
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def host_cpu_description(cpuinfo: str | None = None) -> str:
    """This machine's CPU as a profile records it: model, logical CPUs and the SIMD
    features that set a CPU engine's speed. NOTE: the server is measured over
    loopback, so this is its machine too; a profile fitted here is this host's."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown CPU"
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
         if line.startswith("model name")),
        "unknown CPU",
    )  # fmt: skip
    cpus = sum(1 for line in cpuinfo.splitlines() if line.startswith("processor"))
    flags_line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(flags_line.split(":", 1)[-1].split())
    features = [flag for flag in SPEED_FLAGS if flag in flags] or ["no AVX2"]
    return f"{model}, {cpus} logical CPUs, {' '.join(features)}"
