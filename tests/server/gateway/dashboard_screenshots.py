"""Screenshots of the dashboard during a real replay, for docs/observability.md:

    .venv/bin/python -m tests.server.gateway.dashboard_screenshots --out docs/observability

runs ``agentmars bench replay --engine twin`` (replay agents through the SDK and the
gateway, their tools in the sandbox pool, each policy served in turn), opens each
policy's gateway's ``/dashboard`` in headless chromium as soon as the gateway is up, and
takes the page once the run is ``--at`` of its LLM calls through (then the charts hold
the run so far). One PNG per policy: ``dashboard-<policy>.png``."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Browser, Page, expect

from agentmars.bench.replay import ReplayPlan
from agentmars.bench.session_mix import TOKEN
from tests.server.gateway.browser import chromium, shown

GATEWAY_LINE = re.compile(r"agentmars: gateway on (http://\S+?),")
"""How ``agentmars serve`` names its gateway on its first line."""
NUM_BLOCKS = 48
"""The twin's KV blocks: few enough that the sessions fill them (and a window)."""


def _plan(policies: list[str]) -> ReplayPlan:
    """The replay: enough sessions to fill the window and the KV blocks."""
    return ReplayPlan(sessions=16, rate=0.5, max_turns=6, seed=1, policies=tuple(policies))


def _bench_replay(plan: ReplayPlan, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "agentmars.cli.main", "bench", "replay", "--engine", "twin",
        f"--policies={','.join(plan.policies)}", f"--sessions={plan.sessions}",
        f"--rate={plan.rate}", f"--max-turns={plan.max_turns}", f"--seed={plan.seed}",
        f"--workload={plan.workload}", f"--max-context={plan.max_context}",
        f"--tool-scale={plan.tool_scale}", f"--num-blocks={NUM_BLOCKS}", f"--out={out}",
    ]  # fmt: skip


def _calls(plan: ReplayPlan) -> int:
    """The LLM calls of one policy's replay (the workload's turns)."""
    return sum(len(session.turns) for session in plan.workload_of().sessions)


@contextlib.contextmanager
def _running(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in its own process group; the group stopped if the block fails."""
    with log.open("wb") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=output, start_new_session=True)
    try:
        yield process
    except BaseException:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        raise


def _gateway_of(serve_log: Path, process: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The URL of the gateway ``agentmars serve`` names in ``serve_log``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"bench replay exited with {process.returncode}")
        text = serve_log.read_text(errors="replace") if serve_log.exists() else ""
        if match := GATEWAY_LINE.search(text):
            return match.group(1)
        time.sleep(0.2)
    raise RuntimeError(f"no gateway named in {serve_log} within {timeout_s:.0f} s")


def _take(browser: Browser, gateway: str, calls: int, at: float, png: Path) -> None:
    page: Page = browser.new_page(viewport={"width": 1280, "height": 980})
    try:
        page.goto(f"{gateway}/dashboard#token={TOKEN}")
        expect(page.locator("#status")).to_have_attribute("data-state", "live", timeout=60_000)
        page.wait_for_function(
            f"""() => Number(document.querySelector('[data-field="llm_calls.ok"]')
                .textContent) >= {int(calls * at)}""",
            timeout=600_000,
        )
        page.screenshot(path=png, full_page=True)
        print(f"{png}: {shown(page)}")
    finally:
        page.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/observability"))
    parser.add_argument("--policies", default="mars,fcfs")
    parser.add_argument("--at", type=float, default=0.6, help="share of the calls done")
    args = parser.parse_args()
    plan = _plan(args.policies.split(","))
    calls = _calls(plan)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentmars-dashboard-") as work:
        run = Path(work)
        argv = _bench_replay(plan, run / "replay")
        with _running(argv, run / "bench.log") as process, chromium() as browser:
            for policy in plan.policies:
                serve_log = run / "replay" / "logs" / f"serve-twin-{policy}.log"
                gateway = _gateway_of(serve_log, process, timeout_s=300)
                _take(browser, gateway, calls, args.at, args.out / f"dashboard-{policy}.png")
            if process.wait(900) != 0:
                raise RuntimeError((run / "bench.log").read_text(errors="replace")[-3000:])


if __name__ == "__main__":
    main()
