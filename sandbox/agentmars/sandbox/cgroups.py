"""Per-slot cgroups for the process backend: cpuset (the slot's cores), memory, pids
and CPU accounting, on cgroup v1 (one hierarchy per controller) or v2 (one tree).

Each pool gets ``<mount>/agentmars/<pool id>/slot-<n>`` in every hierarchy it can
write; what it cannot write is reported in ``CgroupManager.unavailable`` so the
backend can fall back (rlimits) and say so. The pool id names the owning process
(``<pid>-<pid namespace inode>-<random>``), so groups a killed pool left behind are
removed by the next pool that starts.

    manager = CgroupManager.detect()
    group = manager.create_slot(0, (1,), memory_limit_mb=512, pids_limit=64)
    group.add(pid); group.cpu_seconds(); group.kill_all()
    manager.close()
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
MOUNTS_TABLE = Path("/proc/self/mounts")
Controller = Literal["cpuset", "memory", "pids", "cpuacct"]
CONTROLLERS: tuple[Controller, ...] = ("cpuset", "memory", "pids", "cpuacct")
V2_ENABLED: tuple[Controller, ...] = ("cpuset", "memory", "pids")
"""Controllers a v2 pool enables in ``cgroup.subtree_control``; CPU time needs none
(``cpu.stat`` exists in every v2 group)."""
KILL_TIMEOUT_S = 5.0
REMOVE_TIMEOUT_S = 2.0
_POLL_S = 0.005
_SMALL_FILE = 65536


@dataclass(frozen=True)
class Hierarchy:
    """Where each controller is mounted: v1 mounts one hierarchy per controller (some
    co-mounted, e.g. ``cpu,cpuacct``), v2 one unified tree for all of them."""

    version: Literal[1, 2]
    mounts: Mapping[Controller, Path]

    @classmethod
    def unified(cls, root: Path) -> Hierarchy:
        return cls(2, {controller: root for controller in CONTROLLERS})


def detect_hierarchy(mounts_table: str | None = None) -> Hierarchy | None:
    """The host's main cgroup hierarchy: v2 when ``/sys/fs/cgroup`` itself is a
    cgroup2 mount (the ``stat -f`` type, read from the mount table), else the v1
    controller mounts; None without either. A hybrid host's ``unified`` v2 tree
    (no controllers) is ignored in favour of v1."""
    table = MOUNTS_TABLE.read_text() if mounts_table is None else mounts_table
    v1: dict[Controller, Path] = {}
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint, fstype, options = Path(_unescape(fields[1])), fields[2], fields[3]
        if fstype == "cgroup2" and mountpoint == CGROUP_ROOT:
            return Hierarchy.unified(mountpoint)
        if fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options.split(","):
                    v1.setdefault(controller, mountpoint)
    return Hierarchy(1, v1) if v1 else None


def _unescape(field: str) -> str:
    """Mount table fields escape space, tab, newline and backslash as octal."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def _read(path: Path) -> str:
    """A small file, read in one call."""
    # NOTE: raw reads and writes: several run per job, and a buffered text file
    # costs about twice as much.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, _SMALL_FILE).decode().strip()
    finally:
        os.close(fd)


def _write(path: Path, value: str) -> None:
    # NOTE: one write() per value: cgroup files act on each write call.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _flat_value(path: Path) -> int | None:
    """A file holding one number (pids.current); None where unreadable."""
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return None


def _flat_key(path: Path, key: str) -> int | None:
    """A counter from a ``key value`` file (memory.events, oom_control, pids.events)."""
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except OSError:
        return None
    return None


