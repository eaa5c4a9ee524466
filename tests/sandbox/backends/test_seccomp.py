"""The process backend's seccomp filter, with real bubblewrap and real jobs: what the
host uid shares between sessions (the kernel keyring) stays out of reach, the rest
of the deny list holds, and ordinary tools still run."""

from __future__ import annotations

import errno
import json
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentmars.sandbox.backends import seccomp
from agentmars.sandbox.backends.process import SANDBOX_UID
from agentmars.sandbox.pool import SandboxPool
from agentmars.sandbox.spec import ExecResult, ExecSpec

from ..conftest import MakePool

SYSCALLS = {
    "x86_64": {
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "io_uring_setup": 425,
        "clone3": 435,
    },
    "aarch64": {
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "unshare": 97,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "io_uring_setup": 425,
        "clone3": 435,
    },
}
NR = SYSCALLS.get(platform.machine(), {})
pytestmark = pytest.mark.skipif(not NR, reason=f"syscall numbers for {platform.machine()}")

KEY_USER_KEYRING = -4  # KEY_SPEC_USER_KEYRING: the keyring of the job's (host) uid
KEYCTL_SEARCH, KEYCTL_READ = 10, 11

# A job's view of the keyring calls: each prints JSON {"result": r, "errno": name}.
KEYRING = textwrap.dedent(
    f"""
    import ctypes, errno, json, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    NR = {json.dumps(NR)}

    def call(name, *args):
        ctypes.set_errno(0)
        result = libc.syscall(NR[name], *args)
        return result, errno.errorcode.get(ctypes.get_errno())

    def add(description, payload):
        data = payload.encode()
        return call("add_key", b"user", description.encode(), data, len(data),
                    ctypes.c_long({KEY_USER_KEYRING}))

    def read(description):
        key, error = call("keyctl", {KEYCTL_SEARCH}, ctypes.c_long({KEY_USER_KEYRING}),
                          b"user", description.encode(), 0)
        if key < 0:
            return None, error
        buffer = ctypes.create_string_buffer(256)
        size, error = call("keyctl", {KEYCTL_READ}, key, buffer, 256)
        return (buffer.raw[:size].decode() if size >= 0 else None), error
    """
)


async def job(pool: SandboxPool, session: str, code: str) -> ExecResult:
    spec = ExecSpec(command=["python", "-c", KEYRING + textwrap.dedent(code)])
    result = await pool.run(session, spec, tool="keyring")
    assert result.status == "ok", result
    return result


def key_users() -> dict[int, str]:
    """/proc/key-users: per host uid, its keys and quota use."""
    lines = Path("/proc/key-users").read_text().splitlines()
    return {int(line.split(":")[0]): line.split(":", 1)[1].strip() for line in lines}


async def two_sessions(make_pool: MakePool) -> SandboxPool:
    pool = await make_pool(slots=2)
    pool.open_session("alice")
    pool.open_session("mallory")
    return pool


async def test_a_key_one_session_stores_is_not_readable_by_another(make_pool: MakePool) -> None:
    pool = await two_sessions(make_pool)
    stored = await job(pool, "alice", 'print(json.dumps(add("agentmars-secret", "hunter2")))')
    result, error = json.loads(stored.stdout)
    assert result == -1 and error == "EPERM", stored.stdout
    read = await job(pool, "mallory", 'print(json.dumps(read("agentmars-secret")))')
    value, error = json.loads(read.stdout)
    assert value is None and error == "EPERM", read.stdout


async def test_a_sessions_keys_do_not_use_up_another_sessions_quota(
    make_pool: MakePool,
) -> None:
    pool = await two_sessions(make_pool)
    before = key_users().get(SANDBOX_UID)
    filling = 'print(json.dumps([add(f"k{i}", "x" * 64)[1] for i in range(200)]))'
    errors = json.loads((await job(pool, "alice", filling)).stdout)
    assert set(errors) == {"EPERM"}
    after_one, error = json.loads(
        (await job(pool, "mallory", 'print(json.dumps(add("mine", "y")))')).stdout
    )
    assert error != "EDQUOT" and after_one == -1
    assert key_users().get(SANDBOX_UID) == before  # nothing charged to the shared uid


async def test_the_filter_denies_what_container_runtimes_deny(make_pool: MakePool) -> None:
    pool = await make_pool()
    pool.open_session("s")
    code = """
        import os
        calls = {
            "keyctl": call("keyctl", 0, 0),  # KEYCTL_GET_KEYRING_ID
            "request_key": call("request_key", b"user", b"x", None, 0),
            "unshare (user namespace)": call("unshare", 0x10000000),
            "perf_event_open": call("perf_event_open", None, 0, -1, -1, 0),
            "userfaultfd": call("userfaultfd", 1),  # UFFD_USER_MODE_ONLY
            "io_uring_setup": call("io_uring_setup", 1, None),
            "clone3": call("clone3", None, 0),
        }
        print(json.dumps({name: error for name, (_, error) in calls.items()}))
    """
    denied = json.loads((await job(pool, "s", code)).stdout)
    assert denied == {
        "keyctl": "EPERM",
        "request_key": "EPERM",
        "unshare (user namespace)": "EPERM",
        "perf_event_open": "EPERM",
        "userfaultfd": "EPERM",
        "io_uring_setup": "EPERM",
        "clone3": "ENOSYS",  # so that libc falls back to clone, whose flags are checked
    }


async def test_ordinary_tools_still_run(make_pool: MakePool) -> None:
    pool = await make_pool()
    pool.open_session("s")
    python = """
        import subprocess, sys, threading, concurrent.futures as futures
        with futures.ProcessPoolExecutor(2) as workers:
            squares = list(workers.map(pow, [2, 3], [2, 2]))
        thread = threading.Thread(target=print, args=("thread",))
        thread.start(); thread.join()
        print(squares, subprocess.run(["sh", "-c", "echo sub | tr a-z A-Z"],
              capture_output=True, text=True).stdout.strip())
    """
    result = await pool.run("s", ExecSpec(command=["python", "-c", textwrap.dedent(python)]))
    assert result.stdout == "thread\n[4, 9] SUB\n", result
    if shutil.which("git"):
        git = (
            "git init -q repo && cd repo && echo hi > a && git add a && "
            "git -c user.name=t -c user.email=t@t commit -qm one && git log --oneline | wc -l"
        )
        result = await pool.run("s", ExecSpec(command=["sh", "-c", git]))
        assert (result.status, result.stdout.strip()) == ("ok", "1"), result


def test_the_filter_is_a_whole_bpf_program_built_from_its_source() -> None:
    bpf = seccomp.ensure_filter()
    program = bpf.read_bytes()
    assert program and len(program) % 8 == 0  # struct sock_filter: 8 bytes each
    # bubblewrap loads it: a sandbox that tries keyctl gets the filter's answer.
    with bpf.open("rb") as filter_file:
        denied = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--seccomp", str(filter_file.fileno()), "--",
             sys.executable, "-c", KEYRING + "print(call('keyctl', 0, 0)[1])"],
            pass_fds=(filter_file.fileno(),), capture_output=True, text=True, check=True,
        )  # fmt: skip
    assert denied.stdout.strip() == errno.errorcode[errno.EPERM]
