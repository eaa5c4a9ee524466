"""The docker backend.

Three kinds of tests:

- real-engine tests (``test_real_*``): isolation and limits in real containers.
  They skip, saying why, where no Docker engine answers (as on this project's
  machines) and run where one does: ``pytest tests/sandbox/backends/test_docker.py``.
- pure parts, run everywhere: the container specification, output capping, the
  attach-stream framing and stdin half-close over real sockets, exit codes, and
  ``start`` against a real client with nothing listening.
- the execution logic (timeouts, cancels, kills, container lifecycle) over
  ``FakeDockerEngine``, a stand-in client whose execs are local processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import docker.errors
import pytest
from docker.models.containers import _create_container_args

from agentmars.sandbox.backends.base import Job, Slot, Stream
from agentmars.sandbox.backends.docker import (
    KILL_ALL,
    PING_TIMEOUT_S,
    TMPFS_TMP,
    DockerBackend,
    check_workdir,
    container_options,
    engine_warnings,
    exec_environment,
    exec_workdir,
    exit_outcome,
    job_user,
    keeper_user,
    pump_frames,
    read_frames,
    send_stdin,
)
from agentmars.sandbox.backends.output import CappedOutput
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.spec import TRUNCATION_MARKER, ExecResult, ExecSpec, SandboxError

IMAGE = os.environ.get("AGENTMARS_DOCKER_TEST_IMAGE", "python:3.12-slim")
"""The real tests' image: it needs sh, sleep, cat and python3."""


def _frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def _job(workspace: Path, spec: ExecSpec, *, session: str = "s1", cap: int = 1 << 20) -> Job:
    return Job(
        session_id=session,
        workspace=workspace,
        spec=spec,
        timeout_s=spec.timeout_s or 30.0,
        output_cap_bytes=cap,
    )


def _config(tmp_path: Path, **options: Any) -> SandboxConfig:
    return SandboxConfig(
        backend="docker", docker_image=IMAGE, workspace_root=tmp_path / "ws", **options
    )


def _workspace(config: SandboxConfig, session: str) -> Path:
    path = config.workspace_root / session
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


# --- start without an engine (real client) -------------------------------------------


async def test_start_without_an_engine_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = f"unix://{tmp_path / 'nothing-listens.sock'}"
    monkeypatch.setenv("DOCKER_HOST", host)
    backend = DockerBackend()
    began = time.monotonic()
    with pytest.raises(SandboxError) as caught:
        await backend.start(_config(tmp_path), [Slot(0, (0,))])
    message = str(caught.value)
    assert message.startswith(f"no Docker engine answers at {host}: ")
    assert message.endswith("; start dockerd or use the process backend")
    assert time.monotonic() - began < PING_TIMEOUT_S + 5
    await backend.close()  # nothing started: nothing to do


# --- the container specification --------------------------------------------------------


def test_container_options(tmp_path: Path) -> None:
    config = _config(tmp_path, memory_limit_mb=512, pids_limit=64)
    workspace = tmp_path / "ws" / "s-1"
    options = container_options(config, Slot(3, (2, 5)), "s-1", workspace, "pool42")
    assert options == {
        "entrypoint": ["sleep", "infinity"],
        "init": True,
        "user": "65534:65534",
        "cpuset_cpus": "2,5",
        "mem_limit": "512m",
        "memswap_limit": "512m",
        "pids_limit": 64,
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": "rw,exec,nosuid,nodev,size=256m,mode=1777"},
        "volumes": {str(workspace): {"bind": str(workspace), "mode": "rw"}},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "environment": {},
        "labels": {"agentmars.pool": "pool42", "agentmars.slot": "3", "agentmars.session": "s-1"},
    }


def test_container_options_never_carry_the_hosts_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    options = container_options(_config(tmp_path), Slot(0, (0,)), "s", tmp_path, "p")
    assert options["environment"] == {}
    assert "sk-secret" not in repr(options)


