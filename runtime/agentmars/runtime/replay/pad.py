"""Runs inside a session's sandbox with the system's Python, standing alone (it imports
nothing of agentmars): a tool's real action, then padding to the tool's size.

    python3 -c "$(cat pad.py)" WALL_S CPU_S PROCESSES -- ACTION...

Runs ACTION (if any), then burns what is left of CPU_S seconds of CPU over PROCESSES
processes, then sleeps until WALL_S have passed since the start; exits with ACTION's
status. CPU is burnt by CPU time, not wall time, so tools sharing cores take longer,
as the simulator's processor sharing makes them.
"""

import os
import subprocess
import sys
import time


def burn(cpu_s: float) -> None:
    end = time.process_time() + cpu_s
    spin = 0
    while time.process_time() < end:
        for _ in range(10_000):
            spin += 1


def children_cpu_s() -> float:
    times = os.times()
    return times.children_user + times.children_system


def main(argv: list[str]) -> int:
    wall_s, cpu_s, processes = float(argv[0]), float(argv[1]), max(int(argv[2]), 1)
    action = argv[4:] if len(argv) > 3 and argv[3] == "--" else []
    started = time.monotonic()
    status = subprocess.run(action, check=False).returncode if action else 0
    share = max(cpu_s - children_cpu_s(), 0.0) / processes
    forked = []
    for _ in range(processes - 1):
        pid = os.fork()
        if pid == 0:
            burn(share)
            os._exit(0)
        forked.append(pid)
    burn(share)
    for pid in forked:
        os.waitpid(pid, 0)
    time.sleep(max(wall_s - (time.monotonic() - started), 0.0))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
