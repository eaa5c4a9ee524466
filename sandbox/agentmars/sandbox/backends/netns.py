"""The slots' network namespaces (a root pool's; see the process backend's docstring
for why its jobs may share one): each is created by the sandbox init's ``netns`` role,
which sends a descriptor of it back and exits. From then on only that descriptor, in
the backend's process, holds it: no process lives in it between jobs and nothing is
mounted for it; it goes when the backend closes the descriptor (or dies) and the last
job in it is gone.

It is set up as bubblewrap's ``--unshare-net`` set up each job's: the loopback is its
only interface, and up, so that a job's processes can talk to each other. One
difference: no TCP TIME_WAIT (``tcp_max_tw_buckets`` 0), so that a job's connections
leave nothing for the next job of the slot to see, or to find its port taken by.
"""

from __future__ import annotations

import socket
import subprocess

from agentmars.sandbox.spec import SandboxError

CREATE_TIMEOUT_S = 30.0


def create(init: str) -> int:
    """A new network namespace, made by the sandbox init ``init``, as a descriptor of
    this process (close-on-exec)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, theirs:
        argv = [init, "netns", "--send", str(theirs.fileno())]
        try:
            done = subprocess.run(
                argv, pass_fds=(theirs.fileno(),), capture_output=True, timeout=CREATE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"creating a network namespace took over {exc.timeout:g} s") from exc
        if done.returncode != 0:
            raise SandboxError(done.stderr.decode(errors="replace").strip())
        # Sent before it exited: nothing to wait for.
        flags = socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
        _, (namespace,), _, _ = socket.recv_fds(ours, 1, 1, flags)
    return namespace
