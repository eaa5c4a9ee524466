"""The docker backend: a slot's commands run by ``docker exec`` in a long-lived,
locked-down container pinned to the slot's cores.

Design (the reasons are in ``docs/sandbox-docker.md``):

- **Containers.** A bind mount cannot be added to a running container, and one
  container must never see two sessions' workspaces, so a container serves one
  session. ``docker_container_per="slot"``: each slot keeps at most one
  container, created for the session it runs and replaced when the slot runs
  another session. ``"session"``: a session keeps its container(s) until
  ``release_session``; before a command the container is moved to the slot's
  cores (``docker update --cpuset-cpus``). Either way a container runs one
  command at a time, which is what makes the kill below exact.
- **Users.** The container's own processes (docker-init and ``sleep infinity``)
  run as nobody; commands run as the owner of the workspace (root under a
  rootless engine, which maps to the host user), so their files belong to the
  pool's user and the pool can delete them.
- **Kill.** Docker cannot kill an exec. After every command, and at a timeout or
  cancel, a second exec runs ``kill -9 -1`` as the command's user: that signals
  every process of that user in the container (whatever process group or
  session it moved to) except itself, and neither init nor the keeper, which
  belong to another user. If even that exec cannot run (a fork bomb at the pids
  limit), the container is removed.
- **stdin** goes over the exec's hijacked connection; closing its write half is
  the end of input (as ``docker exec -i`` does). Output is read from the same
  connection as multiplexed frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import signal
import socket
import struct
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentmars.sandbox.backends.base import Job, OutputCallback, Slot, Stream
from agentmars.sandbox.backends.output import CappedOutput, deliver
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.spec import ExecResult, ExecStatus, SandboxError
from agentmars.sandbox.threads import in_thread
from agentmars.sandbox.workspaces import resolve_cwd

log = logging.getLogger("agentmars.sandbox.docker")

LABEL_POOL = "agentmars.pool"
LABEL_SLOT = "agentmars.slot"
LABEL_SESSION = "agentmars.session"
KEEPER_USER = "65534:65534"
"""Who the container's own processes run as (nobody): never a command's user."""
TMPFS_TMP = "rw,exec,nosuid,nodev,size=256m,mode=1777"
"""A private, writable /tmp; ``exec`` because build tools run what they put there."""
KILL_ALL = ["sh", "-c", "kill -9 -1"]
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
PING_TIMEOUT_S = 5.0
KILL_GRACE_S = 10.0
"""How long the output stream may take to end after the kill."""
_FRAME_HEADER = struct.Struct(">BxxxL")
_STREAMS: dict[int, Stream] = {1: "stdout", 2: "stderr", 3: "stderr"}  # 3: engine errors

Outcome = Literal["exited", "timeout", "cancelled"]


# --- pure parts -------------------------------------------------------------------------


def docker_host() -> str:
    """Where the SDK looks for the engine (for messages)."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def cpuset(cores: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(c) for c in cores)


def container_options(
    config: SandboxConfig,
    slot: Slot,
    session_id: str,
    workspace: Path,
    pool_id: str,
    *,
    user: str = KEEPER_USER,
) -> dict[str, Any]:
    """Keyword arguments of ``client.containers.create`` for one session's container
    on ``slot``: pinned, limited, offline, read-only but for /tmp and the workspace."""
    path = str(workspace)
    return {
        # The image's entrypoint is replaced: the container only has to stay up.
        "entrypoint": ["sleep", "infinity"],
        "init": True,  # docker-init reaps the orphans commands leave behind
        "user": user,
        "cpuset_cpus": cpuset(slot.cores),
        "mem_limit": f"{config.memory_limit_mb}m",
        "memswap_limit": f"{config.memory_limit_mb}m",  # equal: no swap on top
        "pids_limit": config.pids_limit,
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": TMPFS_TMP},
        "volumes": {path: {"bind": path, "mode": "rw"}},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "environment": {},  # the image's ENV only: nothing of the host's
        "labels": {LABEL_POOL: pool_id, LABEL_SLOT: str(slot.index), LABEL_SESSION: session_id},
    }


