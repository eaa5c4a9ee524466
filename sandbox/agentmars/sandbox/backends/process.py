"""The ``process`` backend: each job runs under bubblewrap in fresh mount, pid, net,
ipc, uts and cgroup namespaces (and a user namespace unless the pool runs as root),
sees the host read-only except its own workspace, runs without capabilities and never
as host root, and is pinned to its slot's cores and confined by the slot's cgroups
(cpuset, memory, pids).

A job's processes: ``_launch.py enter`` (joins the cgroups, pins, sets rlimits) execs
bubblewrap, which runs ``_launch.py supervise`` as the sandbox's pid 1, which runs the
command and reports its exact wait status and CPU time on a status pipe.

When the pool runs as root, jobs run as host uid ``SANDBOX_UID``; a session's
workspace is handed to that uid (recursively) before its first job, so files the pool
adds later must be created as that uid to be writable by jobs.

Where something is unavailable (no bubblewrap, no user namespaces, cgroup controllers
not writable) ``start()`` falls back to weaker means and returns a warning for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentmars.sandbox.backends import _launch
from agentmars.sandbox.backends.base import Job, OutputCallback, Slot, Stream
from agentmars.sandbox.cgroups import CgroupManager, SlotCgroup
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.spec import (
    TRUNCATION_MARKER,
    ExecResult,
    ExecSpec,
    ExecStatus,
    SandboxError,
)

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
"""nobody: the uid and gid of jobs in the sandbox (and on the host, for a root pool)."""
SANDBOX_INIT = "/run/agentmars/init.py"
"""Where ``_launch.py`` is mounted (read-only) in the sandbox, to run as its pid 1."""
EXEC_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
KILL_TIMEOUT_S = 5.0
PIPE_DRAIN_TIMEOUT_S = 2.0
"""How long to keep reading output after the job and its processes are gone (only a
process that escaped every kill could hold the pipes open longer)."""
PROBE_TIMEOUT_S = 30.0
_READ_CHUNK = 65536

Isolation = Literal["drop", "userns", "no-userns", "none"]
"""How jobs are isolated. ``drop``: bubblewrap run by root, the sandbox's init drops the
job to ``SANDBOX_UID`` (a user namespace would map the job to host root, which may read
every root-only file that is visible, e.g. /etc/shadow). ``userns``: bubblewrap in a
user namespace, the job is the pool's own unprivileged uid. ``no-userns``: bubblewrap
without one (set-uid bubblewrap). ``none``: no sandbox at all."""
EndedBy = Literal["exit", "timeout", "cancelled", "closed"]


class _CappedStream:
    """One output stream: the first ``cap`` bytes kept, the rest only counted."""

    def __init__(self, name: Stream, cap: int) -> None:
        self.name = name
        self.cap = cap
        self.kept = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> bytes:
        """Keep what fits; return the part kept (for streaming)."""
        room = self.cap - len(self.kept)
        kept = data[: max(room, 0)]
        self.kept += kept
        self.dropped += len(data) - len(kept)
        return kept

    @property
    def marker(self) -> str:
        return TRUNCATION_MARKER.format(dropped=self.dropped) if self.dropped else ""

    def text(self) -> str:
        return self.kept.decode("utf-8", errors="replace") + self.marker


class _JobProtocol(asyncio.SubprocessProtocol):
    """Captures stdout/stderr as they arrive, streams the kept part to ``on_output``,
    and tells when the process has exited and when every pipe is closed."""

    def __init__(self, cap: int, on_output: OutputCallback | None) -> None:
        loop = asyncio.get_running_loop()
        self.streams = {1: _CappedStream("stdout", cap), 2: _CappedStream("stderr", cap)}
        self.on_output = on_output
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        stream = self.streams[fd]
        kept = stream.add(data)
        if kept:
            self._emit(stream.name, kept)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def emit_markers(self) -> None:
        for stream in self.streams.values():
            if stream.marker:
                self._emit(stream.name, stream.marker.encode())

    def _emit(self, name: Stream, chunk: bytes) -> None:
        if self.on_output is None:
            return
        try:
            self.on_output(name, chunk)
        except Exception:  # a broken listener must not lose the job's output
            log.exception("on_output callback failed")


@dataclass(frozen=True)
class _Report:
    """What the supervisor wrote on the status pipe."""

    started: bool = False
    wait_status: int | None = None
    cpu_s: float | None = None
    error: str | None = None

    @classmethod
    def parse(cls, text: str) -> _Report:
        """Lenient: in ``userns`` mode the job runs as the supervisor's uid and could
        write to the pipe through /proc/1/fd. It can only misreport its own run that
        way (as it could by its exit code), so malformed lines are skipped and the last
        exit line wins: the supervisor's own is written when the job has ended."""
        started, wait_status, cpu_s, error = False, None, None, None
        for line in text.splitlines():
            kind, _, rest = line.partition(" ")
            status, _, cpu = rest.partition(" ")
            if kind == "started":
                started = True
            elif kind == "exit" and status.isdigit() and _is_float(cpu):
                wait_status, cpu_s = int(status), float(cpu)
            elif kind == "error":
                error = rest
        return cls(started, wait_status, cpu_s, error)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class _Counters:
    """A slot's cumulative cgroup counters, read before and after a job."""

    cpu_s: float | None
    oom_kills: int | None
    pids_limit_hits: int | None

    @classmethod
    def read(cls, group: SlotCgroup | None) -> _Counters:
        if group is None:
            return cls(None, None, None)
        return cls(group.cpu_seconds(), group.oom_kills(), group.pids_limit_hits())


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def resolve_cwd(workspace: Path, cwd: str) -> tuple[Path, Path]:
    """The workspace and the job's working directory, symlinks resolved; the working
    directory must be an existing directory inside the workspace."""
    try:
        root = workspace.resolve(strict=True)
    except OSError as exc:
        raise SandboxError(f"workspace {workspace} does not exist") from exc
    try:
        target = (root / cwd).resolve(strict=True)
    except OSError as exc:
        raise SandboxError(f"cwd {cwd!r} does not exist in the workspace") from exc
    if not target.is_relative_to(root):
        raise SandboxError(f"cwd {cwd!r} resolves to {target}, outside the workspace")
    if not target.is_dir():
        raise SandboxError(f"cwd {cwd!r} is not a directory")
    return root, target


