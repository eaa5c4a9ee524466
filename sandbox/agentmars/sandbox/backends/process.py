"""The ``process`` backend: each job runs under bubblewrap in fresh mount, pid, ipc,
uts and cgroup namespaces (and a user namespace unless the pool runs as root), in an
empty network namespace (its slot's when the pool runs as root, else a fresh one), sees
the host read-only except its own workspace, runs without capabilities and never as
host root, and is pinned to its slot's cores and confined by the slot's cgroups
(cpuset, memory, pids).

A job's processes, none of them Python nor a shell: bubblewrap and the sandbox init
(``sandbox_init.c``, a static C program built once per version of its source; see
``sandbox_init.py``) in two roles (a third, ``netns``, runs only when the backend
starts).

- The init's host role, spawned by the backend, moves itself into the slot's network
  namespace (a root pool's) and cgroups, pins itself to the slot's cores, sets its
  rlimits, then execs bubblewrap. Everything the job starts inherits all of that, so
  no process of the job ever runs unconfined (and no ``preexec_fn`` runs in a forked
  copy of the threaded event loop). If it cannot, it says why on the status pipe and
  exits having run nothing. It dies with the backend (a parent-death signal), and
  exits at once if the backend is gone already, so a job never starts unwatched.
- bubblewrap sets up the sandbox, loads the seccomp filter (``seccomp.py``: the
  kernel keyring, new namespaces, mounts and the rest of what container runtimes deny
  fail with EPERM) as its last step, and runs the init's pid 1 role (``--as-pid-1``:
  bubblewrap's own init can outlive bubblewrap, and is then left for the host's init
  to reap), from a descriptor the backend keeps open, so nothing is mounted for it.
  It closes every descriptor but stdio, runs the command as its child, reaps every
  orphan while it waits, and exits with the command's status; when it exits, the
  kernel kills the rest of the namespace.
- When the pool runs as root, pid 1 stays root, with no capability but CAP_SETUID,
  CAP_SETGID and CAP_SETPCAP, so that a job (``SANDBOX_UID``) can neither signal nor
  trace it; its child drops to ``SANDBOX_UID`` (no groups, no capabilities, an empty
  bounding set, no new privileges), and only then takes the job's environment, enters
  its working directory and execs the command. The environment is set only after the
  drop, so nothing the caller controls (``LD_PRELOAD``, ...) reaches a root process;
  the directory is entered after it too, as a workspace handed to that uid may be
  closed to root without capabilities. Without root, pid 1 already is the job's uid,
  and its child only takes the environment and the directory.

Exit status: the sandbox's pid 1 reports a death by signal n as exit code 128+n, as
shells (and the docker backend) do, so codes 129-192 read as status ``killed`` with
exit status -n. A command that exits with such a code on purpose (``exit 130``) is
therefore reported as killed by that signal (SIGINT). Timeouts, cancellations and
out-of-memory kills are told apart from that (the backend kills, the cgroup counts).
Without bubblewrap the command is the backend's direct child and its status is exact.

CPU time comes from the slot's cpuacct cgroup; without it, from the resource usage of
the backend's direct child (bubblewrap), which includes every process of the sandbox
that was reaped (by its pid 1, or by the kernel when the namespace died).

When the pool runs as root, jobs run as host uid ``SANDBOX_UID``; a session's
workspace is handed to that uid (recursively) before its first job, so files the pool
adds later must be created as that uid to be writable by jobs.

A root pool creates one network namespace per slot when it starts (``netns.py``) and
its jobs join it, instead of each job creating one (and the kernel tearing it down, on
the slot's CPUs): about 1 ms of a job's 8. It is what bubblewrap's ``--unshare-net``
gave each job: a loopback, up, and no other interface. Sharing it between the jobs of
a slot is safe: a slot runs one job at a time, and every process of a job is dead (or,
killed, runs no more code) before the next starts: it died with the job's pid
namespace, and the slot's cgroup is swept. So no socket outlives its job, abstract unix
sockets (named per network namespace) included, and with TCP TIME_WAIT turned off
there, no closed connection either. A job has no capability over the namespace (the
host's user namespace owns it), so it cannot change it for the next. What does carry
over are the kernel's counters (lo's packets, ``/proc/net/snmp``): how much loopback
traffic earlier jobs of the slot made, not what. A job running in another slot at the
same time is in another namespace and sees nothing of it. Without root, the pool
could only join a namespace it made inside a user namespace of its own, which
bubblewrap's would have to nest in: each job gets a new one from bubblewrap.

Where something is unavailable (no bubblewrap, no user namespaces, cgroup controllers
not writable) ``start()`` falls back to weaker means and returns a warning for each.
The read-only paths are looked at once, when the backend starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentmars.sandbox.backends import netns, sandbox_init, seccomp
from agentmars.sandbox.backends.base import Job, OutputCallback, Slot
from agentmars.sandbox.backends.output import CappedOutput
from agentmars.sandbox.cgroups import CgroupManager, SlotCgroup
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.spec import (
    ExecResult,
    ExecSpec,
    ExecStatus,
    SandboxError,
)
from agentmars.sandbox.threads import in_thread
from agentmars.sandbox.workspaces import resolve_cwd, within

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
"""nobody: the uid and gid of jobs in the sandbox (and on the host, for a root pool)."""
EXEC_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
KILL_TIMEOUT_S = 5.0
PIPE_DRAIN_TIMEOUT_S = 2.0
"""How long to keep reading output after the job and its processes are gone (only a
process that escaped every kill could hold the pipes open longer)."""
PROBE_TIMEOUT_S = 30.0
_READ_CHUNK = 65536

Isolation = Literal["drop", "userns", "no-userns", "none"]
"""How jobs are isolated. ``drop``: bubblewrap run by root, the sandbox init drops the
job to ``SANDBOX_UID`` (a user namespace would map the job to host root, which may read
every root-only file that is visible, e.g. /etc/shadow). ``userns``: bubblewrap in a
user namespace, the job is the pool's own unprivileged uid. ``no-userns``: bubblewrap
without one (set-uid bubblewrap). ``none``: no sandbox at all."""
EndedBy = Literal["exit", "timeout", "cancelled", "closed"]


class _JobOutput:
    """Reads the job's stdout and stderr pipes as data arrives into their cappers
    (which stream the kept part to ``on_output``), and tells when both pipes are
    closed."""

    def __init__(self, cap: int, on_output: OutputCallback | None) -> None:
        self._loop = asyncio.get_running_loop()
        self.stdout = CappedOutput("stdout", cap, on_output)
        self.stderr = CappedOutput("stderr", cap, on_output)
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._pipes: dict[int, CappedOutput] = {}

    def watch(self, fd: int, stream: CappedOutput) -> None:
        """Read the pipe ``fd`` (ours from now on) into ``stream``."""
        os.set_blocking(fd, False)
        self._pipes[fd] = stream
        self._loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        if not data:
            self._stop(fd)
            return
        self._pipes[fd].feed(data)

    def _stop(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        del self._pipes[fd]
        if not self._pipes and not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        """Stop reading (the job is gone, or its output is no longer wanted)."""
        for fd in list(self._pipes):
            self._stop(fd)

    def finish(self) -> None:
        """Stream the truncation markers (the job has ended normally)."""
        self.stdout.finish()
        self.stderr.finish()


class _HostProcess:
    """The process the backend spawns (the sandbox init's host role, which becomes
    bubblewrap or, without it, the command) and its stdin. It is reaped here with
    ``os.wait4`` rather than by asyncio's child watcher, for its resource usage: its own
    and that of every process it reaped."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: int | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._popen = popen
        self._stdin = stdin
        self._writer: asyncio.WriteTransport | None = None
        self.pid = popen.pid
        self.returncode: int | None = None
        self.cpu_s: float | None = None
        self.exited: asyncio.Future[None] = self._loop.create_future()
        self._pidfd = os.pidfd_open(self.pid)
        self._loop.add_reader(self._pidfd, self._reap)

    @classmethod
    def spawn(
        cls,
        argv: list[str],
        output: _JobOutput,
        *,
        with_stdin: bool,
        env: dict[str, str],
        cwd: str,
        pass_fds: tuple[int, ...],
    ) -> _HostProcess:
        """Start ``argv`` in its own session (so its process group can be killed), its
        stdout and stderr read into ``output``; its stdin a pipe to ``feed``, or
        /dev/null."""
        stdin, stdin_w = _stdin_for(with_stdin)
        stdout_r, stdout = os.pipe()
        stderr_r, stderr = os.pipe()
        ours = [fd for fd in (stdin_w, stdout_r, stderr_r) if fd is not None]
        try:
            popen = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=cwd,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (stdin, stdout, stderr):
                os.close(fd)
        output.watch(stdout_r, output.stdout)
        output.watch(stderr_r, output.stderr)
        try:
            return cls(popen, stdin_w)
        except BaseException:
            if stdin_w is not None:
                os.close(stdin_w)
            raise

    async def feed(self, stdin: str) -> None:
        """Write ``stdin`` to the process, then close its stdin (in the background)."""
        fd, self._stdin = self._stdin, None
        assert fd is not None
        pipe = open(fd, "wb", buffering=0)  # noqa: SIM115 (the transport closes it)
        transport, _ = await self._loop.connect_write_pipe(asyncio.Protocol, pipe)
        assert isinstance(transport, asyncio.WriteTransport)
        self._writer = transport
        transport.write(stdin.encode())
        transport.write_eof()

    def kill(self) -> None:
        """SIGKILL the process group of the spawned process."""
        # NOTE: only while it is unreaped: after that its pid, and so the process
        # group id, may belong to someone else. _reap runs on this thread, so nothing
        # can reap between the check and the kill.
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def _reap(self) -> None:
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by a waitpid(-1) elsewhere in the process
            log.warning("job process %d was reaped elsewhere; its status is lost", self.pid)
            pid, status, usage = self.pid, 255 << 8, None
        if pid == 0:
            return
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = os.waitstatus_to_exitcode(status)
        self._popen.returncode = self.returncode  # so Popen never waits for the pid
        self.cpu_s = None if usage is None else usage.ru_utime + usage.ru_stime
        self.exited.set_result(None)

    def close(self) -> None:
        """Close stdin, dropping what was not written yet (the job is gone)."""
        if self._stdin is not None:
            os.close(self._stdin)
            self._stdin = None
        if self._writer is not None and not self._writer.is_closing():
            self._writer.abort()


