"""The pool over real sandboxes: pinning, admission order, events, interrupts, bad input."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from agentmars.sandbox.config import SandboxConfig, allowed_cores
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecSpec, SandboxError, UnknownSession
from agentmars.sandbox.threads import in_thread
from agentmars.sdk.emitter import Emitter
from agentmars.sdk.events import ToolEnd, ToolEnqueue, ToolStart, ToolStats
from agentmars.sdk.sinks.memory import MemorySink

from .conftest import MakePool

PY = sys.executable
CORES = allowed_cores()


def _wait_for_file(name: str) -> ExecSpec:
    """A command that blocks until the test creates ``name`` in its workspace."""
    code = f"import os, time\nwhile not os.path.exists({name!r}): time.sleep(0.005)"
    return ExecSpec(command=[PY, "-c", code], timeout_s=30)


def _cpus_allowed(stdout: str) -> str:
    return next(
        line.split()[1] for line in stdout.splitlines() if line.startswith("Cpus_allowed_list")
    )


def _cores_text(cores: list[int]) -> str:
    return ",".join(map(str, cores)) if len(cores) < 2 else f"{cores[0]}-{cores[-1]}"


async def test_commands_run_on_their_slots_cores(make_pool: MakePool) -> None:
    pool = await make_pool(tool_cores=CORES, engine_cores=[], slots=len(CORES))
    pool.open_session("s1")
    seen = set()
    spec = ExecSpec(command=["cat", "/proc/self/status"])
    results = await asyncio.gather(*(pool.run("s1", spec, call_id=f"c{i}") for i in range(4)))
    for result in results:
        assert result.status == "ok", result
        assert _cpus_allowed(result.stdout) == _cores_text(pool.slots[result.slot].cores)  # type: ignore[index]
        seen.add(result.slot)
    assert seen <= set(range(len(CORES)))


async def test_default_pool_keeps_tools_off_the_engine_core(pool: SandboxPool) -> None:
    pool.open_session("s1")
    result = await pool.run("s1", ExecSpec(command=["cat", "/proc/self/status"]))
    engine = set(pool.config.resolved_engine_cores())
    assert not {int(c) for c in _cpus_allowed(result.stdout).split(",") if "-" not in c} & engine


async def test_one_slot_serves_waiting_calls_by_priority(
    make_pool: MakePool, events: MemorySink
) -> None:
    pool = await make_pool(slots=1)
    workspace = pool.open_session("s1")
    blocker = asyncio.create_task(pool.run("s1", _wait_for_file("go"), call_id="blocker"))
    while pool.pressure.active < 1:
        await asyncio.sleep(0.001)
    calls = {"p5": 5, "p1": 1, "p3": 3, "p1-late": 1, "p-2": -2}
    waiting = []
    for call_id, priority in calls.items():
        waiting.append(
            asyncio.create_task(
                pool.run("s1", ExecSpec(command=["true"]), call_id=call_id, priority=priority)
            )
        )
        while pool.pressure.queued < len(waiting):
            await asyncio.sleep(0.001)
    (workspace / "go").touch()
    results = await asyncio.gather(blocker, *waiting)
    assert all(r.status == "ok" for r in results)
    starts = [e.call_id for e in events.events if isinstance(e, ToolStart)]
    assert starts == ["blocker", "p-2", "p1", "p1-late", "p3", "p5"]
    stats = [e for e in events.events if isinstance(e, ToolStats)]
    assert max(s.active for s in stats) == 1
    assert max(s.queued for s in stats) == 5
    assert all(r.queue_wait_s > 0 for r in results[1:])


async def test_events_describe_each_call(pool: SandboxPool, events: MemorySink) -> None:
    pool.open_session("s1")
    await pool.run("s1", ExecSpec(command=["sh", "-c", "exit 3"]), tool="terminal", turn=2)
    kinds = [e for e in events.events if not isinstance(e, ToolStats)]
    enqueue, start, end = kinds
    assert isinstance(enqueue, ToolEnqueue) and isinstance(start, ToolStart)
    assert isinstance(end, ToolEnd)
    assert {e.source for e in kinds} == {"sandbox"}
    assert {(e.session_id, e.call_id, e.turn, e.tool) for e in kinds} == {
        ("s1", enqueue.call_id, 2, "terminal")
    }
    assert end.status == "error" and end.exit_status == 3
    assert enqueue.mono_ns <= start.mono_ns < end.mono_ns
    assert end.duration_s == pytest.approx((end.mono_ns - start.mono_ns) / 1e9)
    assert pool.pressure.exec_ema_s["terminal"] == pytest.approx(end.duration_s)
    last = [e for e in events.events if isinstance(e, ToolStats)][-1]
    assert (last.active, last.queued) == (0, 0) and "terminal" in last.exec_ema_s
    assert last.cores == len(pool.config.resolved_tool_cores()) > 0


async def test_exec_time_ema_weights_new_samples_by_alpha(make_pool: MakePool) -> None:
    pool = await make_pool(exec_ema_alpha=0.5)
    pool.open_session("s1")
    durations = []
    for _ in range(3):
        await pool.run("s1", ExecSpec(command=["true"]), tool="t")
        durations.append(pool.pressure.exec_ema_s["t"])
    assert pool.pressure.completed == 3
    assert min(durations) > 0


async def test_interrupt_running_and_queued_calls(make_pool: MakePool) -> None:
    pool = await make_pool(slots=1)
    pool.open_session("s1")
    running = asyncio.create_task(pool.run("s1", _wait_for_file("never"), call_id="run"))
    while pool.pressure.active < 1:
        await asyncio.sleep(0.001)
    queued = asyncio.create_task(pool.run("s1", ExecSpec(command=["true"]), call_id="queued"))
    while pool.pressure.queued < 1:
        await asyncio.sleep(0.001)
    assert await pool.interrupt("s1", "queued")
    assert (await queued).status == "cancelled"
    assert await pool.interrupt("s1", "run")
    assert (await running).status == "cancelled"
    assert not await pool.interrupt("s1", "run")
    assert (await pool.run("s1", ExecSpec(command=["true"]))).status == "ok"


async def test_sessions_have_private_workspaces(pool: SandboxPool, tmp_path: Path) -> None:
    a, b = pool.open_session("a"), pool.open_session("b")
    assert a != b and a.parent == b.parent == tmp_path / "ws"
    await pool.run("a", ExecSpec(command=["sh", "-c", "echo secret > note"]))
    assert (a / "note").read_text() == "secret\n"
    peek = await pool.run("b", ExecSpec(command=["cat", str(a / "note")]))
    assert peek.status == "error" and "secret" not in peek.stdout
    await pool.close_session("a")
    assert not a.exists() and pool.sessions == ["b"]


async def test_bad_requests_raise_clear_errors(pool: SandboxPool) -> None:
    pool.open_session("s1")
    spec = ExecSpec(command=["true"])
    with pytest.raises(UnknownSession, match="unknown session 'nope'"):
        await pool.run("nope", spec)
    with pytest.raises(SandboxError, match="invalid session id"):
        await pool.run("../etc", spec)
    with pytest.raises(SandboxError, match="priority must be an integer"):
        await pool.run("s1", spec, priority=2**40)
    with pytest.raises(SandboxError, match="tool must be"):
        await pool.run("s1", spec, tool="")
    await pool.close()
    with pytest.raises(SandboxError, match="not running"):
        await pool.run("s1", spec)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))


def _children() -> int:
    me = str(os.getpid())
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            count += 1
    return count


@pytest.mark.slow
async def test_1000_calls_leak_no_fds_processes_or_memory(tmp_path: Path) -> None:
    config = SandboxConfig(workspace_root=tmp_path / "ws")
    async with SandboxPool(config, emitter=Emitter()) as pool:
        pool.open_session("s1")
        spec = ExecSpec(command=["sh", "-c", "echo out; echo err >&2"])

        async def calls(n: int) -> None:
            for _ in range(n):
                result = await pool.run("s1", spec)
                assert result.status == "ok" and result.stdout == "out\n"

        await calls(100)  # warm caches and pools before taking the baseline
        fds, rss = _open_fds(), _rss_kib()
        await calls(1000)
        assert _open_fds() <= fds
        assert _children() == 0
        # A leak of even 1 KiB per call would show as 1 MB; allow allocator noise.
        assert _rss_kib() - rss < 8 * 1024


async def test_in_process_calls_are_admitted_pinned_and_reported_like_commands(
    make_pool: MakePool, events: MemorySink
) -> None:
    pool = await make_pool(tool_cores=CORES[-1:], engine_cores=[], slots=1)
    pool.open_session("s1")
    blocker = asyncio.create_task(pool.run("s1", _wait_for_file("go"), call_id="cmd", priority=0))
    await asyncio.sleep(0)
    while pool.pressure.active == 0:
        await asyncio.sleep(0.005)

    def affinity() -> set[int]:
        return os.sched_getaffinity(0)

    # Queued behind the running command: it starts only when the command's slot frees.
    in_process = asyncio.create_task(
        pool.run_in_process("s1", affinity, tool="file_editor", call_id="edit", turn=3)
    )
    while pool.pressure.queued == 0:
        await asyncio.sleep(0.005)
    assert not in_process.done()
    (pool.workspace("s1") / "go").touch()
    assert (await blocker).status == "ok"
    assert await in_process == {CORES[-1]}
    # The worker thread got its affinity back.
    assert await in_thread(affinity) == os.sched_getaffinity(0)
    mine = [e for e in events.events if getattr(e, "call_id", None) == "edit"]
    assert [type(e) for e in mine] == [ToolEnqueue, ToolStart, ToolEnd]
    assert all(e.tool == "file_editor" and e.turn == 3 for e in mine)  # type: ignore[attr-defined]
    assert mine[1].queue_wait_s > 0  # type: ignore[attr-defined]
    assert mine[2].status == "ok"  # type: ignore[attr-defined]


async def test_an_in_process_call_raises_what_its_function_raises(
    pool: SandboxPool, events: MemorySink
) -> None:
    pool.open_session("s1")

    def broken() -> None:
        raise ValueError("no such file")

    with pytest.raises(ValueError, match="no such file"):
        await pool.run_in_process("s1", broken, tool="file_editor", call_id="bad")
    end = next(e for e in events.events if isinstance(e, ToolEnd) and e.call_id == "bad")
    assert end.status == "error" and end.error == "ValueError: no such file"
    assert pool.pressure.active == 0
    with pytest.raises(UnknownSession):
        await pool.run_in_process("nobody", lambda: None)
