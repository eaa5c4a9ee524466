"""The cgroup manager on this host's real hierarchies: groups, limits, membership,
killing, accounting, clean-up; v2 on the host's cgroup2 mount when there is one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentmars.sandbox.cgroups import (
    CGROUP_ROOT,
    CgroupManager,
    Hierarchy,
    SlotCgroup,
    detect_hierarchy,
)

MB = 1024 * 1024
CORES = sorted(os.sched_getaffinity(0))
SLEEP = "import time\ntime.sleep(60)\n"


def _usable_manager() -> CgroupManager | None:
    manager = CgroupManager.detect(pool_id=f"probe-{os.getpid()}")
    manager.create_slot(0, sorted(os.sched_getaffinity(0))[:1], memory_limit_mb=64, pids_limit=16)
    manager.close()
    return None if manager.unavailable else manager


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mountpoint, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return Path(mountpoint)
    return None


needs_cgroups = pytest.mark.skipif(
    _usable_manager() is None, reason="cgroup controllers are not writable here"
)


@pytest.fixture
def manager() -> Iterator[CgroupManager]:
    manager = CgroupManager.detect()
    try:
        yield manager
    finally:
        manager.close()


def spawn_in(group: SlotCgroup, code: str) -> subprocess.Popen[bytes]:
    """A Python process that joins ``group`` before running ``code`` (so nothing it
    forks starts outside the group)."""
    join = "import os, sys\nfor f in sys.argv[1:]:\n    open(f, 'w').write(str(os.getpid()))\n"
    procs = [str(path) for path in group.procs_files]
    return subprocess.Popen([sys.executable, "-c", join + textwrap.dedent(code), *procs])


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_mount_table_parsing_v1_v2_and_hybrid() -> None:
    v1 = (
        "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
        "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"
        "cgroup /sys/fs/cgroup/my\\040memory cgroup rw,memory 0 0\n"
        "cgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n"
        "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"
    )
    hierarchy = detect_hierarchy(v1)
    assert hierarchy is not None and hierarchy.version == 1
    assert hierarchy.mounts == {
        "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/my memory"),
        "pids": Path("/sys/fs/cgroup/pids"),
    }
    v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
    assert detect_hierarchy(v2) == Hierarchy.unified(CGROUP_ROOT)
    assert detect_hierarchy("proc /proc proc rw 0 0\n") is None


def test_detects_this_hosts_hierarchy() -> None:
    hierarchy = detect_hierarchy()
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        assert hierarchy is not None and hierarchy.version == 2
    elif hierarchy is not None:
        assert hierarchy.version == 1
        assert all(mount.is_dir() for mount in hierarchy.mounts.values())


@needs_cgroups
def test_slot_groups_get_the_limits(manager: CgroupManager) -> None:
    core = sorted(os.sched_getaffinity(0))[-1]
    slot = manager.create_slot(3, (core,), memory_limit_mb=64, pids_limit=16)
    assert manager.unavailable == {}
    assert slot.controllers == {"cpuset", "memory", "pids", "cpuacct"}
    for directory in slot.dirs.values():
        assert directory.name == "slot-3"
        assert directory.parent.name == manager.pool_id
        assert directory.parent.parent.name == "agentmars"
    assert (slot.dirs["cpuset"] / "cpuset.cpus").read_text().strip() == str(core)
    assert (slot.dirs["pids"] / "pids.max").read_text().strip() == "16"
    memory = "memory.limit_in_bytes" if slot.version == 1 else "memory.max"
    assert int((slot.dirs["memory"] / memory).read_text()) == 64 * MB


@needs_cgroups
def test_add_list_and_kill(manager: CgroupManager) -> None:
    slot = manager.create_slot(
        0, sorted(os.sched_getaffinity(0)), memory_limit_mb=64, pids_limit=16
    )
    process = subprocess.Popen(["sleep", "60"])
    try:
        slot.add(process.pid)
        assert slot.pids() == {process.pid}
        assert manager.pool_id in Path(f"/proc/{process.pid}/cgroup").read_text()
        assert slot.kill_all()
        assert process.wait(5) == -9
        assert slot.pids() == set()
    finally:
        process.kill()
        process.wait()


@needs_cgroups
def test_a_process_joins_by_writing_0_and_emptiness_is_seen(manager: CgroupManager) -> None:
    slot = manager.create_slot(
        0, sorted(os.sched_getaffinity(0)), memory_limit_mb=64, pids_limit=16
    )
    assert slot.is_empty()
    join = 'for f; do echo 0 >"$f" || exit 1; done; exec sleep 60'
    files = [str(path) for path in slot.join_files]
    process = subprocess.Popen(["sh", "-c", join, "sh", *files])
    try:
        assert wait_until(lambda: slot.pids() == {process.pid})
        assert not slot.is_empty()
        assert slot.kill_all()
        assert process.wait(5) == -9
        assert slot.is_empty()
    finally:
        process.kill()
        process.wait()


@needs_cgroups
def test_kill_all_stops_a_fork_loop_at_the_pids_limit(manager: CgroupManager) -> None:
    slot = manager.create_slot(
        0, sorted(os.sched_getaffinity(0)), memory_limit_mb=256, pids_limit=24
    )
    before = slot.pids_limit_hits()
    loop = """
        import time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.001)
    """
    process = spawn_in(slot, loop)
    try:
        assert wait_until(lambda: (slot.pids_limit_hits() or 0) > (before or 0))
        assert len(slot.pids()) <= 24
        assert slot.kill_all()
        assert slot.pids() == set()
    finally:
        process.kill()
        process.wait()


@needs_cgroups
def test_cpu_time_of_a_busy_loop_is_accounted(manager: CgroupManager) -> None:
    slot = manager.create_slot(
        0, sorted(os.sched_getaffinity(0)), memory_limit_mb=256, pids_limit=16
    )
    before = slot.cpu_seconds()
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
    assert spawn_in(slot, busy).wait(10) == 0
    after = slot.cpu_seconds()
    assert before is not None and after is not None
    assert after - before >= 0.28


@needs_cgroups
def test_out_of_memory_kills_are_counted(manager: CgroupManager) -> None:
    slot = manager.create_slot(
        0, sorted(os.sched_getaffinity(0)), memory_limit_mb=64, pids_limit=16
    )
    hog = "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 << 20))\n"
    assert spawn_in(slot, hog).wait(20) == -9
    assert (slot.oom_kills() or 0) >= 1


@needs_cgroups
def test_close_kills_leftovers_and_removes_every_group() -> None:
    manager = CgroupManager.detect()
    slots = [
        manager.create_slot(i, sorted(os.sched_getaffinity(0)), memory_limit_mb=64, pids_limit=16)
        for i in range(2)
    ]
    process = spawn_in(slots[1], "import time\ntime.sleep(60)\n")
    assert wait_until(lambda: process.pid in slots[1].pids())
    directories = {d for slot in slots for d in slot.dirs.values()}
    manager.close()
    assert process.wait(5) == -9
    assert not any(d.exists() for d in directories)
    assert not any(d.parent.exists() for d in directories)  # the pool's own directory


def test_unusable_hierarchies_are_reported(tmp_path: Path) -> None:
    not_cgroupfs = CgroupManager(Hierarchy(1, {"memory": tmp_path}))
    slot = not_cgroupfs.create_slot(0, (0,), memory_limit_mb=64, pids_limit=16)
    assert slot.controllers == frozenset()
    assert "not a cgroup file system" in not_cgroupfs.unavailable["memory"]
    assert not_cgroupfs.unavailable["pids"] == "controller not mounted"
    none = CgroupManager(None)
    assert set(none.unavailable) == {"cpuset", "memory", "pids", "cpuacct"}
    assert none.create_slot(0, (0,), memory_limit_mb=64, pids_limit=16).procs_files == []


@pytest.mark.skipif(
    _cgroup2_mount() is None or os.geteuid() != 0, reason="needs a writable cgroup2 mount"
)
def test_v2_tree_accounts_cpu_and_kills_with_cgroup_kill() -> None:
    root = _cgroup2_mount()
    assert root is not None
    manager = CgroupManager(Hierarchy.unified(root))
    try:
        slot = manager.create_slot(0, (0,), memory_limit_mb=64, pids_limit=16)
        available = set((root / "cgroup.controllers").read_text().split())
        for controller in ("cpuset", "memory", "pids"):
            # Either enabled down the tree, or reported with the reason.
            assert (controller in slot.controllers) != (controller in manager.unavailable)
            if controller not in available:
                assert "cgroup.controllers" in manager.unavailable[controller]
        assert "cpuacct" in slot.controllers
        before = slot.cpu_seconds()
        busy = """
            import time
            t = time.process_time()
            while time.process_time() - t < 0.2:
                pass
            time.sleep(60)
        """
        process = spawn_in(slot, busy)
        assert wait_until(lambda: (slot.cpu_seconds() or 0) - (before or 0) >= 0.18)
        assert slot.pids() == {process.pid}
        assert slot.kill_all()
        assert process.wait(5) == -9
    finally:
        manager.close()
    assert not (root / "agentmars" / manager.pool_id).exists()


@needs_cgroups
def test_a_new_pool_removes_empty_groups_of_dead_pools(manager: CgroupManager) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now
    namespace = os.stat("/proc/self/ns/pid").st_ino
    dead = CgroupManager.detect(pool_id=f"{gone.pid}-{namespace}-dead")
    dead.create_slot(0, CORES, memory_limit_mb=64, pids_limit=16)
    busy = CgroupManager.detect(pool_id=f"{gone.pid}-{namespace}-busy")
    busy_slot = busy.create_slot(0, CORES, memory_limit_mb=64, pids_limit=16)
    sleeper = spawn_in(busy_slot, SLEEP)
    assert wait_until(lambda: sleeper.pid in busy_slot.pids())
    foreign = CgroupManager.detect(pool_id=f"{gone.pid}-1-other-namespace")
    foreign.create_slot(0, CORES, memory_limit_mb=64, pids_limit=16)
    try:
        manager.create_slot(0, CORES, memory_limit_mb=64, pids_limit=16)  # starts the sweep
        mount = detect_hierarchy().mounts["pids"]  # type: ignore[union-attr]
        assert not (mount / "agentmars" / dead.pool_id).exists()
        assert (mount / "agentmars" / busy.pool_id / "slot-0").exists()  # never killed
        assert sleeper.poll() is None
        assert (mount / "agentmars" / foreign.pool_id).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        busy.close()
        foreign.close()