class SlotCgroup:
    """One slot's groups: one directory per v1 hierarchy, a single one on v2 (fixed
    when created, so the files derived from them are computed once)."""

    def __init__(self, index: int, version: Literal[1, 2], dirs: Mapping[Controller, Path]) -> None:
        self.index = index
        self.version = version
        self.dirs = dict(dirs)

    @property
    def controllers(self) -> frozenset[Controller]:
        return frozenset(self.dirs)

    @functools.cached_property
    def procs_files(self) -> list[Path]:
        """The files a process writes its pid to, to join every group of the slot."""
        return [directory / "cgroup.procs" for directory in self._unique_dirs()]

    @functools.cached_property
    def join_files(self) -> list[Path]:
        """The files a process writes ``0`` to, to join every group of the slot itself.
        On v1 these are ``tasks``: a thread that moves itself skips the lock that
        moving another process takes, which can wait for an RCU grace period (ms)."""
        name = "tasks" if self.version == 1 else "cgroup.procs"
        return [directory / name for directory in self._unique_dirs()]

    def _unique_dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into every group of the slot."""
        for procs in self.procs_files:
            _write(procs, str(pid))

    def pids(self) -> set[int]:
        """Processes in the slot, in any of its groups (zombies are not listed)."""
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                found.update(int(pid) for pid in procs.read_text().split())
        return found

    def is_empty(self) -> bool:
        """No process in the slot. Reads the pids controller's counter where there is
        one, which is much cheaper than listing members (it counts zombies too, so a
        non-zero count is checked against the lists)."""
        directory = self.dirs.get("pids")
        if directory is not None and _flat_value(directory / "pids.current") == 0:
            return True
        return not self.pids()

    def kill_all(self, timeout_s: float = KILL_TIMEOUT_S) -> bool:
        """SIGKILL every process in the slot until none is left (forks racing the kill
        included); False if some are still there at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > deadline:
                log.error("slot %d: %d processes survived SIGKILL", self.index, len(pids))
                return False
            self._signal_members(pids)
            time.sleep(_POLL_S)

    def _signal_members(self, pids: Iterable[int]) -> None:
        kill_file = self._unique_dirs()[0] / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            _write(kill_file, "1")  # atomic: the kernel kills forks in flight too
            return
        # NOTE: a pid read from cgroup.procs may exit and be reused by an unrelated
        # host process before we signal it (a fork bomb wraps the pid space fast). A
        # pidfd pins the process; it is signalled only if the pid is still listed
        # after the pidfd was opened, i.e. the pidfd names a member of this slot.
        pidfds: dict[int, int] = {}
        try:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    pidfds[pid] = os.pidfd_open(pid)
            members = self.pids()
            for pid, pidfd in pidfds.items():
                if pid in members:
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            for pidfd in pidfds.values():
                os.close(pidfd)

    def cpu_seconds(self) -> float | None:
        """CPU time used by every process that ever ran in the slot (cumulative)."""
        directory = self.dirs.get("cpuacct")
        if directory is None:
            return None
        if self.version == 2:
            usage = _flat_key(directory / "cpu.stat", "usage_usec")
            return None if usage is None else usage / 1e6
        try:
            return int(_read(directory / "cpuacct.usage")) / 1e9
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int | None:
        """Processes the out-of-memory killer ended in the slot (cumulative)."""
        directory = self.dirs.get("memory")
        if directory is None:
            return None
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        return _flat_key(directory / name, "oom_kill")

    def pids_limit_hits(self) -> int | None:
        """Forks refused because the slot's pids limit was reached (cumulative)."""
        directory = self.dirs.get("pids")
        return None if directory is None else _flat_key(directory / "pids.events", "max")

    def remove(self, timeout_s: float = REMOVE_TIMEOUT_S) -> bool:
        """Remove the slot's (empty) groups; a group whose last process is still
        exiting is busy for a moment, so retry until the deadline."""
        return all(_rmdir(directory, timeout_s) for directory in self._unique_dirs())


