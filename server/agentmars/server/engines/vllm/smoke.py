"""Smoke check of vLLM CPU with the tiny model, with the timings the cpu-tiny profile needs.

Starts a server (``launch.serve_vllm``), checks that a completion and a chat
completion answer with exactly the tokens asked for, times a 10K-token prefill
cold and again with a prefix-cache hit (read back from ``vllm:prefix_cache_hits``),
stops the server and checks that none of its processes is left::

    python -m agentmars.server.engines.vllm.smoke [--cores 0] [--json out.json]

Run it with the vLLM environment's python (defaults: that python and the cached
tiny model), or with any python given ``--python`` and ``--model``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentmars.server.engines.vllm.launch import VllmServerConfig, serve_vllm
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model
from agentmars.server.web.serving import live_group_members

PREFILL_TOKENS = 10_000
#: Token ids below this are the tokenizer's special tokens (<s>, </s>, <pad>).
FIRST_PLAIN_TOKEN = 3
SHORT_OUTPUT_TOKENS = 8
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SmokeReport:
    """What one smoke run measured (seconds are wall-clock request latencies)."""

    startup_s: float
    #: A short prompt, 8 tokens out (``ignore_eos``).
    completion_s: float
    chat_s: float
    #: The server's first 10K-token prompt, 1 token out: includes any first-use warm-up.
    prefill_first_s: float
    #: Another 10K-token prompt sharing no prefix with the first.
    prefill_cold_s: float
    #: The second prompt again: all its full KV blocks hit the prefix cache.
    prefill_hit_s: float
    #: Tokens ``vllm:prefix_cache_hits`` counted for that repeat.
    prefix_hit_tokens: int
    #: Server processes still alive after the stop (should be none).
    leftover_pids: tuple[int, ...]


class SmokeError(RuntimeError):
    """The server answered, but not as it should."""


def metric_total(exposition: str, name: str) -> float:
    """Sum of the samples of counter ``name`` in Prometheus text (``name`` or ``name_total``,
    any labels; ``_created`` timestamps are not samples of it)."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        sample, _, value = line.rpartition(" ")
        metric = sample.split("{", 1)[0]
        if metric in (name, f"{name}_total"):
            total += float(value)
    return total


def random_prompt(num_tokens: int, vocab_size: int, seed: int) -> list[int]:
    """``num_tokens`` seeded token ids, none of them a special token."""
    rng = random.Random(seed)
    return [rng.randrange(FIRST_PLAIN_TOKEN, vocab_size) for _ in range(num_tokens)]


def model_vocab_size(model: Path) -> int:
    """``vocab_size`` from the model directory's ``config.json``."""
    try:
        return int(json.loads((model / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError) as error:
        raise SmokeError(f"{model}/config.json has no readable vocab_size: {error}") from None


def server_pid(port: int) -> int:
    """The pid of the vLLM API server listening on ``port`` (found by its command line)."""
    wanted = ["vllm.entrypoints.openai.api_server", "--port", str(port)]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if all(part in argv for part in wanted):
            return int(cmdline.parent.name)
    raise SmokeError(f"no vLLM API server process found for port {port}")


def run_smoke(config: VllmServerConfig, log_path: Path, vocab_size: int) -> SmokeReport:
    """Start the server, check and time it, stop it; see the module docstring."""
    started = time.perf_counter()
    with (
        serve_vllm(config, log_path) as base_url,
        httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client,
    ):
        startup_s = time.perf_counter() - started
        pgid = server_pid(int(base_url.rsplit(":", 1)[1]))
        timings = _check_and_time(client, config.served_model_name, vocab_size)
    return SmokeReport(
        startup_s=startup_s, leftover_pids=tuple(live_group_members(pgid)), **timings
    )


def _check_and_time(client: httpx.Client, model: str, vocab_size: int) -> dict[str, Any]:
    completion_s = _timed(lambda: _complete(client, model, "hello world", SHORT_OUTPUT_TOKENS))
    chat_s = _timed(lambda: _chat(client, model))
    first, second = (random_prompt(PREFILL_TOKENS, vocab_size, seed) for seed in (1, 2))
    prefill_first_s = _timed(lambda: _complete(client, model, first, 1))
    prefill_cold_s = _timed(lambda: _complete(client, model, second, 1))
    hits_before = _prefix_cache_hits(client)
    prefill_hit_s = _timed(lambda: _complete(client, model, second, 1))
    return {
        "completion_s": completion_s,
        "chat_s": chat_s,
        "prefill_first_s": prefill_first_s,
        "prefill_cold_s": prefill_cold_s,
        "prefill_hit_s": prefill_hit_s,
        "prefix_hit_tokens": int(_prefix_cache_hits(client) - hits_before),
    }


def _timed(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _complete(client: httpx.Client, model: str, prompt: str | list[int], max_tokens: int) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    reply = _post(client, "/v1/completions", body)
    _expect_output_tokens(reply, max_tokens)


def _chat(client: httpx.Client, model: str) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "list the files"}],
        "max_tokens": SHORT_OUTPUT_TOKENS,
        "ignore_eos": True,
    }
    reply = _post(client, "/v1/chat/completions", body)
    if not isinstance(reply["choices"][0]["message"]["content"], str):
        raise SmokeError(f"chat completion without text content: {reply}")
    _expect_output_tokens(reply, SHORT_OUTPUT_TOKENS)


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    if response.status_code != 200:
        raise SmokeError(f"POST {path} answered {response.status_code}: {response.text[:500]}")
    reply: dict[str, Any] = response.json()
    return reply


def _expect_output_tokens(reply: dict[str, Any], expected: int) -> None:
    got = reply["usage"]["completion_tokens"]
    if got != expected:
        raise SmokeError(f"asked for {expected} output tokens (ignore_eos), got {got}")


def _prefix_cache_hits(client: httpx.Client) -> float:
    response = client.get("/metrics")
    response.raise_for_status()
    return metric_total(response.text, "vllm:prefix_cache_hits")


def _print_report(report: SmokeReport) -> None:
    for name, value in dataclasses.asdict(report).items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{name:>18}  {shown}")


def main(argv: list[str] | None = None) -> int:
    """CLI: run the smoke check, print the timings; exit 1 if a check fails."""
    parser = argparse.ArgumentParser(
        prog="python -m agentmars.server.engines.vllm.smoke",
        description="Start vLLM CPU with the tiny model, check it answers, time it, stop it.",
    )
    parser.add_argument("--python", type=Path, default=Path(sys.executable))
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--cores", help="CPU list for the server, e.g. 0 (default: vLLM's)")
    parser.add_argument("--log", type=Path, help="server log (default: a temporary file)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    log_path = args.log or Path(tempfile.mkstemp(prefix="vllm-smoke-", suffix=".log")[1])
    try:
        config = VllmServerConfig(
            python=args.python, model=args.model or ensure_tiny_model(), cores=args.cores
        )
        print(f"server log: {log_path}", file=sys.stderr, flush=True)
        report = run_smoke(config, log_path, model_vocab_size(config.model))
    except (RuntimeError, httpx.HTTPError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    _print_report(report)
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")
    if report.leftover_pids:
        print(f"error: server processes left running: {report.leftover_pids}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
