"""The sandbox init outside any sandbox: building and caching it, and what each of its
roles does (the process backend's tests cover it inside the sandbox)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agentmars.sandbox.backends import netns, sandbox_init
from agentmars.sandbox.backends.base import Slot
from agentmars.sandbox.backends.process import ProcessBackend
from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.spec import SandboxError

CORE = sorted(os.sched_getaffinity(0))[-1]
UNCONFINED = 125


@pytest.fixture(scope="module")
def init() -> str:
    return str(sandbox_init.ensure_built())


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home without a built init."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return sandbox_init.cache_root()


def run_host(
    init: str,
    *options: str,
    command: list[str],
    parent: int | None = None,
    pass_fds: tuple[int, ...] = (),
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the host role with a report pipe; its result and what it reported."""
    read, write = os.pipe()
    argv = [init, "host", "--parent", str(parent or os.getpid()), "--report", str(write)]
    try:
        done = subprocess.run(
            [*argv, *options, "--", *command],
            capture_output=True, text=True, pass_fds=(write, *pass_fds), timeout=10,
        )  # fmt: skip
    finally:
        os.close(write)
    with os.fdopen(read) as pipe:
        return done, pipe.read()


# --- building --------------------------------------------------------------------


def test_the_cache_key_follows_the_source_and_the_flags() -> None:
    source = sandbox_init.SOURCE.read_bytes()
    key = sandbox_init.cache_key(source)
    assert key == sandbox_init.cache_key(source)
    assert key != sandbox_init.cache_key(source + b"\n")
    assert key != sandbox_init.cache_key(source, (*sandbox_init.CFLAGS, "-g"))


def test_a_changed_source_is_built_anew(
    empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = sandbox_init.ensure_built()
    changed = tmp_path / "sandbox_init.c"
    changed.write_bytes(sandbox_init.SOURCE.read_bytes() + b"/* changed */\n")
    monkeypatch.setattr(sandbox_init, "SOURCE", changed)
    second = sandbox_init.ensure_built()
    assert first != second
    assert second.parent.name == sandbox_init.cache_key(changed.read_bytes())
    assert first.parent.parent == second.parent.parent == empty_cache
    assert sandbox_init.ensure_built("no-such-cc") == second  # cached: no compiler needed
    assert subprocess.run([second], capture_output=True).returncode == 2  # usage


def test_builds_racing_each_other_leave_one_whole_binary(empty_cache: Path) -> None:
    built: list[Path] = []
    threads = [
        threading.Thread(target=lambda: built.append(sandbox_init.ensure_built())) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(built)) == 1 and len(built) == 4
    assert os.listdir(built[0].parent) == ["sandbox-init"]  # no temporary file left
    assert os.access(built[0], os.X_OK)


def test_a_failed_build_says_what_to_install(empty_cache: Path) -> None:
    with pytest.raises(SandboxError, match=r"cannot build the sandbox init.*libc6-dev"):
        sandbox_init.ensure_built("false")
    leftovers = [p for p in empty_cache.rglob("*") if p.is_file()]
    assert leftovers == []


async def test_without_a_compiler_the_backend_does_not_start(
    empty_cache: Path, tmp_path: Path
) -> None:
    backend = ProcessBackend(compiler=str(tmp_path / "no-cc"))
    config = SandboxConfig(workspace_root=tmp_path / "ws")
    with pytest.raises(SandboxError, match=r"no C compiler found.*install gcc and libc6-dev"):
        await backend.start(config, [Slot(0, (CORE,))])
    await backend.close()


# --- host role -------------------------------------------------------------------


def test_the_host_role_confines_itself_then_execs(init: str) -> None:
    files = resource.RLIMIT_NOFILE
    script = "grep Cpus_allowed_list /proc/self/status; ulimit -n; ls /proc/$$/fd"
    done, report = run_host(
        init, "--cpus", str(CORE), "--rlimit", f"{files}=123", command=["sh", "-c", script]
    )
    # Only stdio: the report descriptor is closed on exec.
    assert done.stdout.split("\n") == [f"Cpus_allowed_list:\t{CORE}", "123", "0", "1", "2", ""]
    assert report == ""


@pytest.mark.parametrize(
    ("options", "why"),
    [
        (["--cpus", "4000"], "cannot confine the job: CPU affinity: 4000: Invalid argument"),
        (
            ["--cpus", str(CORE), "--join", "/nonexistent/tasks"],
            "cannot join the slot's cgroups: /nonexistent/tasks: No such file or directory",
        ),
        (
            ["--cpus", str(CORE), "--rlimit", "999=1"],
            "cannot confine the job: rlimit: 999=1: Invalid argument",
        ),
    ],
)
def test_the_host_role_runs_nothing_it_cannot_confine(
    init: str, tmp_path: Path, options: list[str], why: str
) -> None:
    done, report = run_host(init, *options, command=["touch", str(tmp_path / "ran")])
    assert done.returncode == UNCONFINED
    assert json.loads(report) == {"unconfined": why}
    assert not (tmp_path / "ran").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="joining a namespace needs root")
def test_the_host_role_joins_the_network_namespace_it_is_given(init: str) -> None:
    namespace = netns.create(init)
    try:
        script = "readlink /proc/self/ns/net; cat /proc/sys/net/ipv4/tcp_max_tw_buckets"
        script += "; ls /proc/$$/fd"
        done, report = run_host(
            init, "--cpus", str(CORE), "--netns", str(namespace),
            command=["sh", "-c", script], pass_fds=(namespace,),
        )  # fmt: skip
        created = os.readlink(f"/proc/self/fd/{namespace}")
    finally:
        os.close(namespace)
    # TIME_WAIT off there only; the descriptor is not passed on.
    assert done.stdout.split() == [created, "0", "0", "1", "2"], done.stderr
    assert created != os.readlink("/proc/self/ns/net")
    assert Path("/proc/sys/net/ipv4/tcp_max_tw_buckets").read_text() != "0\n"
    assert report == ""