def keeper_user(job_user: str) -> str:
    """The container's own user, distinct from the command's so ``kill -1`` spares it."""
    return "65533:65533" if job_user.split(":")[0] == "65534" else KEEPER_USER


def job_user(workspace: Path, *, rootless: bool) -> str:
    """Commands run as the workspace's owner; under a rootless engine that is the
    container's root, which the engine maps to the host user."""
    if rootless:
        return "0:0"
    info = workspace.stat()
    return f"{info.st_uid}:{info.st_gid}"


def exec_workdir(workspace: Path, cwd: str) -> str:
    """The command's directory inside the container (the workspace has the same path)."""
    return posixpath.normpath(posixpath.join(str(workspace), cwd))


def check_workdir(workspace: Path, cwd: str) -> None:
    """Refuse a cwd that is missing or resolves (through links) outside the workspace
    (the check the process backend makes)."""
    resolve_cwd(workspace, cwd)


def exec_environment(workspace: Path, env: dict[str, str]) -> dict[str, str]:
    """What a command adds to the image's environment: the same base as the process
    backend (``HOME`` = workspace, ``TMPDIR``, ``LANG``), then the call's own."""
    return {"HOME": str(workspace), "TMPDIR": "/tmp", "LANG": "C.UTF-8", **env}


def engine_warnings(info: dict[str, Any]) -> list[str]:
    """The isolation this engine says it cannot enforce (``docker info``)."""
    missing = {
        "CPUSet": "cpusets: slots are not pinned to their cores",
        "MemoryLimit": "memory limits: memory_limit_mb is not enforced",
        "SwapLimit": "swap limits: a container may swap beyond memory_limit_mb",
        "PidsLimit": "pids limits: pids_limit is not enforced",
    }
    return [
        f"the Docker engine does not support {what}"
        for key, what in missing.items()
        if info.get(key) is False
    ]


def exit_outcome(code: int | None) -> tuple[ExecStatus, int | None, str | None]:
    """Status, exit status and detail for an exec's exit code. The engine reports
    a death by signal N as 128 + N (like a shell), so such codes read as signals."""
    if code is None:
        return "killed", None, "the Docker engine reported no exit status"
    if code == 0:
        return "ok", 0, None
    if 128 < code <= 128 + 64:
        signum = code - 128
        detail = f"ended by signal {signum}"
        if signum == signal.SIGKILL:
            detail += " (SIGKILL: the memory limit, memory_limit_mb, is the usual cause)"
        return "killed", -signum, detail
    return "error", code, None


# --- the exec connection (blocking; runs in the backend's I/O threads) -------------------


def raw_socket(sock: Any) -> Any:
    """The socket under what ``exec_start(socket=True)`` returns (a ``SocketIO`` over
    a unix socket, the socket itself over TLS)."""
    return getattr(sock, "_sock", sock)