def _stdin_for(with_stdin: bool) -> tuple[int, int | None]:
    """A child's stdin and the end we write to: a pipe, or /dev/null and nothing (not
    an empty pipe: tools such as ripgrep search a pipe on stdin, not their files)."""
    if with_stdin:
        return os.pipe()
    return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None


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


def check_workspaces_hidden(workspace_root: Path, readonly_paths: list[Path]) -> None:
    """Refuse a read-only path that contains a workspace or lies in one: every sandbox
    would see other sessions' files. Both sides resolved (symlinks followed)."""
    for path in readonly_paths:
        if within(workspace_root, path) or within(path, workspace_root):
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
    """Mount arguments, each preceded by ``--dir`` (mode 0755) for the mount point's
    parents: bubblewrap would create them with the host's modes (/root: 0700), which
    a job running as another uid could not pass."""

    def __init__(self) -> None:
        self.read_only: list[Path] = []
        self.made = {"/", "/tmp"}

    def copy(self) -> _MountPoints:
        copied = _MountPoints()
        copied.read_only, copied.made = list(self.read_only), set(self.made)
        return copied

    def bind(self, option: str, source: Path, dest: Path) -> list[str]:
        argv = self._parents(dest)
        if option == "--ro-bind":
            self.read_only.append(dest)
        return [*argv, option, str(source), str(dest)]

    def link(self, target: Path, dest: Path) -> list[str]:
        argv = self._parents(dest)
        self.read_only.append(dest)  # the root is remounted read-only
        return [*argv, "--symlink", str(target), str(dest)]

    def _parents(self, dest: Path) -> list[str]:
        argv = []
        for parent in reversed(dest.parents):
            if str(parent) in self.made or any(within(parent, r) for r in self.read_only):
                continue
            self.made.add(str(parent))
            argv += ["--perms", "0755", "--dir", str(parent)]
        return argv