def test_the_host_role_runs_nothing_in_a_namespace_it_cannot_join(
    init: str, tmp_path: Path
) -> None:
    with open(os.devnull) as not_a_namespace:
        fd = str(not_a_namespace.fileno())
        done, report = run_host(
            init, "--cpus", str(CORE), "--netns", fd,
            command=["touch", str(tmp_path / "ran")], pass_fds=(not_a_namespace.fileno(),),
        )  # fmt: skip
    assert done.returncode == UNCONFINED
    why = f"cannot join the slot's network namespace: {fd}: Invalid argument"
    assert json.loads(report) == {"unconfined": why}
    assert not (tmp_path / "ran").exists()


def test_the_host_role_never_starts_for_a_backend_that_is_gone(init: str, tmp_path: Path) -> None:
    # --parent 1: not the process that spawned it, as when that one died meanwhile
    command = ["touch", str(tmp_path / "ran")]
    done, _ = run_host(init, "--cpus", str(CORE), command=command, parent=1)
    assert done.returncode == UNCONFINED
    assert not (tmp_path / "ran").exists()


def test_the_host_role_dies_with_the_backend(init: str) -> None:
    sleep = ["sleep", f"{30 + time.monotonic_ns() % 10**6 / 10**6:.6f}"]
    # A stand-in backend: spawns the host role, says its pid, and exits.
    backend = (
        "import os, subprocess\n"
        f"argv = [{init!r}, 'host', '--parent', str(os.getpid()), '--report', '2',"
        f" '--cpus', '{CORE}', '--', *{sleep!r}]\n"
        "print(subprocess.Popen(argv).pid, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", backend], capture_output=True, text=True, timeout=10
    )
    pid = int(done.stdout)
    deadline = time.monotonic() + 5
    while _is_running(pid, sleep) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _is_running(pid, sleep)


def _is_running(pid: int, command: list[str]) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return cmdline == b"".join(a.encode() + b"\0" for a in command) and state != "Z"


# --- netns role -------------------------------------------------------------------


def test_the_netns_role_says_why_it_sent_no_namespace(init: str) -> None:
    with open(os.devnull) as not_a_socket:
        argv = [init, "netns", "--send", str(not_a_socket.fileno())]
        done = subprocess.run(
            argv, capture_output=True, text=True, pass_fds=(not_a_socket.fileno(),), timeout=10
        )
    assert done.returncode == 1
    if os.geteuid() == 0:
        assert "cannot send the namespace: Socket operation on non-socket" in done.stderr
    else:
        assert "cannot create a network namespace: Operation not permitted" in done.stderr


def test_a_failed_netns_role_is_a_sandbox_error(tmp_path: Path) -> None:
    failing = tmp_path / "sandbox-init"
    failing.write_text("#!/bin/sh\necho no namespace here >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(SandboxError, match="no namespace here"):
        netns.create(str(failing))


# --- pid 1 role -------------------------------------------------------------------


def pid1(init: str, *options: str, command: list[str]) -> subprocess.CompletedProcess[str]:
    argv = [init, "pid1", *options, "--", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10)


def test_the_command_gets_exactly_the_given_environment(init: str, tmp_path: Path) -> None:
    done = pid1(
        init, "--cwd", str(tmp_path), "--env", "PATH=/usr/bin:/bin", "--env", "A=b c",
        command=["env"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["PATH=/usr/bin:/bin", "A=b c", f"PWD={tmp_path}"]


@pytest.mark.parametrize(
    ("script", "code"),
    [("exit 0", 0), ("exit 3", 3), ("exit 200", 200), ("kill -TERM $$", 128 + signal.SIGTERM)],
)
def test_pid1_exits_with_the_commands_status(init: str, script: str, code: int) -> None:
    done = pid1(init, "--cwd", "/", "--env", "PATH=/usr/bin:/bin", command=["sh", "-c", script])
    assert done.returncode == code


def test_pid1_reports_commands_it_cannot_start(init: str, tmp_path: Path) -> None:
    path = ["--env", "PATH=/usr/bin:/bin"]
    missing = pid1(init, "--cwd", "/", *path, command=["no-such-program"])
    assert missing.returncode == 127
    assert "no-such-program: No such file or directory" in missing.stderr
    (tmp_path / "script").write_text("#!/bin/sh\n")
    not_executable = pid1(init, "--cwd", "/", *path, command=[str(tmp_path / "script")])
    assert not_executable.returncode == 126
    ran = tmp_path / "ran"
    nowhere = pid1(init, "--cwd", str(tmp_path / "gone"), *path, command=["touch", str(ran)])
    assert nowhere.returncode == 126 and "cannot enter" in nowhere.stderr
    assert not ran.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_pid1_drops_the_command_to_the_given_uid(init: str) -> None:
    done = pid1(init, "--drop", "65534", "--cwd", "/", command=["/bin/cat", "/proc/self/status"])
    status = dict(line.split(":", 1) for line in done.stdout.splitlines())
    assert status["Uid"].split() == status["Gid"].split() == ["65534"] * 4
    assert status["Groups"].split() == []
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[name], 16) == 0, name
    assert status["NoNewPrivs"].strip() == "1"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["pid1", "--cwd"],
        ["pid1", "--cwd", "/"],
        ["pid1", "--bad", "x", "--", "true"],
        ["netns"],
        ["netns", "--send"],
        ["netns", "--bad", "3"],
    ],
)
def test_bad_arguments_are_refused(init: str, argv: list[str]) -> None:
    assert subprocess.run([init, *argv], capture_output=True, timeout=10).returncode == 2