def _read_exactly(recv: Callable[[int], bytes], size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_frames(recv: Callable[[int], bytes]) -> Iterator[tuple[int, bytes]]:
    """(stream id, bytes) pieces of a multiplexed attach stream until it ends; a
    frame's payload is passed on as it arrives, never gathered whole."""
    while (header := _read_exactly(recv, _FRAME_HEADER.size)) is not None:
        stream_id, size = _FRAME_HEADER.unpack(header)
        while size > 0:
            chunk = recv(min(size, 65536))
            if not chunk:
                return
            size -= len(chunk)
            yield stream_id, chunk


def pump_frames(sock: Any, stdout: CappedOutput, stderr: CappedOutput) -> None:
    """Read the exec's output to its end into each stream's capper, which passes the
    kept bytes of every chunk on."""
    raw = raw_socket(sock)
    try:
        for stream_id, chunk in read_frames(raw.recv):
            stream = _STREAMS.get(stream_id, "stdout")
            (stderr if stream == "stderr" else stdout).feed(chunk)
    except OSError as exc:  # the connection broke: the exit status tells the rest
        log.debug("exec output stream ended with %s", exc)


def send_stdin(sock: Any, data: bytes) -> None:
    """Write the command's input, then close the write half: that is its EOF."""
    raw = raw_socket(sock)
    try:
        if data:
            raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:  # the command ended without reading all of it
        pass


def _untimed(sock: Any) -> None:
    """The SDK leaves its API timeout on the socket; a quiet command must not hit it."""
    for candidate in (sock, raw_socket(sock)):
        if hasattr(candidate, "settimeout"):
            candidate.settimeout(None)


def _unblock(sock: Any) -> None:
    """Wake the threads blocked on the connection (reads then return EOF)."""
    with contextlib.suppress(OSError):
        raw_socket(sock).shutdown(socket.SHUT_RDWR)


def _close(sock: Any) -> None:
    for candidate in (sock, raw_socket(sock)):
        with contextlib.suppress(OSError):
            candidate.close()


# --- the SDK ----------------------------------------------------------------------------


def _sdk() -> Any:
    try:
        import docker
    except ImportError as exc:
        raise SandboxError(
            "the docker backend needs the Docker SDK: pip install 'agentmars[docker]'"
        ) from exc
    return docker


def connect(max_pool_size: int) -> Any:
    """A client of the engine ``DOCKER_HOST`` names (default: the local socket),
    after a quick ping so a missing engine fails in seconds, not at the API timeout."""
    docker = _sdk()
    try:
        probe = docker.from_env(timeout=PING_TIMEOUT_S)
        try:
            probe.ping()
        finally:
            probe.close()
        return docker.from_env(max_pool_size=max_pool_size)
    except docker.errors.DockerException as exc:
        raise SandboxError(
            f"no Docker engine answers at {docker_host()}: {exc}; "
            "start dockerd or use the process backend"
        ) from exc


def ensure_image(client: Any, image: str) -> None:
    """The image is there, or is pulled now; offline, a missing image is an error."""
    errors = _sdk().errors
    try:
        client.images.get(image)
        return
    except errors.ImageNotFound:
        log.info("pulling Docker image %s", image)
    except errors.DockerException as exc:
        raise SandboxError(f"could not look up Docker image {image!r}: {exc}") from exc
    try:
        client.images.pull(image)
    except errors.DockerException as exc:
        raise SandboxError(
            f"Docker image {image!r} is not on the engine and pulling it failed ({exc}); "
            f"pull or build it where a registry is reachable (docker pull {image}), "
            "or set docker_image to an image the engine has"
        ) from exc


def _is_gone(exc: Exception) -> bool:
    """The container was removed or is not running (engine answers 404 / 409)."""
    errors = _sdk().errors
    return isinstance(exc, errors.NotFound) or (
        isinstance(exc, errors.APIError) and exc.status_code == 409
    )


@dataclass
class _Container:
    """A started container and the session it serves."""

    id: str
    session_id: str
    workspace: Path
    user: str
    """Who its commands run as (and its kill exec)."""
    cpuset: str
    busy: bool = True


# --- the backend ------------------------------------------------------------------------


class DockerBackend:
    """Runs each command by ``docker exec`` in a container of its session."""

    name = "docker"

    def __init__(self, client: Any | None = None) -> None:
        """``client``: a ``docker.DockerClient`` to use instead of connecting to the
        engine ``DOCKER_HOST`` names."""
        self._given_client = client
        self._client: Any = None
        self._config: SandboxConfig | None = None
        self._rootless = False
        self._io: ThreadPoolExecutor | None = None
        self._by_slot: dict[int, _Container] = {}
        self._by_session: dict[str, list[_Container]] = {}
        self._running = 0
        self._drained = asyncio.Event()
        self._closed = False
        self.pool_id = uuid.uuid4().hex[:12]
        """Every container of this backend carries it as label ``agentmars.pool``."""

    @property
    def _api(self) -> Any:
        return self._client.api

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self, config: SandboxConfig, slots: list[Slot]) -> list[str]:
        _sdk()
        pool_size = 2 * len(slots) + 4  # one hijacked connection per running exec, plus calls
        self._client = self._given_client or await in_thread(connect, pool_size)
        info = await in_thread(self._engine_info)
        await in_thread(ensure_image, self._client, config.docker_image)
        self._config = config
        self._rootless = any("rootless" in o for o in info.get("SecurityOptions") or [])
        # Output readers block for a command's whole run: they get threads of their own
        # so that they cannot starve asyncio.to_thread's shared pool.
        self._io = ThreadPoolExecutor(2 * len(slots) + 2, thread_name_prefix="agentmars-docker")
        warnings = engine_warnings(info)
        for warning in warnings:
            log.warning("docker backend: %s", warning)
        return warnings

    def _engine_info(self) -> dict[str, Any]:
        try:
            self._client.ping()
            return dict(self._client.info())
        except _sdk().errors.DockerException as exc:
            raise SandboxError(
                f"no Docker engine answers at {docker_host()}: {exc}; "
                "start dockerd or use the process backend"
            ) from exc

    async def adopt(self, workspace: Path) -> None:
        """Nothing to hand over: containers run their jobs as root, who reads anything."""

    async def release_session(self, session_id: str) -> None:
        ids = {box.id for box in self._by_session.pop(session_id, [])}
        for index, box in list(self._by_slot.items()):
            if box.session_id == session_id:
                ids.add(self._by_slot.pop(index).id)
        if self._client is not None:
            ids |= set(await self._labelled({LABEL_SESSION: session_id}))
        await self._remove_all(ids)

    async def close(self) -> None:
        if self._client is None or self._closed:
            return
        self._closed = True
        await self._remove_everything()  # kills what still runs: those execs end now
        if self._running:
            try:
                await asyncio.wait_for(self._drained.wait(), KILL_GRACE_S)
            except TimeoutError:
                log.warning("docker backend: %d commands did not end at close", self._running)
            await self._remove_everything()  # containers those calls were creating
        if self._io is not None:
            self._io.shutdown(wait=False, cancel_futures=True)
        if self._given_client is None:
            await in_thread(self._client.close)

    async def _remove_everything(self) -> None:
        """Remove every container this backend knows of or finds by its pool label."""
        ids = {box.id for box in self._by_slot.values()}
        ids |= {box.id for boxes in self._by_session.values() for box in boxes}
        self._by_slot.clear()
        self._by_session.clear()
        try:
            ids |= set(await self._labelled({}))
        except SandboxError as exc:  # remove what we know of; say what may remain
            log.warning("%s; containers labelled %s=%s may remain", exc, LABEL_POOL, self.pool_id)
        await self._remove_all(ids)

    # --- containers ---------------------------------------------------------------------

    async def _labelled(self, labels: dict[str, str]) -> list[str]:
        """Ids of this pool's containers that also carry ``labels``."""
        wanted = [f"{LABEL_POOL}={self.pool_id}", *(f"{k}={v}" for k, v in labels.items())]
        found = await self._call(
            "list containers",
            self._client.containers.list,
            all=True,
            filters={"label": wanted},
            sparse=True,  # ids are enough: no inspect per container
        )
        return [str(c.id) for c in found]

    async def _remove_all(self, ids: set[str]) -> None:
        await asyncio.gather(*(self._remove(cid) for cid in ids))

    async def _remove(self, container_id: str) -> None:
        """Remove a container and its anonymous volumes, killing what runs in it."""
        try:
            await in_thread(self._api.remove_container, container_id, v=True, force=True)
        except _sdk().errors.NotFound:
            pass
        except _sdk().errors.DockerException as exc:
            log.warning("docker backend: could not remove container %s: %s", container_id, exc)

    async def _discard(self, box: _Container) -> None:
        """Forget a container that died or cannot be trusted, and remove it."""
        for index, held in list(self._by_slot.items()):
            if held is box:
                del self._by_slot[index]
        boxes = self._by_session.get(box.session_id, [])
        if box in boxes:
            boxes.remove(box)
        await self._remove(box.id)

    async def _acquire(self, slot: Slot, job: Job) -> _Container:
        """A started container of the job's session for ``slot``, marked busy. No await
        comes between finding an idle container and marking it, so two calls never
        share one."""
        assert self._config is not None
        if self._config.docker_container_per == "slot":
            box = self._by_slot.get(slot.index)
            if box is not None and (box.session_id, box.workspace) == (
                job.session_id,
                job.workspace,
            ):
                box.busy = True
                return box
            if box is not None:  # the slot serves another session now
                await self._discard(box)
            box = await self._create(slot, job)
            self._by_slot[slot.index] = box
            return box
        boxes = self._by_session.get(job.session_id, [])
        box = next((b for b in boxes if not b.busy and b.workspace == job.workspace), None)
        if box is None:
            box = await self._create(slot, job)
            self._by_session.setdefault(job.session_id, []).append(box)
        box.busy = True
        try:
            await self._pin(box, slot)
        except SandboxError as exc:  # gone, or stuck: a new one is created pinned
            log.warning("%s; replacing the container", exc)
            await self._discard(box)
            box = await self._create(slot, job)
            self._by_session.setdefault(job.session_id, []).append(box)
        except BaseException:
            box.busy = False
            raise
        return box

    async def _pin(self, box: _Container, slot: Slot) -> None:
        """Move an idle per-session container to ``slot``'s cores."""
        wanted = cpuset(slot.cores)
        if box.cpuset != wanted:
            await self._call(
                f"pin container {box.id[:12]} to cores {wanted}",
                self._api.update_container,
                box.id,
                cpuset_cpus=wanted,
            )
            box.cpuset = wanted

    async def _create(self, slot: Slot, job: Job) -> _Container:
        assert self._config is not None
        if not job.workspace.is_dir():
            raise SandboxError(f"session {job.session_id!r} has no workspace at {job.workspace}")
        user = job_user(job.workspace, rootless=self._rootless)
        options = container_options(
            self._config, slot, job.session_id, job.workspace, self.pool_id, user=keeper_user(user)
        )
        name = f"agentmars-{self.pool_id}-{slot.index}-{uuid.uuid4().hex[:8]}"
        container_id = await in_thread(self._start_container, name, options)
        return _Container(container_id, job.session_id, job.workspace, user, cpuset(slot.cores))

    def _start_container(self, name: str, options: dict[str, Any]) -> str:
        assert self._config is not None
        image = self._config.docker_image
        errors = _sdk().errors
        try:
            container_id = str(self._client.containers.create(image, name=name, **options).id)
        except errors.DockerException as exc:
            raise SandboxError(f"could not create a container from {image!r}: {exc}") from exc
        try:
            self._api.start(container_id)
        except errors.DockerException as exc:
            with contextlib.suppress(errors.DockerException):
                self._api.remove_container(container_id, v=True, force=True)
            raise SandboxError(f"could not start a container from {image!r}: {exc}") from exc
        return container_id

    async def _call(self, what: str, function: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """An engine call in a thread; its failure as a SandboxError saying what failed."""
        try:
            return await in_thread(function, *args, **kw)
        except _sdk().errors.DockerException as exc:
            raise SandboxError(f"docker backend: could not {what}: {exc}") from exc

    # --- execution ----------------------------------------------------------------------

    async def execute(
        self,
        slot: Slot,
        job: Job,
        *,
        cancel: asyncio.Event,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        if self._config is None or self._closed:
            raise SandboxError("the docker backend is not running (start it, or it was closed)")
        check_workdir(job.workspace, job.spec.cwd)
        if cancel.is_set():
            return _result(slot, "cancelled", None, "cancelled before it started")
        self._running += 1
        self._drained.clear()
        try:
            return await self._execute(slot, job, cancel, on_output)
        finally:
            self._running -= 1
            if not self._running:
                self._drained.set()

    async def _execute(
        self, slot: Slot, job: Job, cancel: asyncio.Event, on_output: OutputCallback | None
    ) -> ExecResult:
        # A container found dead (an OOM kill of its init, removed from outside) is
        # replaced once; a second failure is the engine's, and reported.
        for _attempt in range(2):
            box = await self._acquire(slot, job)
            try:
                opened = await self._open_exec(box, job)
                if opened is not None:
                    return await self._run(box, *opened, slot, job, cancel, on_output)
                log.warning("docker backend: container %s is gone; replacing it", box.id[:12])
                await self._discard(box)
            finally:
                box.busy = False
        raise SandboxError(
            f"docker backend: the container for slot {slot.index} stopped again as soon as it "
            "was replaced; see the engine's log (docker events)"
        )

    async def _open_exec(self, box: _Container, job: Job) -> tuple[str, Any] | None:
        """Start the command; None if the container is gone."""
        has_stdin = job.spec.stdin is not None
        try:
            created = await in_thread(
                self._api.exec_create,
                box.id,
                job.spec.command,
                stdin=has_stdin,
                environment=exec_environment(job.workspace, job.spec.env),
                workdir=exec_workdir(job.workspace, job.spec.cwd),
                user=box.user,
            )
            exec_id = str(created["Id"])
            sock = await in_thread(self._api.exec_start, exec_id, socket=True)
        except _sdk().errors.DockerException as exc:
            if _is_gone(exc):
                return None
            raise SandboxError(f"docker backend: could not start the command: {exc}") from exc
        _untimed(sock)
        return exec_id, sock

    async def _run(
        self,
        box: _Container,
        exec_id: str,
        sock: Any,
        slot: Slot,
        job: Job,
        cancel: asyncio.Event,
        on_output: OutputCallback | None,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        emit = _on_loop(loop, on_output)
        stdout = CappedOutput("stdout", job.output_cap_bytes, emit)
        stderr = CappedOutput("stderr", job.output_cap_bytes, emit)
        reader = loop.run_in_executor(self._io, pump_frames, sock, stdout, stderr)
        io = [reader]
        if job.spec.stdin is not None:
            io.append(loop.run_in_executor(self._io, send_stdin, sock, job.spec.stdin.encode()))
        completion = asyncio.ensure_future(self._until_exit(exec_id, reader))
        try:
            outcome = await _race(completion, cancel, job.timeout_s)
            wall_s = time.monotonic() - started  # the kill and the clean-up are not its time
        finally:
            # Whatever ended the wait (exit, limit, cancel, this task being cancelled),
            # nothing the command started may outlive it.
            await self._end_processes(box, completion)
            _unblock(sock)
            await asyncio.gather(*io, return_exceptions=True)
            _close(sock)
        stdout.finish()  # on the loop, after the reader's chunks (see _on_loop)
        stderr.finish()
        code = completion.result() if completion.done() and not completion.cancelled() else None
        status, exit_status, detail = await self._judge(box, outcome, code, job.timeout_s)
        return _result(slot, status, exit_status, detail, stdout, stderr, wall_s)

    async def _until_exit(self, exec_id: str, reader: Awaitable[None]) -> int | None:
        """The exit code, once the output has ended and the engine says the command is
        no longer running (output can close before the process ends)."""
        await asyncio.shield(reader)
        delay = 0.002
        while True:
            try:
                info = await in_thread(self._api.exec_inspect, exec_id)
            except _sdk().errors.DockerException:
                return None  # the container (and with it the exec) is gone
            if not info.get("Running"):
                code = info.get("ExitCode")
                return code if isinstance(code, int) else None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def _end_processes(self, box: _Container, completion: asyncio.Future[Any]) -> None:
        """Kill every process of the command's user in the container, then let the
        output stream end; a container where that fails is removed."""
        if not await self._kill_all(box):
            await self._discard(box)
        if not completion.done():
            await asyncio.wait({completion}, timeout=KILL_GRACE_S)
        if not completion.done():
            completion.cancel()

    async def _kill_all(self, box: _Container) -> bool:
        """True when nothing of the command's user runs any more in the container."""
        errors = _sdk().errors
        try:
            code = await in_thread(self._exec_quietly, box, KILL_ALL)
        except errors.DockerException as exc:
            if _is_gone(exc):
                return True  # no container, no processes
            log.warning("docker backend: kill in %s failed: %s", box.id[:12], exc)
            return False
        return code in (0, 1)  # 1: there was nothing to kill

    def _exec_quietly(self, box: _Container, command: list[str]) -> int | None:
        """Run a short command in the container and return its exit code."""
        exec_id = self._api.exec_create(box.id, command, user=box.user)["Id"]
        self._api.exec_start(exec_id)  # returns when the command's output has ended
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            info = self._api.exec_inspect(exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return code if isinstance(code, int) else None
            time.sleep(0.005)
        return None

    async def _judge(
        self, box: _Container, outcome: Outcome, code: int | None, timeout_s: float
    ) -> tuple[ExecStatus, int | None, str | None]:
        # As in the process backend: the kill is a SIGKILL, whatever the engine reports.
        if outcome == "timeout":
            return "timeout", -signal.SIGKILL, f"timed out after {timeout_s:g} s"
        if outcome == "cancelled":
            return "cancelled", -signal.SIGKILL, "cancelled"
        status, exit_status, detail = exit_outcome(code)
        if self._closed and status == "killed":  # close() removed its container
            return "cancelled", -signal.SIGKILL, "the sandbox backend was closed"
        if code is None:
            detail = await self._why_no_exit(box)
        return status, exit_status, detail

    async def _why_no_exit(self, box: _Container) -> str:
        """Why a command has no exit status: usually its container died under it."""
        try:
            state = (await in_thread(self._api.inspect_container, box.id))["State"]
        except _sdk().errors.NotFound:
            await self._discard(box)
            return "its container was removed while the command ran"
        except _sdk().errors.DockerException as exc:
            return f"the Docker engine reported no exit status ({exc})"
        if state.get("Running"):
            return "the Docker engine reported no exit status"
        await self._discard(box)
        oom = ", OOM-killed (memory_limit_mb)" if state.get("OOMKilled") else ""
        return (
            f"its container stopped while the command ran (state {state.get('Status')}, "
            f"exit {state.get('ExitCode')}{oom})"
        )


# --- helpers of execute -----------------------------------------------------------------


def _on_loop(
    loop: asyncio.AbstractEventLoop, on_output: OutputCallback | None
) -> OutputCallback | None:
    """``on_output`` called on the event loop, in order: from the reader thread, each
    call is queued there; on the loop itself (the truncation markers, once the reader
    has ended and its queued calls have run), it is made at once, so it arrives before
    the result does."""
    if on_output is None:
        return None
    callback = on_output
    loop_thread = threading.get_ident()

    def emit(stream: Stream, data: bytes) -> None:
        if threading.get_ident() == loop_thread:
            callback(stream, data)  # CappedOutput guards this call
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
            loop.call_soon_threadsafe(deliver, callback, stream, data)

    return emit


async def _race(
    completion: asyncio.Future[Any], cancel: asyncio.Event, timeout_s: float
) -> Outcome:
    """Wait for the command's end, its time limit or a cancel, whichever is first; an
    exit that coincides with either still counts as an exit."""
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait(
            {completion, cancelled}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        cancelled.cancel()
    if completion.done():
        return "exited"
    return "cancelled" if cancel.is_set() else "timeout"


def _result(
    slot: Slot,
    status: ExecStatus,
    exit_status: int | None,
    detail: str | None,
    stdout: CappedOutput | None = None,
    stderr: CappedOutput | None = None,
    wall_s: float = 0.0,
) -> ExecResult:
    # cpu_s stays None: the engine accounts CPU per container, not per exec.
    return ExecResult(
        status=status,
        exit_status=exit_status,
        stdout=stdout.text() if stdout else "",
        stderr=stderr.text() if stderr else "",
        stdout_truncated=bool(stdout and stdout.truncated),
        stderr_truncated=bool(stderr and stderr.truncated),
        wall_s=wall_s,
        slot=slot.index,
        cores=list(slot.cores),
        backend="docker",
        detail=detail,
    )