def test_the_sdk_turns_the_options_into_the_intended_host_config(tmp_path: Path) -> None:
    # The SDK's own translation (no engine): every option lands where it is meant to.
    workspace = tmp_path / "w"
    options = container_options(_config(tmp_path), Slot(1, (1,)), "s", workspace, "p")
    created = _create_container_args(
        {"image": IMAGE, "command": None, "version": "1.44", **options}
    )
    host = created["host_config"]
    assert host["CpusetCpus"] == "1"
    assert host["Memory"] == host["MemorySwap"] == 2048 * 1024 * 1024
    assert host["PidsLimit"] == 512
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["Tmpfs"] == {"/tmp": TMPFS_TMP}
    assert host["Binds"] == [f"{workspace}:{workspace}:rw"]
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Init"] is True
    assert created["entrypoint"] == ["sleep", "infinity"]
    assert created["user"] == "65534:65534"
    assert created["labels"]["agentmars.slot"] == "1"


def test_commands_run_as_the_workspace_owner_and_never_as_the_keeper(tmp_path: Path) -> None:
    owner = f"{os.getuid()}:{os.getgid()}"
    assert job_user(tmp_path, rootless=False) == owner
    assert job_user(tmp_path, rootless=True) == "0:0"  # the rootless engine's root: the host user
    assert keeper_user(owner) == ("65533:65533" if os.getuid() == 65534 else "65534:65534")
    assert keeper_user("65534:65534") == "65533:65533"


def test_working_directory_and_environment(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "out").symlink_to(tmp_path)
    assert exec_workdir(ws, ".") == str(ws)
    assert exec_workdir(ws, "a/./b/") == f"{ws}/a/b"
    check_workdir(ws, "a/b")
    (ws / "file").write_text("")
    for bad, why in [
        ("missing", "does not exist in the workspace"),
        ("out", "outside the workspace"),  # a link that leaves it
        ("file", "is not a directory"),
    ]:
        with pytest.raises(SandboxError, match=why):
            check_workdir(ws, bad)
    env = exec_environment(ws, {"LANG": "de_DE.UTF-8", "X": "1"})
    assert env == {"HOME": str(ws), "TMPDIR": "/tmp", "LANG": "de_DE.UTF-8", "X": "1"}


def test_engine_warnings_name_the_missing_limits() -> None:
    assert engine_warnings({"CPUSet": True, "MemoryLimit": True, "PidsLimit": True}) == []
    warnings = engine_warnings({"CPUSet": False, "SwapLimit": False})
    assert warnings == [
        "the Docker engine does not support cpusets: slots are not pinned to their cores",
        "the Docker engine does not support swap limits: a container may swap beyond "
        "memory_limit_mb",
    ]


# --- exit codes and output ---------------------------------------------------------------


def test_exit_codes() -> None:
    assert exit_outcome(0) == ("ok", 0, None)
    assert exit_outcome(3) == ("error", 3, None)
    assert exit_outcome(127) == ("error", 127, None)
    status, exit_status, detail = exit_outcome(137)
    assert (status, exit_status) == ("killed", -9) and "memory limit" in (detail or "")
    assert exit_outcome(143)[:2] == ("killed", -15)
    assert exit_outcome(255) == ("error", 255, None)
    assert exit_outcome(None)[:2] == ("killed", None)


def test_frames_are_demultiplexed_however_they_are_split() -> None:
    wire = _frame(1, b"out1") + _frame(2, b"err") + _frame(1, b"") + _frame(1, b"out2")
    pieces = [wire[i : i + 3] for i in range(0, len(wire), 3)]  # headers split too

    def recv(size: int) -> bytes:
        if not pieces:
            return b""
        piece = pieces.pop(0)
        if len(piece) > size:
            pieces.insert(0, piece[size:])
        return piece[:size]

    frames = list(read_frames(recv))
    assert b"".join(d for s, d in frames if s == 1) == b"out1out2"
    assert b"".join(d for s, d in frames if s == 2) == b"err"