def check_workspaces_hidden(workspace_root: Path, readonly_paths: list[Path]) -> None:
    """Refuse a read-only path that contains a workspace or lies in one: every sandbox
    would see other sessions' files."""
    for path in readonly_paths:
        resolved = path.resolve()
        if workspace_root.is_relative_to(resolved) or resolved.is_relative_to(workspace_root):
            raise SandboxError(
                f"readonly path {path} overlaps the workspaces in {workspace_root}: other "
                "sessions' files would be readable; remove it from readonly_paths"
            )


def hand_over(workspace: Path, uid: int) -> None:
    """Give ``workspace`` and everything in it to ``uid``/``uid``. Symlinks are never
    followed and names are resolved against directory descriptors (``os.fwalk``), so a
    running job that swaps a directory for a symlink cannot redirect a chown outside;
    the top directory goes last, so a run racing this one hands over too."""
    for _, dirs, files, dir_fd in os.fwalk(workspace):
        for name in dirs + files:
            os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
    os.chown(workspace, uid, uid)


class _MountPoints:
    """Bind arguments, each preceded by ``--dir`` (mode 0755) for the mount point's
    parents: bubblewrap would create them with the host's modes (/root: 0700), which
    a job running as another uid could not pass."""

    def __init__(self) -> None:
        self.read_only: list[Path] = []
        self.made = {Path("/"), Path("/tmp")}

    def bind(self, option: str, source: Path, dest: Path) -> list[str]:
        argv = []
        for parent in reversed(dest.parents):
            if parent in self.made or any(parent.is_relative_to(r) for r in self.read_only):
                continue
            self.made.add(parent)
            argv += ["--perms", "0755", "--dir", str(parent)]
        if option == "--ro-bind":
            self.read_only.append(dest)
        return [*argv, option, str(source), str(dest)]