def _link_target(path: Path, readonly_paths: list[Path]) -> Path | None:
    """Where ``path`` leads if it is a symlink into another read-only path that is
    mounted as it is (e.g. /bin -> usr/bin where /usr is merged): a symlink shows the
    job the same files as a bind mount does, and costs bubblewrap much less."""
    if not path.is_symlink():
        return None
    target = path.resolve()
    mounted = [p for p in readonly_paths if p != path and p.exists() and p.resolve() == p]
    return target if any(within(target, p) for p in mounted) else None


def _readonly_mounts(readonly_paths: list[Path]) -> tuple[list[str], _MountPoints]:
    """The bubblewrap arguments that show the read-only paths (shallowest first, so a
    deeper one is mounted on top), and the mount points they made."""
    mounts = _MountPoints()
    argv = []
    for path in sorted(readonly_paths, key=lambda p: len(p.parts)):
        target = _link_target(path, readonly_paths)
        if target is not None:
            argv += mounts.link(target, path)
        elif path.exists():
            argv += mounts.bind("--ro-bind", path, path)
    return argv, mounts


def sandbox_env(workspace: Path, extra: dict[str, str]) -> dict[str, str]:
    """The job's environment, built from scratch (nothing of the host is inherited)."""
    path = [str(Path(sys.prefix) / "bin"), *EXEC_PATH]
    env = {"PATH": ":".join(path), "HOME": str(workspace), "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    return env | extra


class ProcessBackend:
    """Runs jobs as local processes under bubblewrap; see the module docstring."""

    name = "process"

    def __init__(self, bwrap: str = "bwrap", *, cgroups: bool = True, compiler: str = "cc") -> None:
        """``bwrap``: the bubblewrap executable (a name looked up on PATH, or a path);
        ``cgroups``: False confines jobs without cgroups (rlimits, affinity), as on a
        host where they are not writable; ``compiler``: the C compiler that builds the
        sandbox init where no build of its current source is cached."""
        self._bwrap_name = bwrap
        self._use_cgroups = cgroups
        self._compiler = compiler
        self._bwrap: str | None = None
        self._init: str | None = None
        self._init_fd: int | None = None
        self._seccomp: Path | None = None
        """The compiled seccomp filter (``seccomp.py``) bubblewrap loads; None: none."""
        self._config: SandboxConfig | None = None
        self._isolation: Isolation = "none"
        self._cgroups: CgroupManager | None = None
        self._groups: dict[int, SlotCgroup] = {}
        self._rlimits: dict[int, int] = {}
        self._readonly_resolved: list[Path] = []
        self._readonly_argv: list[str] = []
        self._mount_points = _MountPoints()
        self._closing = asyncio.Event()
        self._running: set[asyncio.Future[None]] = set()
        self._idle_counters: dict[int, _Counters] = {}
        """Per slot, its counters when its last job ended and left no process behind."""
        self._netns: dict[int, int] = {}
        """Per slot, a descriptor of the network namespace its jobs join ("drop" only;
        see ``netns``); without one, each job gets a new one from bubblewrap."""

    async def start(self, config: SandboxConfig, slots: list[Slot]) -> list[str]:
        self._readonly_resolved = [path.resolve() for path in config.readonly_paths]
        check_workspaces_hidden(config.workspace_root.resolve(), self._readonly_resolved)
        init = await in_thread(sandbox_init.ensure_built, self._compiler)
        self._init, self._init_fd = str(init), os.open(init, os.O_RDONLY | os.O_CLOEXEC)
        self._config = config
        self._readonly_argv, self._mount_points = _readonly_mounts(config.readonly_paths)
        warnings = await self._load_seccomp()
        warnings += self._set_up_cgroups(config, slots)
        try:
            warnings += await self._choose_isolation(slots)
        except BaseException:
            await self.close()
            raise
        for warning in warnings:
            log.warning("process sandbox: %s", warning)
        return warnings

    async def _load_seccomp(self) -> list[str]:
        """The seccomp filter, built if need be; without it, a warning."""
        try:
            self._seccomp = await in_thread(seccomp.ensure_filter, self._compiler)
        except SandboxError as exc:
            return [
                f"no seccomp filter ({exc}): jobs can use the kernel keyring, which every "
                "session shares (one host uid), create nested namespaces, and reach the "
                "rest of the kernel's attack surface that container runtimes deny"
            ]
        return []

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
        self._rlimits = {resource.RLIMIT_CORE: 0}  # core files would land in the workspace
        warnings = []
        why = manager.unavailable
        if "cpuset" in why:
            warnings.append(
                f"cgroup cpuset controller not writable ({why['cpuset']}): cores pinned by "
                "CPU affinity only, which a job may widen to every core"
            )
        if "memory" in why:
            self._rlimits[resource.RLIMIT_AS] = config.memory_limit_mb * 1024 * 1024
            warnings.append(
                f"cgroup memory controller not writable ({why['memory']}): memory limited "
                "by RLIMIT_AS only (address space per process, not the job's total)"
            )
        if "pids" in why:
            self._rlimits[resource.RLIMIT_NPROC] = config.pids_limit
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

    async def _choose_isolation(self, slots: list[Slot]) -> list[str]:
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
            failure = await self._try_isolation(isolation, slots)
            if failure is None:
                break
            failures.append(f"{isolation}: {failure}")
        else:
            raise SandboxError(f"bubblewrap ({self._bwrap}) cannot run a sandbox here: {failures}")
        return self._isolation_warnings(failures)

    def _isolation_warnings(self, failures: list[str]) -> list[str]:
        nested = "jobs may create nested user namespaces (more kernel attack surface)"
        if self._isolation == "drop" and self._seccomp is None:
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
        if self._isolation == "no-userns" and self._seccomp is None:
            return [
                f"bubblewrap cannot create a user namespace ({failures[0]}): jobs run as "
                f"host uid {os.geteuid()} without capabilities; {nested}"
            ]
        return []

    async def _try_isolation(self, isolation: Isolation, slots: list[Slot]) -> str | None:
        """Set up ``isolation`` and run a probe job under it; why it failed, or None."""
        self._isolation = isolation
        if isolation == "drop":
            await self._create_netns(slots)
        result = await self._probe(slots[0])
        if result.status == "ok":
            return None
        self._close_netns()
        return f"{result.detail}; {result.stderr.strip()}"

    async def _create_netns(self, slots: list[Slot]) -> None:
        """A network namespace per slot (see ``netns``), or none, and a log line: each
        job then gets a new one from bubblewrap, as isolated, only slower."""
        # NOTE: "drop" only (see the module docstring): joining one takes CAP_SYS_ADMIN
        # over the user namespace that owns it, which the host role has as root.
        assert self._init is not None
        try:
            for slot in slots:
                self._netns[slot.index] = await in_thread(netns.create, self._init)
        except SandboxError as exc:
            self._close_netns()
            log.warning("process sandbox: no network namespaces per slot (%s): one per job", exc)

    def _close_netns(self) -> None:
        for fd in self._netns.values():
            os.close(fd)
        self._netns.clear()

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
        self._require_started()
        workspace, cwd = resolve_cwd(job.workspace, job.spec.cwd)
        check_workspaces_hidden(workspace, self._readonly_resolved)
        if cancel.is_set() or self._closing.is_set():
            return self._result(slot, "cancelled", None, "cancelled before it started")
        if self._isolation == "drop" and workspace.stat().st_uid != SANDBOX_UID:
            await in_thread(hand_over, workspace, SANDBOX_UID)
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
        output = _JobOutput(job.output_cap_bytes, on_output)
        started = time.monotonic()
        # Read before the job exists, so that all it does counts; an empty slot's
        # counters do not move, so those its last job ended with serve as well.
        before = self._idle_counters.pop(slot.index, None) or _Counters.read(group)
        process, status_fd = self._spawn(job, slot, workspace, cwd, group, output)
        try:
            if job.spec.stdin is not None:
                await process.feed(job.spec.stdin)
            ended_by = await self._wait_for_end(process.exited, job.timeout_s, cancel)
            if ended_by != "exit":
                await self._kill(process, group)
            survivors = await self._kill_leftovers(group)
            await self._drain(output)
        except BaseException:  # cancelled, or a bug: the job must not outlive execute()
            self._kill_now(process, group)
            raise
        finally:
            process.close()
            output.close()
            reports = _read_available(status_fd)
        output.finish()
        after = _Counters.read(group)
        if not survivors:
            self._idle_counters[slot.index] = after
        outcome = self._outcome(ended_by, process.returncode, reports, before, after, job)
        status, exit_status, details = outcome
        if survivors:
            details.append(f"{survivors} processes survived SIGKILL")
        cpu_s = _delta(after.cpu_s, before.cpu_s)
        return ExecResult(
            status=status,
            exit_status=exit_status,
            stdout=output.stdout.text(),
            stderr=output.stderr.text(),
            stdout_truncated=output.stdout.truncated,
            stderr_truncated=output.stderr.truncated,
            wall_s=time.monotonic() - started,
            cpu_s=process.cpu_s if cpu_s is None else cpu_s,
            slot=slot.index,
            cores=list(slot.cores),
            backend=self.name,
            detail="; ".join(details) or None,
        )

    def _spawn(
        self,
        job: Job,
        slot: Slot,
        workspace: Path,
        cwd: Path,
        group: SlotCgroup | None,
        output: _JobOutput,
    ) -> tuple[_HostProcess, int]:
        """The sandbox init's host role, which confines itself, then execs bubblewrap
        (or, without it, the command); and the read end of the status pipe, where it
        reports failing to, and bubblewrap writes its JSON status."""
        env = sandbox_env(workspace, job.spec.env)
        status_read, report = os.pipe()
        ours = [report]  # closed once the host role has them
        shared_net = self._netns.get(slot.index)
        try:
            argv = self._host_argv(slot, group, report, shared_net)
            if self._isolation == "none":
                argv += job.spec.command
                spawn_env, spawn_cwd, passed = env | {"PWD": str(cwd)}, str(cwd), [report]
            else:
                status_fd = os.dup(report)  # bubblewrap's: the host role closes its own
                ours.append(status_fd)
                filter_fd = self._open_seccomp()
                if filter_fd is not None:
                    ours.append(filter_fd)
                argv += self._bwrap_argv(job, workspace, cwd, env, status_fd, shared_net, filter_fd)
                assert self._init_fd is not None
                shared = [] if shared_net is None else [shared_net]
                spawn_env, spawn_cwd, passed = {}, "/", [*ours, self._init_fd, *shared]
            process = _HostProcess.spawn(
                argv,
                output,
                with_stdin=job.spec.stdin is not None,
                env=spawn_env,
                cwd=spawn_cwd,
                pass_fds=tuple(passed),
            )
        except BaseException:
            os.close(status_read)
            raise
        finally:
            for fd in ours:
                os.close(fd)
        return process, status_read

    def _open_seccomp(self) -> int | None:
        """The filter for one job: bubblewrap reads it to the end, so each job needs a
        descriptor (and file offset) of its own."""
        if self._seccomp is None:
            return None
        return os.open(self._seccomp, os.O_RDONLY | os.O_CLOEXEC)

    def _host_argv(
        self, slot: Slot, group: SlotCgroup | None, report: int, shared_net: int | None
    ) -> list[str]:
        """The sandbox init's host role, up to the program it execs (see its source)."""
        assert self._init is not None
        argv = [self._init, "host", "--parent", str(os.getpid()), "--report", str(report)]
        argv += ["--cpus", ",".join(map(str, slot.cores))]
        for limit, value in self._rlimits.items():
            argv += ["--rlimit", f"{limit}={value}"]
        for path in group.join_files if group else ():
            argv += ["--join", str(path)]
        if shared_net is not None:
            argv += ["--netns", str(shared_net)]
        return [*argv, "--"]

    def _bwrap_argv(
        self,
        job: Job,
        workspace: Path,
        cwd: Path,
        env: dict[str, str],
        status_fd: int,
        shared_net: int | None,
        filter_fd: int | None,
    ) -> list[str]:
        """The bubblewrap command line: an empty root with the read-only paths, private
        /tmp, /dev and /proc, and the workspace as the only writable host path; a new
        network namespace unless the host role joined the slot's; the seccomp filter
        (``filter_fd``), which bubblewrap applies last, just before it runs pid 1."""
        assert self._bwrap is not None and self._config is not None
        size = str(self._config.memory_limit_mb * 1024 * 1024)
        argv = [self._bwrap, *self._identity_argv()]
        if shared_net is None:
            argv.append("--unshare-net")
        argv += [
            "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
            "--json-status-fd", str(status_fd),
        ]  # fmt: skip
        if filter_fd is not None:
            argv += ["--seccomp", str(filter_fd)]
        # tmpfs first, so read-only paths under /tmp (a venv there) stay visible;
        # its pages count against the memory cgroup, --size bounds it without one.
        argv += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp", *self._readonly_argv]
        argv += ["--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
        # NOTE: sysctl files check only the owner, and a job that is host uid 0 (the
        # "userns" fallback of a root pool) could write /proc/sys/kernel/core_pattern.
        argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
        argv += self._mount_points.copy().bind("--bind", workspace, workspace)
        argv += ["--remount-ro", "/", "--chdir", "/", "--"]
        return argv + self._pid1_argv(job, cwd, env)

    def _pid1_argv(self, job: Job, cwd: Path, env: dict[str, str]) -> list[str]:
        """The sandbox init's pid 1 role, which runs the command (see its source)."""
        # NOTE: the init enters cwd inside the sandbox, so even a symlink swapped in
        # after resolve_cwd() can only lead to what the sandbox shows.
        # NOTE: run from the descriptor it inherits (and closes), not mounted: one
        # mount less for bubblewrap, which reads the whole mount table after each.
        argv = [f"/proc/self/fd/{self._init_fd}", "pid1", "--cwd", str(cwd)]
        if self._isolation == "drop":
            argv += ["--drop", str(SANDBOX_UID)]
        for name, value in env.items():
            argv += ["--env", f"{name}={value}"]
        return [*argv, "--", *job.spec.command]

    def _identity_argv(self) -> list[str]:
        """Who the job is; it has no capabilities in any mode."""
        if self._isolation == "drop":
            # pid 1 keeps only what the init needs to drop the job to SANDBOX_UID and
            # empty its bounding set; bubblewrap run by root keeps every capability
            # otherwise.
            kept = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
            return ["--cap-drop", "ALL", *(arg for cap in kept for arg in ("--cap-add", cap))]
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
        if self._closing.is_set():
            return "closed"
        return "cancelled" if cancel.is_set() else "timeout"

    async def _kill(self, process: _HostProcess, group: SlotCgroup | None) -> None:
        """Kill the whole tree: the session (bubblewrap, whose death takes the pid
        namespace down) and every process in the slot's cgroups; then wait for it."""
        process.kill()
        if group is not None:
            await in_thread(group.kill_all, KILL_TIMEOUT_S)
        try:
            await asyncio.wait_for(asyncio.shield(process.exited), KILL_TIMEOUT_S)
        except TimeoutError:
            log.error("job process %s did not exit after SIGKILL", process.pid)

    def _kill_now(self, process: _HostProcess, group: SlotCgroup | None) -> None:
        """The same kill, synchronously, for an execute() that ends by an exception."""
        process.kill()
        if group is not None:
            group.kill_all(KILL_TIMEOUT_S)

    @staticmethod
    async def _kill_leftovers(group: SlotCgroup | None) -> int:
        """Processes the job left behind (only possible without bubblewrap: in the
        sandbox they die with its pid 1); returns how many survived SIGKILL."""
        if group is None or group.is_empty():
            return 0
        await in_thread(group.kill_all, KILL_TIMEOUT_S)
        return len(group.pids())

    @staticmethod
    async def _drain(output: _JobOutput) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(output.closed), PIPE_DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.warning("output pipes still open after the job ended; closing them")

    def _outcome(
        self,
        ended_by: EndedBy,
        returncode: int | None,
        reports: str,
        before: _Counters,
        after: _Counters,
        job: Job,
    ) -> tuple[ExecStatus, int | None, list[str]]:
        """Status, exit status and the reasons, in words, for how the job ended;
        ``reports``: what the status pipe holds (see ``_spawn``)."""
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
        status = _parse_reports(reports)
        if "unconfined" in status:
            return "error", None, [f"the sandbox failed: {status['unconfined']}"]
        assert returncode is not None
        sandboxed = self._isolation != "none"
        if sandboxed and returncode >= 0 and "exit-code" not in status:
            why = f"the sandbox could not start the command (exit status {returncode}); see stderr"
            return "error", returncode, [why]
        if sandboxed and 128 < returncode <= 128 + signal.SIGRTMAX:  # see the docstring
            signum = returncode - 128
            return "killed", -signum, limits or [_signal_detail(signum, exit_code=returncode)]
        if returncode >= 0:
            return ("ok" if returncode == 0 else "error"), returncode, limits
        return "killed", returncode, limits or [_signal_detail(-returncode)]

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

    async def adopt(self, workspace: Path) -> None:
        """Jobs run as another uid: files the host's process made (root's, often
        0600) are handed to it, the whole tree, as before a workspace's first job."""
        if self._isolation == "drop":
            await in_thread(hand_over, workspace, SANDBOX_UID)

    async def release_session(self, session_id: str) -> None:
        """Nothing to drop: this backend keeps no state per session."""

    async def close(self) -> None:
        """Stop running jobs (they end ``cancelled``), then kill anything left in the
        slots' cgroups and remove them."""
        self._closing.set()
        if self._running:
            await asyncio.wait(set(self._running), timeout=KILL_TIMEOUT_S * 2)
        if self._cgroups is not None:
            await in_thread(self._cgroups.close)
            self._cgroups = None
        self._groups.clear()
        self._close_netns()
        if self._init_fd is not None:
            os.close(self._init_fd)
            self._init_fd = None


def _read_available(fd: int) -> str:
    """Whatever a pipe holds, without blocking (every writer is gone by now, except
    after a failed kill); closes it."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, _READ_CHUNK):
            chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _parse_reports(text: str) -> dict[str, Any]:
    """The JSON lines on the status pipe, merged: the host init's ``unconfined`` (why
    it could not confine itself; it ran nothing), and bubblewrap's status, with an
    ``exit-code`` only if it ran its command (the sandbox's pid 1), not when it could
    not set the sandbox up. Only these two write there (bubblewrap closes the pipe in
    the sandbox)."""
    merged: dict[str, Any] = {}
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError):
            merged.update(json.loads(line))
    return merged


def _signal_detail(signum: int, exit_code: int | None = None) -> str:
    """Why a job ended by a signal we did not send; ``exit_code``: the sandbox's
    report of it, which ``exit(exit_code)`` would have given too."""
    name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
    detail = f"ended by {name}, not sent by the sandbox (killed from outside, or by itself)"
    if exit_code is not None:
        detail += f"; or it exited with status {exit_code}, which reads the same"
    return detail