def test_pump_caps_each_stream_and_emits_what_is_kept() -> None:
    ours, theirs = socket.socketpair()
    theirs.sendall(_frame(1, b"a" * 10) + _frame(2, b"bb") + _frame(3, b"engine error"))
    theirs.sendall(_frame(1, b"c" * 10))
    theirs.close()
    seen: list[tuple[Stream, bytes]] = []
    stdout = CappedOutput("stdout", 12, lambda stream, data: seen.append((stream, data)))
    stderr = CappedOutput("stderr", 12, lambda stream, data: seen.append((stream, data)))
    pump_frames(ours, stdout, stderr)
    ours.close()
    assert stdout.text() == "a" * 10 + "cc" + TRUNCATION_MARKER.format(dropped=8)
    assert stderr.text() == "bbengine err" + TRUNCATION_MARKER.format(dropped=2)
    assert seen == [
        ("stdout", b"a" * 10),
        ("stderr", b"bb"),
        ("stderr", b"engine err"),
        ("stdout", b"cc"),
    ]


def test_stdin_ends_with_a_half_close_that_keeps_the_output_side_open() -> None:
    ours, theirs = socket.socketpair()
    data = os.urandom(3 << 20)  # larger than the socket buffers: needs a concurrent reader
    received = bytearray()

    def engine() -> None:  # reads the input to its end, then answers on the same socket
        while chunk := theirs.recv(65536):
            received.extend(chunk)
        theirs.sendall(_frame(1, str(len(received)).encode()))
        theirs.close()

    thread = threading.Thread(target=engine)
    thread.start()
    send_stdin(ours, data)
    out, err = CappedOutput("stdout", 100), CappedOutput("stderr", 100)
    pump_frames(ours, out, err)
    thread.join(5)
    ours.close()
    assert bytes(received) == data
    assert out.text() == str(len(data))


def test_stdin_to_a_command_that_does_not_read_it_is_no_error() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    send_stdin(ours, b"x" * (1 << 20))  # EPIPE / reset: swallowed
    ours.close()


# --- execution over a stand-in engine ----------------------------------------------------


def _api_error(status: int, message: str) -> docker.errors.APIError:
    response = SimpleNamespace(status_code=status, reason=message, url="fake://engine")
    return docker.errors.APIError(message, response=response)


@dataclass
class _FakeExec:
    container: str
    command: list[str]
    options: dict[str, Any]
    process: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None


@dataclass
class _FakeContainer:
    options: dict[str, Any]
    running: bool = True
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)