def sandbox_env(workspace: Path, extra: dict[str, str]) -> dict[str, str]:
    """The job's environment, built from scratch (nothing of the host is inherited)."""
    path = [str(Path(sys.prefix) / "bin"), *EXEC_PATH]
    env = {"PATH": ":".join(path), "HOME": str(workspace), "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    return env | extra


class ProcessBackend:
    """Runs jobs as local processes under bubblewrap; see the module docstring."""

    name = "process"

    def __init__(self, bwrap: str = "bwrap", *, cgroups: bool = True) -> None:
        """``bwrap``: the bubblewrap executable (a name looked up on PATH, or a path);
        ``cgroups``: False confines jobs without cgroups (rlimits, affinity), as on a
        host where they are not writable."""
        self._bwrap_name = bwrap
        self._use_cgroups = cgroups
        self._bwrap: str | None = None
        self._config: SandboxConfig | None = None
        self._isolation: Isolation = "none"
        self._cgroups: CgroupManager | None = None
        self._groups: dict[int, SlotCgroup] = {}
        self._rlimits: dict[str, int] = {}
        self._python = os.path.realpath(sys.executable)
        self._closing = asyncio.Event()
        self._running: set[asyncio.Future[None]] = set()

    async def start(self, config: SandboxConfig, slots: list[Slot]) -> list[str]:
        self._config = config
        check_workspaces_hidden(config.workspace_root.resolve(), config.readonly_paths)
        warnings = self._set_up_cgroups(config, slots)
        try:
            warnings += await self._choose_isolation(slots[0])
        except BaseException:
            await self.close()
            raise
        for warning in warnings:
            log.warning("process sandbox: %s", warning)
        return warnings

    def _set_up_cgroups(self, config: SandboxConfig, slots: list[Slot]) -> list[str]:
        """Slot groups where cgroups are writable; rlimits (and warnings) elsewhere."""
        manager = CgroupManager.detect() if self._use_cgroups else CgroupManager(None)
        self._cgroups = manager
        for slot in slots:
            self._groups[slot.index] = manager.create_slot(
                slot.index,
                slot.cores,
                memory_limit_mb=config.memory_limit_mb,
                pids_limit=config.pids_limit,
            )
        self._rlimits = {"CORE": 0}  # core files would land in the workspace
        warnings = []
        why = manager.unavailable
        if "cpuset" in why:
            warnings.append(
                f"cgroup cpuset controller not writable ({why['cpuset']}): cores pinned by "
                "CPU affinity only, which a job may widen to every core"
            )
        if "memory" in why:
            self._rlimits["AS"] = config.memory_limit_mb * 1024 * 1024
            warnings.append(
                f"cgroup memory controller not writable ({why['memory']}): memory limited "
                "by RLIMIT_AS only (address space per process, not the job's total)"
            )
        if "pids" in why:
            self._rlimits["NPROC"] = config.pids_limit
            warnings.append(
                f"cgroup pids controller not writable ({why['pids']}): processes limited "
                "by RLIMIT_NPROC only, which counts all processes of the job's host uid "
                "(every slot's) and does not bind uid 0"
            )
        if "cpuacct" in why:
            warnings.append(
                f"cgroup CPU accounting not available ({why['cpuacct']}): cpu_s counts "
                "only processes reaped before the job ended"
            )
        return warnings + manager.notes

    async def _choose_isolation(self, probe_slot: Slot) -> list[str]:
        """The first isolation a probe job runs under: for a root pool, bubblewrap with
        the job dropped to SANDBOX_UID, else in a user namespace; for any other, a user
        namespace, else none (set-uid bubblewrap). No sandbox only without bubblewrap."""
        self._bwrap = shutil.which(self._bwrap_name)
        if self._bwrap is None:
            self._isolation = "none"
            return [
                f"bubblewrap not found ({self._bwrap_name!r}): commands run directly on "
                f"the host as uid {os.geteuid()}, NOT sandboxed (no filesystem, network, "
                "pid or user isolation; daemonized processes escape when cgroups are "
                "unavailable); only CPU pinning, limits, a clean environment and the "
                "working directory apply"
            ]
        root = os.geteuid() == 0
        failures = []
        candidates: tuple[Isolation, ...] = ("drop", "userns") if root else ("userns", "no-userns")
        for isolation in candidates:
            self._isolation = isolation
            result = await self._probe(probe_slot)
            if result.status == "ok":
                break
            failures.append(f"{isolation}: {result.detail}; {result.stderr.strip()}")
        else:
            raise SandboxError(f"bubblewrap ({self._bwrap}) cannot run a sandbox here: {failures}")
        return self._isolation_warnings(failures)

    def _isolation_warnings(self, failures: list[str]) -> list[str]:
        nested = "jobs may create nested user namespaces (more kernel attack surface)"
        if self._isolation == "drop":
            return [
                "this pool runs as root, and bubblewrap can forbid nested user namespaces "
                f"only inside a user namespace of its own: {nested}"
            ]
        if self._isolation == "userns" and os.geteuid() == 0:
            return [
                f"bubblewrap cannot run as root here ({failures[0]}): jobs run as host uid "
                "0 without capabilities, so they can read root-only files under "
                "readonly_paths (e.g. /etc/shadow) and leave set-uid-root files in their "
                "workspace"
            ]
        if self._isolation == "no-userns":
            return [
                f"bubblewrap cannot create a user namespace ({failures[0]}): jobs run as "
                f"host uid {os.geteuid()} without capabilities; {nested}"
            ]
        return []

    async def _probe(self, slot: Slot) -> ExecResult:
        with tempfile.TemporaryDirectory(prefix="agentmars-probe-") as workspace:
            job = Job("probe", Path(workspace), ExecSpec(command=["true"]), PROBE_TIMEOUT_S, 4096)
            return await self.execute(slot, job, cancel=asyncio.Event())

    async def execute(
        self,
        slot: Slot,
        job: Job,
        *,
        cancel: asyncio.Event,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        config = self._require_started()
        workspace, cwd = resolve_cwd(job.workspace, job.spec.cwd)
        check_workspaces_hidden(workspace, config.readonly_paths)
        if cancel.is_set() or self._closing.is_set():
            return self._result(slot, "cancelled", None, "cancelled before it started")
        if self._isolation == "drop" and workspace.stat().st_uid != SANDBOX_UID:
            await asyncio.to_thread(hand_over, workspace, SANDBOX_UID)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running.add(done)
        try:
            return await self._run(slot, job, workspace, cwd, cancel, on_output)
        finally:
            done.set_result(None)
            self._running.discard(done)

    def _require_started(self) -> SandboxConfig:
        if self._config is None:
            raise SandboxError("the process backend is not started")
        return self._config

    async def _run(
        self,
        slot: Slot,
        job: Job,
        workspace: Path,
        cwd: Path,
        cancel: asyncio.Event,
        on_output: OutputCallback | None,
    ) -> ExecResult:
        group = self._groups.get(slot.index)
        before = _Counters.read(group)
        protocol = _JobProtocol(job.output_cap_bytes, on_output)
        status_read, status_write = os.pipe()
        started = time.monotonic()
        try:
            transport = await self._spawn(slot, job, workspace, cwd, protocol, status_write)
        except BaseException:
            os.close(status_read)
            raise
        try:
            self._feed_stdin(transport, job.spec.stdin)
            ended_by = await self._wait_for_end(protocol.exited, job.timeout_s, cancel)
            if ended_by != "exit":
                await self._kill(transport, group, protocol.exited)
            survivors = await self._kill_leftovers(group)
            await self._drain(protocol)
        except BaseException:  # cancelled, or a bug: the job must not outlive execute()
            self._kill_now(transport, group)
            raise
        finally:
            transport.close()
            report = _Report.parse(_read_available(status_read))
            os.close(status_read)
        protocol.emit_markers()
        after = _Counters.read(group)
        outcome = self._outcome(ended_by, transport.get_returncode(), report, before, after, job)
        status, exit_status, details = outcome
        if survivors:
            details.append(f"{survivors} processes survived SIGKILL")
        cpu_s = _delta(after.cpu_s, before.cpu_s)
        return ExecResult(
            status=status,
            exit_status=exit_status,
            stdout=protocol.streams[1].text(),
            stderr=protocol.streams[2].text(),
            stdout_truncated=protocol.streams[1].dropped > 0,
            stderr_truncated=protocol.streams[2].dropped > 0,
            wall_s=time.monotonic() - started,
            cpu_s=report.cpu_s if cpu_s is None else cpu_s,
            slot=slot.index,
            cores=list(slot.cores),
            backend=self.name,
            detail="; ".join(details) or None,
        )

    async def _spawn(
        self,
        slot: Slot,
        job: Job,
        workspace: Path,
        cwd: Path,
        protocol: _JobProtocol,
        status_fd: int,
    ) -> asyncio.SubprocessTransport:
        """Start the job in its own session (so its process group can be killed) with
        the status pipe as its only inherited descriptor besides stdio."""
        env = sandbox_env(workspace, job.spec.env)
        if self._isolation == "none":
            argv = _launch.supervise_argv(
                self._python, _launch.__file__, status_fd=status_fd, cwd=str(cwd), uid=None,
                argv=job.spec.command,
            )  # fmt: skip
            popen_env = env
        else:
            argv, popen_env = self._bwrap_argv(job, workspace, cwd, env, status_fd), {}
        group = self._groups.get(slot.index)
        command = _launch.enter_argv(
            self._python,
            status_fd=status_fd,
            cores=slot.cores,
            procs_files=[str(path) for path in group.procs_files] if group else [],
            rlimits=self._rlimits,
            argv=argv,
        )
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: protocol,
                *command,
                stdin=asyncio.subprocess.PIPE
                if job.spec.stdin is not None
                else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=popen_env,
                cwd="/",
                start_new_session=True,
                pass_fds=(status_fd,),
            )
        finally:
            os.close(status_fd)
        return transport

    def _bwrap_argv(
        self, job: Job, workspace: Path, cwd: Path, env: dict[str, str], status_fd: int
    ) -> list[str]:
        """The bubblewrap command line: an empty root with the read-only paths, private
        /tmp, /dev and /proc, and the workspace as the only writable host path."""
        assert self._bwrap is not None and self._config is not None
        config = self._config
        size = str(config.memory_limit_mb * 1024 * 1024)
        argv = [self._bwrap, *self._identity_argv()]
        argv += [
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
        ]  # fmt: skip
        for name, value in env.items():
            argv += ["--setenv", name, value]
        # tmpfs first, so read-only paths under /tmp (a venv there) stay visible;
        # its pages count against the memory cgroup, --size bounds it without one.
        argv += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
        mounts = _MountPoints()
        for path in sorted(config.readonly_paths, key=lambda p: len(p.parts)):
            if path.exists():
                argv += mounts.bind("--ro-bind", path, path)
        argv += mounts.bind("--ro-bind", Path(_launch.__file__), Path(SANDBOX_INIT))
        argv += ["--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
        # NOTE: sysctl files check only the owner, and a job that is host uid 0 (the
        # "userns" fallback of a root pool) could write /proc/sys/kernel/core_pattern.
        argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
        argv += mounts.bind("--bind", workspace, workspace)
        argv += ["--remount-ro", "/", "--chdir", "/", "--"]
        # NOTE: the supervisor enters cwd inside the sandbox, so even a symlink swapped
        # in after resolve_cwd() can only lead to what the sandbox shows.
        return argv + _launch.supervise_argv(
            self._python,
            SANDBOX_INIT,
            status_fd=status_fd,
            cwd=str(cwd),
            uid=SANDBOX_UID if self._isolation == "drop" else None,
            argv=job.spec.command,
        )

    def _identity_argv(self) -> list[str]:
        """Who the job is; it has no capabilities in any mode."""
        if self._isolation == "drop":
            # The init keeps only what it needs to drop the job to SANDBOX_UID (which
            # clears those too); bubblewrap run by root keeps every capability otherwise.
            return ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        if self._isolation == "userns":
            # NOTE: --disable-userns: a nested user namespace would give the job every
            # capability there, and with them much more kernel attack surface.
            uid = str(SANDBOX_UID)
            return [
                "--unshare-user",
                "--uid",
                uid,
                "--gid",
                uid,
                "--disable-userns",
                "--cap-drop",
                "ALL",
            ]
        return ["--cap-drop", "ALL"]

    @staticmethod
    def _feed_stdin(transport: asyncio.SubprocessTransport, stdin: str | None) -> None:
        pipe = transport.get_pipe_transport(0)
        if stdin is None or pipe is None:
            return
        assert isinstance(pipe, asyncio.WriteTransport)
        pipe.write(stdin.encode())
        pipe.write_eof()

    async def _wait_for_end(
        self, exited: asyncio.Future[None], timeout_s: float, cancel: asyncio.Event
    ) -> EndedBy:
        cancelled = asyncio.ensure_future(cancel.wait())
        closing = asyncio.ensure_future(self._closing.wait())
        ends: set[asyncio.Future[Any]] = {exited, cancelled, closing}
        try:
            await asyncio.wait(ends, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
            closing.cancel()
        if exited.done():
            return "exit"
        if cancel.is_set():
            return "cancelled"
        return "closed" if self._closing.is_set() else "timeout"

    async def _kill(
        self,
        transport: asyncio.SubprocessTransport,
        group: SlotCgroup | None,
        exited: asyncio.Future[None],
    ) -> None:
        """Kill the whole tree: the session (bubblewrap, whose death takes the pid
        namespace down) and every process in the slot's cgroups; then wait for it."""
        self._kill_session(transport)
        if group is not None:
            await asyncio.to_thread(group.kill_all, KILL_TIMEOUT_S)
        try:
            await asyncio.wait_for(asyncio.shield(exited), KILL_TIMEOUT_S)
        except TimeoutError:
            log.error("job process %s did not exit after SIGKILL", transport.get_pid())

    @staticmethod
    def _kill_session(transport: asyncio.SubprocessTransport) -> None:
        # NOTE: only while the leader is unreaped: after that its pid, and so the
        # process group id, may belong to someone else. The child watcher reaps on
        # this thread, so nothing can reap between the check and the kill.
        if transport.get_returncode() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(transport.get_pid(), signal.SIGKILL)

    def _kill_now(self, transport: asyncio.SubprocessTransport, group: SlotCgroup | None) -> None:
        """The same kill, synchronously, for an execute() that ends by an exception."""
        self._kill_session(transport)
        if group is not None:
            group.kill_all(KILL_TIMEOUT_S)

    @staticmethod
    async def _kill_leftovers(group: SlotCgroup | None) -> int:
        """Processes the job left behind (only possible without bubblewrap: in the
        sandbox they die with its pid 1); returns how many survived SIGKILL."""
        if group is None or not group.pids():
            return 0
        await asyncio.to_thread(group.kill_all, KILL_TIMEOUT_S)
        return len(group.pids())

    @staticmethod
    async def _drain(protocol: _JobProtocol) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(protocol.closed), PIPE_DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.warning("output pipes still open after the job ended; closing them")

    def _outcome(
        self,
        ended_by: EndedBy,
        returncode: int | None,
        report: _Report,
        before: _Counters,
        after: _Counters,
        job: Job,
    ) -> tuple[ExecStatus, int | None, list[str]]:
        """Status, exit status and the reasons, in words, for how the job ended."""
        assert self._config is not None
        limits = []
        oom_kills = _delta(after.oom_kills, before.oom_kills)
        if oom_kills:
            limits.append(
                f"the out-of-memory killer ended {oom_kills:.0f} process(es): the slot's "
                f"memory limit of {self._config.memory_limit_mb} MB was reached"
            )
        refused = _delta(after.pids_limit_hits, before.pids_limit_hits)
        if refused:
            limits.append(
                f"{refused:.0f} fork(s) refused: the slot's limit of "
                f"{self._config.pids_limit} processes/threads was reached"
            )
        if ended_by == "timeout":
            return "timeout", -signal.SIGKILL, [f"timed out after {job.timeout_s:g} s", *limits]
        if ended_by in ("cancelled", "closed"):
            why = "cancelled" if ended_by == "cancelled" else "the sandbox backend was closed"
            return "cancelled", -signal.SIGKILL, [why, *limits]
        if report.error is not None:
            return "error", None, [f"the sandbox failed: {report.error}"]
        if report.wait_status is not None:
            code = os.waitstatus_to_exitcode(report.wait_status)
            if code >= 0:
                return ("ok" if code == 0 else "error"), code, limits
            return "killed", code, limits or [_signal_detail(-code)]
        if report.started or (returncode is not None and returncode < 0):
            # The supervisor itself died (by the OOM killer or a kill from outside).
            signum = _signal_of(returncode)
            why = "the sandbox's supervisor was killed before the command ended"
            return "killed", -signum if signum else returncode, limits or [why]
        return (
            "error",
            returncode,
            [f"the sandbox could not start the command (exit status {returncode}); see stderr"],
        )

    def _result(self, slot: Slot, status: ExecStatus, code: int | None, detail: str) -> ExecResult:
        return ExecResult(
            status=status,
            exit_status=code,
            stdout="",
            stderr="",
            wall_s=0.0,
            slot=slot.index,
            cores=list(slot.cores),
            backend=self.name,
            detail=detail,
        )

    async def release_session(self, session_id: str) -> None:
        """Nothing to drop: this backend keeps no state per session."""

    async def close(self) -> None:
        """Stop running jobs (they end ``cancelled``), then kill anything left in the
        slots' cgroups and remove them."""
        self._closing.set()
        if self._running:
            await asyncio.wait(set(self._running), timeout=KILL_TIMEOUT_S * 2)
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.close)
            self._cgroups = None
        self._groups.clear()


def _read_available(fd: int) -> str:
    """Whatever the status pipe holds, without blocking (every writer is gone by now,
    except after a failed kill)."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _signal_of(returncode: int | None) -> int | None:
    """The signal that ended the supervisor: from Popen (negative) or from bubblewrap,
    which exits 128+n when its child died of signal n."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    return returncode - 128 if returncode > 128 else None


def _signal_detail(signum: int) -> str:
    name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
    return f"ended by {name}, not sent by the sandbox (killed from outside, or by itself)"