def _rmdir(directory: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            directory.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if time.monotonic() > deadline:
                log.warning("cannot remove cgroup %s: %s", directory, exc.strerror)
                return False
            time.sleep(_POLL_S)


class CgroupManager:
    """Creates and removes one pool's slot groups; records what it could not set up."""

    def __init__(self, hierarchy: Hierarchy | None, pool_id: str | None = None) -> None:
        self.hierarchy = hierarchy
        self.pool_id = pool_id or f"{os.getpid()}-{_pid_namespace()}-{secrets.token_hex(4)}"
        self.unavailable: dict[Controller, str] = {}
        """Controller -> why it cannot be used (filled as groups are created)."""
        self.notes: list[str] = []
        """Partial set-up worth a warning (e.g. swap not limited)."""
        self._pool_dirs: dict[Controller, Path] = {}
        self._slots: list[SlotCgroup] = []
        if hierarchy is None:
            for controller in CONTROLLERS:
                self.unavailable[controller] = "no cgroup hierarchy in use"

    @classmethod
    def detect(cls, pool_id: str | None = None) -> CgroupManager:
        return cls(detect_hierarchy(), pool_id)

    def create_slot(
        self, index: int, cores: Iterable[int], *, memory_limit_mb: int, pids_limit: int
    ) -> SlotCgroup:
        """Groups for slot ``index`` in every usable hierarchy, limits written."""
        dirs: dict[Controller, Path] = {}
        for controller in CONTROLLERS:
            pool_dir = self._pool_dir(controller)
            if pool_dir is None:
                continue
            slot_dir = pool_dir / f"slot-{index}"
            try:
                self._make_group(controller, slot_dir)
                self._apply_limit(controller, slot_dir, cores, memory_limit_mb, pids_limit)
            except OSError as exc:
                self._mark_unavailable(controller, slot_dir, exc)
                continue
            dirs[controller] = slot_dir
        version = self.hierarchy.version if self.hierarchy else 1
        slot = SlotCgroup(index, version, dirs)
        self._slots.append(slot)
        return slot

    def _mark_unavailable(self, controller: Controller, path: Path, exc: OSError) -> None:
        self.unavailable.setdefault(controller, f"{path}: {exc.strerror or exc}")

    def _pool_dir(self, controller: Controller) -> Path | None:
        """``<mount>/agentmars/<pool id>`` for ``controller``, created on first use;
        None (and the reason recorded) where that is not possible."""
        if controller in self.unavailable or self.hierarchy is None:
            return None
        if controller in self._pool_dirs:
            return self._pool_dirs[controller]
        mount = self.hierarchy.mounts.get(controller)
        if mount is None:
            self.unavailable[controller] = "controller not mounted"
            return None
        pool_dir = mount / "agentmars" / self.pool_id
        try:
            if self.hierarchy.version == 2:
                self._enable_v2(controller, mount, pool_dir)
            self._make_group(controller, pool_dir.parent)
            remove_stale_pools(pool_dir.parent)
            self._make_group(controller, pool_dir)
        except OSError as exc:
            self._mark_unavailable(controller, pool_dir, exc)
            return None
        self._pool_dirs[controller] = pool_dir
        return pool_dir

    def _enable_v2(self, controller: Controller, root: Path, pool_dir: Path) -> None:
        """On v2 a group has a controller's files only if every ancestor enabled it
        in ``cgroup.subtree_control``."""
        if controller not in V2_ENABLED:
            return
        if controller not in _read(root / "cgroup.controllers").split():
            raise OSError(f"controller not available in {root}/cgroup.controllers")
        for level in (root, pool_dir.parent, pool_dir):
            self._make_group(controller, level)
            if controller not in _read(level / "cgroup.subtree_control").split():
                _write(level / "cgroup.subtree_control", f"+{controller}")

    def _make_group(self, controller: Controller, directory: Path) -> None:
        directory.mkdir(exist_ok=True)
        if not (directory / "cgroup.procs").exists():
            raise OSError(f"{directory.parent} is not a cgroup file system")
        if controller == "cpuset" and self.hierarchy and self.hierarchy.version == 1:
            # NOTE: a new v1 cpuset group starts with no cpus and no mems and refuses
            # tasks until both are set; inherit the parent's.
            for name in ("cpuset.cpus", "cpuset.mems"):
                if not _read(directory / name):
                    _write(directory / name, _read(directory.parent / name))

    def _apply_limit(
        self,
        controller: Controller,
        directory: Path,
        cores: Iterable[int],
        memory_limit_mb: int,
        pids_limit: int,
    ) -> None:
        if controller == "cpuset":
            _write(directory / "cpuset.cpus", ",".join(str(core) for core in cores))
        elif controller == "pids":
            _write(directory / "pids.max", str(pids_limit))
        elif controller == "memory":
            self._limit_memory(directory, memory_limit_mb * 1024 * 1024)

    def _limit_memory(self, directory: Path, limit: int) -> None:
        v1 = self.hierarchy is not None and self.hierarchy.version == 1
        _write(directory / ("memory.limit_in_bytes" if v1 else "memory.max"), str(limit))
        # Swap counts against the limit where the kernel accounts it (v1 memsw must be
        # written after the memory limit: it may never be below it).
        swap, value = (
            ("memory.memsw.limit_in_bytes", str(limit)) if v1 else ("memory.swap.max", "0")
        )
        try:
            _write(directory / swap, value)
        except FileNotFoundError:
            if _swap_enabled():
                self._note("swap is not accounted by the kernel: jobs may swap beyond the limit")
        except OSError as exc:
            self._note(f"cannot limit swap ({directory / swap}: {exc.strerror})")

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def close(self) -> None:
        """Kill whatever is left in the pool's groups and remove them (and the shared
        ``agentmars`` parent when no other pool uses it)."""
        for slot in self._slots:
            slot.kill_all()
            slot.remove()
        self._slots.clear()
        for pool_dir in dict.fromkeys(self._pool_dirs.values()):
            if _rmdir(pool_dir, REMOVE_TIMEOUT_S):
                with contextlib.suppress(OSError):
                    pool_dir.parent.rmdir()
        self._pool_dirs.clear()


def remove_stale_pools(parent: Path) -> None:
    """Remove the empty groups of pools whose process is gone. Never kills: a group
    that still holds processes stays. Only pools of this pid namespace are judged
    (another namespace's pid numbers mean nothing here)."""
    for pool_dir in parent.iterdir():
        pid, _, rest = pool_dir.name.partition("-")
        namespace = rest.partition("-")[0]
        if not pid.isdigit() or namespace != str(_pid_namespace()):
            continue
        if Path(f"/proc/{pid}").exists():
            continue
        for slot_dir in pool_dir.glob("slot-*"):
            with contextlib.suppress(OSError):
                slot_dir.rmdir()
        with contextlib.suppress(OSError):
            pool_dir.rmdir()


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _swap_enabled() -> bool:
    try:
        return len(Path("/proc/swaps").read_text().splitlines()) > 1
    except OSError:
        return False
