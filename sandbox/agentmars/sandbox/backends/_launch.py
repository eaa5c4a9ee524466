"""The two small programs between the process backend and a job. Standard library
only and run with ``python -I -S`` so each starts in ~10 ms; never imports agentmars.

``enter`` runs on the host as the process the backend spawns. It moves itself into
the slot's cgroups, pins itself to the slot's cores and sets its resource limits, and
only then execs bubblewrap (or, without bubblewrap, the supervisor directly).
Everything the job starts inherits all three, so no process of the job ever runs
unconfined, and no ``preexec_fn`` runs in a forked copy of the threaded event loop.

``supervise`` runs the command as its child (dropped to ``uid`` when given, then in
``cwd``: after the drop, as a workspace handed to that uid may be closed to root without
capabilities), reaps it and reports how it ended on a status pipe. Inside bubblewrap
it is the sandbox's pid 1 (``--as-pid-1``) because bubblewrap's own init turns a death
by signal n into exit code 128+n, which cannot be told apart from ``exit(128+n)``;
when it exits the kernel kills the rest of the namespace.

Status lines: ``started``; then ``exit <wait status> <cpu seconds>``, or ``error
<message>`` when the job could not be confined.
"""

from __future__ import annotations

import os
import resource
import sys

# NOTE: start-up time matters (twice per job): typing (~10 ms) is for the type checker
# only, and the C module _signal has what the signal module has without importing
# enum (~7 ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Iterable, Mapping, Sequence
    from typing import NoReturn
else:
    import _signal as signal

SETUP_FAILED = 125
_SEPARATOR = "--"


def enter_argv(
    python: str,
    *,
    status_fd: int,
    cores: Iterable[int],
    procs_files: Iterable[str],
    rlimits: Mapping[str, int],
    argv: Sequence[str],
) -> list[str]:
    """The command line of the host-side shim, which execs ``argv`` (an absolute path)
    once confined. ``rlimits`` are keyed by the ``resource.RLIMIT_*`` suffix."""
    options = [f"status_fd={status_fd}", f"cores={','.join(map(str, cores))}"]
    options += [f"procs={path}" for path in procs_files]
    options += [f"rlimit={name}:{value}" for name, value in rlimits.items()]
    return [python, "-I", "-S", __file__, "enter", *options, _SEPARATOR, *argv]


def supervise_argv(
    python: str, script: str, *, status_fd: int, cwd: str, uid: int | None, argv: Sequence[str]
) -> list[str]:
    """The command line of the supervisor; ``script``: where this file is (mounted in
    the sandbox); ``uid``: the uid and gid to run the command as."""
    options = [f"status_fd={status_fd}", f"cwd={cwd}"] + ([] if uid is None else [f"uid={uid}"])
    return [python, "-I", "-S", script, "supervise", *options, _SEPARATOR, *argv]


def report(status_fd: int, line: str) -> None:
    os.write(status_fd, (line + "\n").encode())


def enter_slot(procs_files: Iterable[str], cores: Iterable[int], rlimits: Iterable[str]) -> None:
    """Join the slot's cgroups, then pin (joining a cpuset resets the affinity to the
    cpuset's cores), then limit."""
    pid = str(os.getpid())
    for procs in procs_files:
        with open(procs, "w") as file:
            file.write(pid)
    os.sched_setaffinity(0, set(cores))
    for limit in rlimits:
        name, _, value = limit.partition(":")
        resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (int(value), int(value)))


def supervise(argv: list[str], status_fd: int, cwd: str, uid: int | None) -> NoReturn:
    """Run ``argv``, reap it and every orphan handed to us, report, exit alike."""
    os.set_inheritable(status_fd, False)  # the job must not be able to forge a status
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals stay ignored across exec
    # (``yes | head`` in the job would break); as pid 1 of a namespace, signals without
    # a handler (SIGINT's is Python's) cannot reach us from inside.
    for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    child = os.fork()
    if child == 0:
        if uid is not None:
            _drop_privileges(uid, status_fd)
        _enter_cwd(cwd, status_fd)
        _exec_job(argv)
    report(status_fd, "started")
    cpu_s = 0.0
    while True:
        pid, status, usage = os.wait4(-1, 0)
        cpu_s += usage.ru_utime + usage.ru_stime
        if pid == child:
            break
    report(status_fd, f"exit {status} {cpu_s:.6f}")
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def _drop_privileges(uid: int, status_fd: int) -> None:
    """Become ``uid``/``uid`` with no supplementary groups; changing every uid from 0
    clears all capabilities."""
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        report(status_fd, f"error cannot drop privileges to uid {uid}: {exc}")
        os._exit(SETUP_FAILED)


def _enter_cwd(cwd: str, status_fd: int) -> None:
    try:
        os.chdir(cwd)
    except OSError as exc:
        report(status_fd, f"error cannot enter the working directory: {exc}")
        os._exit(SETUP_FAILED)
    os.environ["PWD"] = cwd


def _exec_job(argv: list[str]) -> NoReturn:
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"agentmars: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def main(args: Sequence[str]) -> NoReturn:
    mode = args[0]
    split = list(args).index(_SEPARATOR)
    options: dict[str, list[str]] = {}
    for option in args[1:split]:
        key, _, value = option.partition("=")
        options.setdefault(key, []).append(value)
    argv = list(args[split + 1 :])
    status_fd = int(options["status_fd"][0])
    if mode == "enter":
        try:
            cores = map(int, options["cores"][0].split(","))
            enter_slot(options.get("procs", []), cores, options.get("rlimit", []))
        except OSError as exc:
            report(status_fd, f"error cannot confine the job: {exc}")
            os._exit(SETUP_FAILED)
        try:
            os.execv(argv[0], argv)
        except OSError as exc:
            report(status_fd, f"error cannot start {argv[0]}: {exc.strerror}")
            os._exit(SETUP_FAILED)
    uid = options.get("uid")
    supervise(argv, status_fd, options["cwd"][0], int(uid[0]) if uid else None)


if __name__ == "__main__":
    main(sys.argv[1:])
