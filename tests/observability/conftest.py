"""A real Prometheus server (Debian's ``prometheus``, scripts/apt-packages.txt) scraping
loopback targets: its own process group, configuration and storage under the test's
temporary directory, a free loopback port; stopped (SIGTERM) and checked to exit cleanly
after. A service the Debian package may have started is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentmars.server.web.serving import free_loopback_port

SCRAPE_INTERVAL = "1s"
"""Short, so the test waits a second or two for a scrape, not Prometheus' default 1 min."""
JOB = "agentmars"


def poll(
    probe: Callable[[], Any], timeout_s: float, what: str, until: Callable[[Any], bool] = bool
) -> Any:
    """``probe()``'s first value that passes ``until``, tried until ``timeout_s`` passes
    (the last value seen is in the failure)."""
    deadline = time.monotonic() + timeout_s
    while not until(value := probe()):
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s; last: {value!r}"
        time.sleep(0.2)
    return value


@dataclass(frozen=True)
class Prometheus:
    url: str

    def api(self, path: str, **params: Any) -> Any:
        """The ``data`` of a successful answer of ``/api/v1/<path>``."""
        reply = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = reply.json()
        assert reply.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The vector an instant query answers (a scalar answer fails)."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single sample ``expr`` answers, None while it answers none."""
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None

    def targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return targets

    def label_values(self, label: str, selector: str) -> list[str]:
        """What Grafana's ``label_values(selector, label)`` lists."""
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": selector})
        return values


def _config(targets: Sequence[str]) -> str:
    # JSON is YAML: no YAML writer needed for Prometheus' configuration.
    return json.dumps(
        {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL},
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": list(targets)}]}],
        }
    )


def _ready(url: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    assert process.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
    try:
        return httpx.get(url + "/-/ready", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def running_prometheus(targets: Sequence[str], workdir: Path) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` (``host:port``) every ``SCRAPE_INTERVAL``."""
    binary = shutil.which("prometheus")
    assert binary, "no prometheus: install scripts/apt-packages.txt (make env)"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(_config(targets))
    log = workdir / "prometheus.log"
    url = f"http://127.0.0.1:{free_loopback_port()}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address={url.removeprefix('http://')}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        poll(lambda: _ready(url, process, log), 30, "prometheus ready")
        yield Prometheus(url)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, log.read_text()[-2000:]


StartPrometheus = Callable[[Sequence[str]], Prometheus]


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[StartPrometheus]:
    """``start_prometheus(["127.0.0.1:8080"])``: a Prometheus scraping those targets,
    stopped at teardown."""
    with contextlib.ExitStack() as stack:
        yield lambda targets: stack.enter_context(
            running_prometheus(targets, tmp_path / "prometheus")
        )
