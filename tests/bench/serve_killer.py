"""A real failure of one policy's run in a bench: the ``agentmars serve`` a bench
started for that policy (the gateway and the twin, one process group) killed once the
policy's replay is under way, as an engine that dies mid-run leaves it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import psutil

from agentmars.bench.session_mix import ENGINE_LINE
from agentmars.server.engines.vllm.smoke import metric_total

_T = TypeVar("_T")

POLL_S = 0.02
"""How often the watcher looks for the server and the replay's first call."""


def run_killing(
    command: list[str], policy: str, log_dir: Path, snapshot: Path
) -> tuple[str, str, int | None, ServeKiller]:
    """Run a bench ``command`` (``COLUMNS`` wide enough for its tables) while a
    ``ServeKiller`` kills ``policy``'s server; its output, exit status and the killer."""
    bench = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    killer = ServeKiller(bench.pid, policy, log_dir, snapshot=snapshot)
    killer.start()
    try:
        stdout, stderr = bench.communicate(timeout=280)
    finally:
        if bench.poll() is None:
            bench.kill()
        killer.stop()
    return stdout, stderr, bench.returncode, killer


class ServeKiller(threading.Thread):
    """Watches the bench process ``bench_pid`` for the server it starts for ``policy``
    (its log ``serve-twin-<policy>.log`` in ``log_dir``; with ``run``, that run's
    server, ``serve-twin-<policy>-run<run>.log``); once the engine has answered
    a call after the warm-up (its time-to-first-token count past 1), SIGKILLs the
    server's process group. ``snapshot`` names a file to read at that moment (what the
    bench had written before the run failed)."""

    def __init__(
        self,
        bench_pid: int,
        policy: str,
        log_dir: Path,
        snapshot: Path | None = None,
        *,
        run: int | None = None,
    ) -> None:
        super().__init__(name=f"kill-serve-{policy}", daemon=True)
        self._bench = psutil.Process(bench_pid)
        self._policy = policy
        tag = "" if run is None else f"-run{run}"
        self._log = log_dir / f"serve-twin-{policy}{tag}.log"
        self._snapshot = snapshot
        self._stopped = threading.Event()
        self.killed_pid: int | None = None
        self.snapshot_text: str | None = None
        """``snapshot``'s text when the server was killed (None: no such file)."""

    def stop(self) -> None:
        self._stopped.set()
        self.join()

    def run(self) -> None:
        # The log first: once it names the engine, the server writing it is the one
        # live server of the policy (the bench stops each before it starts the next).
        engine_url = self._wait_for(self._engine_url)
        pid = self._wait_for(self._server_pid)
        if pid is None or engine_url is None:
            return
        with httpx.Client(timeout=2.0) as client:
            if self._wait_for(lambda: self._replay_began(client, engine_url)) is None:
                return
        if self._snapshot is not None and self._snapshot.exists():
            self.snapshot_text = self._snapshot.read_text()
        os.killpg(pid, signal.SIGKILL)  # the server's own group (start_new_session)
        self.killed_pid = pid

    def _wait_for(self, probe: Callable[[], _T | None]) -> _T | None:
        """``probe()``'s first answer that is not None (None: stopped first)."""
        while not self._stopped.is_set():
            found = probe()
            if found is not None:
                return found
            self._stopped.wait(POLL_S)
        return None

    def _server_pid(self) -> int | None:
        try:
            children = self._bench.children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        for child in children:
            try:
                argv = child.cmdline()
            except psutil.Error:
                continue
            policy = argv[argv.index("--policy") + 1 :][:1] if "--policy" in argv else []
            if "serve" in argv and policy == [self._policy]:
                return child.pid
        return None

    def _engine_url(self) -> str | None:
        if not self._log.exists():
            return None
        match = ENGINE_LINE.search(self._log.read_text(errors="replace"))
        return None if match is None else match.group(1).rstrip(",")

    @staticmethod
    def _replay_began(client: httpx.Client, engine_url: str) -> bool | None:
        try:
            text = client.get(engine_url + "/metrics").text
        except httpx.HTTPError:
            return None
        # The warm-up's call is the first; the replay's first is the second.
        calls = metric_total(text, "vllm:time_to_first_token_seconds_count")
        return True if calls >= 2 else None
