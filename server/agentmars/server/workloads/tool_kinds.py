"""How much host CPU a tool call uses, by kind.

No seed paper publishes the CPU demand of its tools, only their wall-clock
durations, so the cores below are ours (``NOTE:``). The rule: a tool that runs code
on the host (a shell command, a test suite, a search through files, a calculator,
a simulated environment) keeps one core busy for its whole duration; a file view or
edit spends part of its time in I/O and the runtime's round trip (half a core); a
tool that waits on something off the host (a remote API, a web page, another
model, a human, a sub-agent) uses none. A parallel test suite or build (ilr-2-cpu's)
keeps ``PARALLEL_CORES`` whole cores busy.
"""

from __future__ import annotations

from agentmars.server.workloads.model import ToolSpec

PARALLEL_CORES = 4.0
"""Cores of a parallel test suite or build (ours: pytest-xdist's and make's usual
``-n 4`` / ``-j4``; no seed publishes a tool's CPU demand)."""

TOOL_CORES: dict[str, float] = {
    # coding agents (ILR, coding-agent, SWE-bench)
    "bash": 1.0,
    "test": 1.0,
    # the CPU-heavy variant (ilr-2-cpu): a test suite run in parallel (pytest -n 4)
    # and a parallel build (make -j4) keep PARALLEL_CORES cores busy
    "test-suite": PARALLEL_CORES,
    "build": PARALLEL_CORES,
    "search": 1.0,
    "read": 0.5,
    "edit": 0.5,
    "wait": 0.0,
    "web": 0.0,
    "human": 0.0,
    # API-style tools (BFCL, ToolBench / AgentServe)
    "function": 0.0,
    "api": 0.0,
    # INFERCEPT's API classes (seed 001 Table 1): local calculator and virtual
    # environment; the rest call other models or services
    "math": 1.0,
    "ve": 1.0,
    "qa": 0.0,
    "chatbot": 0.0,
    "image": 0.0,
    "tts": 0.0,
    # task-parallel agents: ALFWorld steps run a local simulator; handoffs between
    # the stages of one agent take no time
    "env": 1.0,
    "handoff": 0.0,
    # an imported gap whose cause the trace does not record (Mooncake)
    "gap": 0.0,
}

_NAME_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    # Order matters: "WebSearch" is web, not search; "write_stdin" waits on a process.
    (("web", "fetch", "http", "url", "browser"), "web"),
    (("task", "agent", "stdin", "human", "ask"), "wait"),
    (("bash", "exec", "shell", "command", "terminal", "run"), "bash"),
    (("test",), "test"),
    (("edit", "write", "patch", "replace", "notebook", "create"), "edit"),
    (("read", "view", "cat", "open"), "read"),
    (("grep", "glob", "search", "find", "ls"), "search"),
)


def canonical_kind(name: str) -> str:
    """The kind of ``TOOL_CORES`` a recorded tool name belongs to (e.g. TraceLab's
    ``Bash``, ``exec_command``, ``Read``, ``WebSearch``); unknown names (MCP tools
    and the like) count as ``api``, which uses no host CPU."""
    lowered = name.lower()
    if lowered in TOOL_CORES:
        return lowered
    for words, kind in _NAME_RULES:
        if any(word in lowered for word in words):
            return kind
    return "api"


def tool_call(kind: str, wall_s: float) -> ToolSpec:
    """A synthetic or imported tool call; its CPU demand follows from its kind."""
    wall = max(0.0, float(wall_s))
    return ToolSpec(kind=kind, wall_s=wall, cpu_s=wall * TOOL_CORES[canonical_kind(kind)])