class FakeDockerEngine:  # mock: no Docker engine runs on this machine
    """Just the calls the backend makes. A container is a record; an exec is a local
    process (the workspace has the same path here) whose output is framed as on the
    engine's attach connection; ``kill -9 -1`` kills the container's processes."""

    def __init__(self) -> None:
        self.api = self  # the low-level calls live here too
        self.images = SimpleNamespace(get=lambda image: None)
        self.containers = SimpleNamespace(create=self._create, list=self._list)
        self.made: dict[str, _FakeContainer] = {}
        self.execs: dict[str, _FakeExec] = {}
        self.pinned: list[tuple[str, str]] = []
        self.kills = 0

    def ping(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {"CPUSet": True, "MemoryLimit": True, "SwapLimit": True, "PidsLimit": True}

    def close(self) -> None:
        pass

    def _create(self, image: str, name: str, **options: Any) -> SimpleNamespace:
        container_id = uuid.uuid4().hex
        self.made[container_id] = _FakeContainer(options, running=False)
        return SimpleNamespace(id=container_id)

    def _list(self, all: bool, filters: dict[str, list[str]], sparse: bool) -> list[Any]:
        def matches(box: _FakeContainer) -> bool:
            labels = box.options["labels"]
            return all_labels <= {f"{k}={v}" for k, v in labels.items()}

        all_labels = set(filters["label"])
        return [SimpleNamespace(id=cid) for cid, box in self.made.items() if matches(box)]

    def _box(self, container_id: str) -> _FakeContainer:
        if container_id not in self.made:
            raise docker.errors.NotFound(f"no such container: {container_id}")
        return self.made[container_id]

    def start(self, container_id: str) -> None:
        self._box(container_id).running = True

    def stop(self, container_id: str) -> None:  # for tests: the container dies
        self._kill(self._box(container_id))
        self.made[container_id].running = False

    def remove_container(self, container_id: str, v: bool, force: bool) -> None:
        self._kill(self._box(container_id))
        del self.made[container_id]

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        running = self._box(container_id).running
        return {"State": {"Running": running, "Status": "running" if running else "exited"}}

    def update_container(self, container_id: str, cpuset_cpus: str) -> None:
        self._box(container_id).options["cpuset_cpus"] = cpuset_cpus
        self.pinned.append((container_id, cpuset_cpus))

    def exec_create(self, container_id: str, command: list[str], **options: Any) -> dict[str, str]:
        if not self._box(container_id).running:
            raise _api_error(409, f"container {container_id} is not running")
        exec_id = uuid.uuid4().hex
        self.execs[exec_id] = _FakeExec(container_id, command, options)
        return {"Id": exec_id}

    def exec_start(self, exec_id: str, socket: bool = False) -> Any:
        run = self.execs[exec_id]
        box = self._box(run.container)
        if run.command == KILL_ALL:
            self.kills += 1
            self._kill(box)
            run.exit_code = 0
            return b""
        return self._spawn(run, box)

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        run = self.execs[exec_id]
        if run.process is not None and run.exit_code is None:
            code = run.process.poll()
            if code is None:
                return {"Running": True, "ExitCode": None}
            run.exit_code = code if code >= 0 else 128 - code
        return {"Running": False, "ExitCode": run.exit_code}

    def _spawn(self, run: _FakeExec, box: _FakeContainer) -> socket.socket:
        environment = {"PATH": os.environ["PATH"], **run.options["environment"]}
        process = subprocess.Popen(
            run.command,
            cwd=run.options["workdir"],
            env=environment,
            stdin=subprocess.PIPE if run.options["stdin"] else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        run.process = process
        box.processes.append(process)
        ours, theirs = socket.socketpair()
        lock = threading.Lock()

        def frames(stream: int, pipe: Any) -> None:
            while chunk := os.read(pipe.fileno(), 65536):
                with lock, _suppress_os_error():
                    theirs.sendall(_frame(stream, chunk))

        def feed_stdin() -> None:
            with _suppress_os_error():
                while chunk := theirs.recv(65536):
                    process.stdin.write(chunk)  # type: ignore[union-attr]
                process.stdin.close()  # type: ignore[union-attr]

        def serve() -> None:
            outputs = [
                threading.Thread(target=frames, args=(1, process.stdout)),
                threading.Thread(target=frames, args=(2, process.stderr)),
            ]
            for thread in outputs:
                thread.start()
            for thread in outputs:
                thread.join()
            theirs.close()

        if run.options["stdin"]:
            threading.Thread(target=feed_stdin, daemon=True).start()
        threading.Thread(target=serve, daemon=True).start()
        return ours

    @staticmethod
    def _kill(box: _FakeContainer) -> None:
        for process in box.processes:
            if process.poll() is None:
                with _suppress_os_error():
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def live_processes(self) -> int:
        return sum(p.poll() is None for b in self.made.values() for p in b.processes)


def _suppress_os_error() -> contextlib.suppress:
    return contextlib.suppress(OSError, ValueError)  # a closed socket or pipe


@dataclass
class Harness:
    engine: FakeDockerEngine
    backend: DockerBackend
    config: SandboxConfig
    slots: list[Slot]

    async def run(
        self,
        spec: ExecSpec,
        *,
        slot: int = 0,
        session: str = "s1",
        cap: int = 1 << 20,
        cancel: asyncio.Event | None = None,
        on_output: Callable[[Stream, bytes], None] | None = None,
    ) -> ExecResult:
        job = _job(_workspace(self.config, session), spec, session=session, cap=cap)
        return await self.backend.execute(
            self.slots[slot], job, cancel=cancel or asyncio.Event(), on_output=on_output
        )


@pytest.fixture
async def make_harness(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    harnesses: list[Harness] = []

    async def make(**options: Any) -> Harness:
        engine = FakeDockerEngine()
        config = _config(tmp_path, **options)
        slots = [Slot(0, (0,)), Slot(1, (1,))]
        backend = DockerBackend(client=engine)
        assert await backend.start(config, slots) == []
        harnesses.append(Harness(engine, backend, config, slots))
        return harnesses[-1]

    yield make
    for harness in harnesses:
        await harness.backend.close()
        assert harness.engine.live_processes() == 0


def _sh(script: str, **spec: Any) -> ExecSpec:
    return ExecSpec(command=["sh", "-c", script], **spec)


async def test_output_exit_status_and_slot(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    seen: list[tuple[Stream, bytes]] = []
    result = await h.run(
        _sh("echo out; echo err >&2; exit 3"), slot=1, on_output=lambda s, d: seen.append((s, d))
    )
    assert (result.status, result.exit_status) == ("error", 3)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert (result.slot, result.cores, result.backend, result.cpu_s) == (1, [1], "docker", None)
    assert sorted(seen) == [("stderr", b"err\n"), ("stdout", b"out\n")]
    assert h.engine.kills == 1  # the sweep after every command
    home = await h.run(_sh('echo "$HOME"; echo "$TMPDIR"'))
    assert home.stdout == f"{h.config.workspace_root / 's1'}\n/tmp\n"


async def test_stdin_reaches_the_command(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    data = "line\n" * 200_000  # 1 MB, beyond any socket buffer
    result = await h.run(ExecSpec(command=["wc", "-c"], stdin=data))
    assert (result.status, result.stdout.strip()) == ("ok", str(len(data)))
    empty = await h.run(ExecSpec(command=["cat"], stdin=""))  # immediate EOF
    assert (empty.status, empty.stdout) == ("ok", "")


async def test_output_beyond_the_cap_is_counted_not_kept(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    emitted = bytearray()
    code = "import sys; sys.stdout.write('x' * 100000)"
    result = await h.run(
        ExecSpec(command=[sys.executable, "-c", code]),
        cap=1000,
        on_output=lambda s, d: emitted.extend(d),
    )
    assert result.stdout == "x" * 1000 + TRUNCATION_MARKER.format(dropped=99000)
    assert result.stdout_truncated and not result.stderr_truncated
    assert bytes(emitted) == result.stdout.encode()  # the kept bytes, then the marker


async def test_timeout_kills_the_command(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    began = time.monotonic()
    result = await h.run(_sh("sleep 30", timeout_s=0.3))
    assert (result.status, result.exit_status) == ("timeout", -9)
    assert "timed out after 0.3 s" in (result.detail or "")
    assert 0.3 <= result.wall_s < 5 and time.monotonic() - began < 5
    assert h.engine.live_processes() == 0


async def test_cancel_kills_the_command(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, cancel.set)
    result = await h.run(_sh("sleep 30"), cancel=cancel)
    assert (result.status, result.exit_status) == ("cancelled", -9)
    assert h.engine.live_processes() == 0
    cancel_first = asyncio.Event()
    cancel_first.set()
    early = await h.run(_sh("echo never"), cancel=cancel_first)
    assert (early.status, early.stdout) == ("cancelled", "")


async def test_cancelling_the_task_kills_the_command(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    task = asyncio.ensure_future(h.run(_sh("sleep 30")))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert h.engine.live_processes() == 0


async def test_close_ends_running_commands_as_cancelled(
    make_harness: Callable[..., Any],
) -> None:
    h: Harness = await make_harness()
    task = asyncio.ensure_future(h.run(_sh("sleep 30")))
    while not h.engine.live_processes():
        await asyncio.sleep(0.01)
    await h.backend.close()
    result = await task
    assert (result.status, result.exit_status) == ("cancelled", -9)
    assert result.detail == "the sandbox backend was closed"
    assert h.engine.made == {} and h.engine.live_processes() == 0


async def test_a_broken_listener_loses_no_output(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()

    def broken(stream: Stream, data: bytes) -> None:
        raise RuntimeError("listener bug")

    result = await h.run(_sh("echo still here"), on_output=broken)
    assert (result.status, result.stdout) == ("ok", "still here\n")


async def test_a_death_by_signal_is_killed(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    result = await h.run(_sh("kill -9 $$"))
    assert (result.status, result.exit_status) == ("killed", -9)


async def test_a_bad_cwd_is_refused(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    with pytest.raises(SandboxError, match="cwd 'nowhere' does not exist"):
        await h.run(_sh("true", cwd="nowhere"))


async def test_per_slot_containers_follow_the_slots_session(
    make_harness: Callable[..., Any],
) -> None:
    h: Harness = await make_harness(docker_container_per="slot")
    await h.run(_sh("true"), session="a")
    await h.run(_sh("true"), session="a")
    (first,) = h.engine.made
    assert h.engine.made[first].options["labels"]["agentmars.session"] == "a"
    await h.run(_sh("true"), session="b")  # the slot switches session: a new container
    (second,) = h.engine.made
    assert second != first
    await h.run(_sh("true"), slot=1, session="a")
    assert len(h.engine.made) == 2
    cpusets = sorted(b.options["cpuset_cpus"] for b in h.engine.made.values())
    assert cpusets == ["0", "1"]
    await h.backend.release_session("b")
    (left,) = h.engine.made.values()
    assert left.options["labels"]["agentmars.session"] == "a"
    await h.backend.close()
    assert h.engine.made == {}
    with pytest.raises(SandboxError, match="not running"):
        await h.run(_sh("true"))


async def test_per_session_containers_move_between_slots(
    make_harness: Callable[..., Any],
) -> None:
    h: Harness = await make_harness(docker_container_per="session")
    await h.run(_sh("true"), slot=0, session="a")
    await h.run(_sh("true"), slot=1, session="a")
    (only,) = h.engine.made
    assert h.engine.pinned == [(only, "1")]
    # Two calls of one session at once: each gets a container of its own.
    both = await asyncio.gather(
        h.run(_sh("sleep 0.3; echo 1"), slot=0, session="a"),
        h.run(_sh("sleep 0.3; echo 2"), slot=1, session="a"),
    )
    assert [r.stdout for r in both] == ["1\n", "2\n"]
    assert len(h.engine.made) == 2
    await h.run(_sh("true"), slot=0, session="b")
    await h.backend.release_session("a")
    (left,) = h.engine.made.values()
    assert left.options["labels"]["agentmars.session"] == "b"


async def test_a_dead_container_is_replaced(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness()
    await h.run(_sh("true"))
    (dead,) = h.engine.made
    h.engine.stop(dead)
    result = await h.run(_sh("echo again"))
    assert (result.status, result.stdout) == ("ok", "again\n")
    assert dead not in h.engine.made and len(h.engine.made) == 1


async def test_a_per_session_container_that_cannot_move_is_replaced(
    make_harness: Callable[..., Any],
) -> None:
    h: Harness = await make_harness(docker_container_per="session")
    await h.run(_sh("true"), slot=0)
    (gone,) = h.engine.made
    h.engine.remove_container(gone, v=True, force=True)  # removed from outside
    result = await h.run(_sh("echo moved"), slot=1)
    assert (result.status, result.stdout) == ("ok", "moved\n")
    (new,) = h.engine.made.values()
    assert new.options["cpuset_cpus"] == "1"


async def test_a_container_that_dies_mid_command_is_reported(
    make_harness: Callable[..., Any],
) -> None:
    h: Harness = await make_harness()
    task = asyncio.ensure_future(h.run(_sh("sleep 30")))
    while not h.engine.live_processes():
        await asyncio.sleep(0.01)
    (dying,) = h.engine.made
    h.engine.stop(dying)
    result = await task
    assert result.status == "killed"  # the fake reports SIGKILL's 137
    assert dying not in h.engine.made or not h.engine.made[dying].running


# --- against a real engine ---------------------------------------------------------------


@functools.cache
def _engine_problem() -> str | None:
    """Why no engine answers (None when one does); asked once per test run."""
    try:
        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return str(exc)
    return None


@pytest.fixture
def engine() -> None:
    problem = _engine_problem()
    if problem is not None:
        pytest.skip(
            f"no Docker engine answers ({problem}): the docker backend's real tests run "
            "where one does"
        )


@dataclass
class Real:
    backend: DockerBackend
    config: SandboxConfig
    slots: list[Slot]

    async def run(
        self, spec: ExecSpec, *, slot: int = 0, session: str = "s1", cap: int = 1 << 20
    ) -> ExecResult:
        job = _job(_workspace(self.config, session), spec, session=session, cap=cap)
        return await self.backend.execute(self.slots[slot], job, cancel=asyncio.Event())


@pytest.fixture
async def make_real(engine: None, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    backends: list[DockerBackend] = []

    async def make(**options: Any) -> Real:
        config = _config(tmp_path, **options)
        slots = [Slot(i, tuple(config.slot_cores(i))) for i in range(config.resolved_slots())]
        backend = DockerBackend()
        backends.append(backend)
        await backend.start(config, slots)
        return Real(backend, config, slots)

    yield make
    for backend in backends:
        await backend.close()
        client = docker.from_env()
        label = f"agentmars.pool={backend.pool_id}"
        assert client.containers.list(all=True, filters={"label": label}) == []
        client.close()


def _cores(status: str) -> set[int]:
    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list"))
    cores: set[int] = set()
    for part in line.split()[1].split(","):
        low, _, high = part.partition("-")
        cores |= set(range(int(low), int(high or low) + 1))
    return cores


LEFTOVERS = _sh("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")


@pytest.mark.slow
async def test_real_commands_are_pinned_to_their_slots_cores(
    make_real: Callable[..., Any],
) -> None:
    real: Real = await make_real(slots=2)
    for slot in real.slots:
        result = await real.run(ExecSpec(command=["cat", "/proc/self/status"]), slot=slot.index)
        assert result.status == "ok", result
        assert _cores(result.stdout) == set(slot.cores)


@pytest.mark.slow
async def test_real_per_session_containers_are_repinned(make_real: Callable[..., Any]) -> None:
    real: Real = await make_real(slots=2, docker_container_per="session")
    seen = []
    for slot in real.slots:
        spec = _sh("cat /etc/hostname /proc/self/status")
        result = await real.run(spec, slot=slot.index)
        assert _cores(result.stdout) == set(slot.cores)
        seen.append(result.stdout.splitlines()[0])
    assert seen[0] == seen[1]  # one container, moved


@pytest.mark.slow
async def test_real_there_is_no_network(make_real: Callable[..., Any]) -> None:
    real: Real = await make_real(slots=1)
    interfaces = await real.run(ExecSpec(command=["ls", "/sys/class/net"]))
    assert interfaces.stdout.split() == ["lo"]
    code = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"
    connect = await real.run(ExecSpec(command=["python3", "-c", code]))
    assert connect.status == "error" and "OSError" in connect.stderr


@pytest.mark.slow
async def test_real_root_is_read_only_and_the_workspace_writable(
    make_real: Callable[..., Any],
) -> None:
    real: Real = await make_real(slots=1)
    for path in ("/x", "/usr/x", "/etc/x"):
        result = await real.run(_sh(f"echo x > {path}"))
        assert result.status == "error" and "Read-only file system" in result.stderr, result
    tmp = await real.run(_sh("echo t > /tmp/t && cat /tmp/t"))
    assert tmp.stdout == "t\n"
    wrote = await real.run(_sh("mkdir -p d && echo hi > d/f"))
    assert wrote.status == "ok", wrote
    written = real.config.workspace_root / "s1" / "d" / "f"
    assert written.read_text() == "hi\n"
    assert written.stat().st_uid == os.getuid()  # the pool can remove what tools write


@pytest.mark.slow
async def test_real_environment_is_clean(
    make_real: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTMARS_TEST_SECRET", "s3cret")
    real: Real = await make_real(slots=1)
    result = await real.run(ExecSpec(command=["env"], env={"ADDED": "yes"}))
    assert "s3cret" not in result.stdout
    workspace = real.config.workspace_root / "s1"
    assert f"HOME={workspace}" in result.stdout.splitlines()
    assert "ADDED=yes" in result.stdout.splitlines()


@pytest.mark.slow
async def test_real_timeout_kills_the_whole_tree(make_real: Callable[..., Any]) -> None:
    real: Real = await make_real(slots=1)
    escaper = "import os, time; os.setsid(); time.sleep(1000)"  # leaves the process group
    spec = _sh(f"python3 -c '{escaper}' & sleep 1000", timeout_s=1)
    result = await real.run(spec)
    assert (result.status, result.exit_status) == ("timeout", -9)
    assert result.wall_s < 10
    left = await real.run(LEFTOVERS)
    assert "sleep 1000" not in left.stdout and "setsid" not in left.stdout


@pytest.mark.slow
async def test_real_processes_left_behind_are_swept(make_real: Callable[..., Any]) -> None:
    real: Real = await make_real(slots=1)
    result = await real.run(_sh("sleep 1001 >/dev/null 2>&1 & echo started"))
    assert (result.status, result.stdout) == ("ok", "started\n")
    left = await real.run(LEFTOVERS)
    assert "sleep 1001" not in left.stdout


@pytest.mark.slow
async def test_real_output_cap(make_real: Callable[..., Any]) -> None:
    real: Real = await make_real(slots=1)
    code = "import sys; sys.stdout.write('x' * 100000)"
    result = await real.run(ExecSpec(command=["python3", "-c", code]), cap=1000)
    assert result.stdout == "x" * 1000 + TRUNCATION_MARKER.format(dropped=99000)
    assert result.stdout_truncated


@pytest.mark.slow
async def test_real_memory_limit(make_real: Callable[..., Any]) -> None:
    real: Real = await make_real(slots=1, memory_limit_mb=64)
    result = await real.run(ExecSpec(command=["python3", "-c", "b = b'x' * (512 << 20)"]))
    assert (result.status, result.exit_status) == ("killed", -9), result
    after = await real.run(_sh("echo alive"))  # the container survives its command's OOM
    assert after.stdout == "alive\n"


@pytest.mark.slow
async def test_real_stdin(make_real: Callable[..., Any]) -> None:
    real: Real = await make_real(slots=1)
    echo = await real.run(ExecSpec(command=["cat"], stdin="hello\n"))
    assert echo.stdout == "hello\n"
    big = await real.run(ExecSpec(command=["wc", "-c"], stdin="y" * (1 << 20)))
    assert big.stdout.strip() == str(1 << 20)


async def test_the_pool_runs_calls_on_the_docker_backend(tmp_path: Path) -> None:
    from agentmars.sandbox.pool import SandboxPool

    engine = FakeDockerEngine()
    config = _config(tmp_path, slots=1)
    async with SandboxPool(config, backend=DockerBackend(client=engine)) as pool:
        pool.open_session("s1")
        result = await pool.run("s1", _sh("echo hi"), tool="terminal")
        assert (result.status, result.stdout, result.backend) == ("ok", "hi\n", "docker")
        assert pool.snapshot()["backend"] == "docker"
        await pool.close_session("s1")
        assert engine.made == {}
