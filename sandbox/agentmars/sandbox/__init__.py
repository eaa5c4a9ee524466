"""agentmars sandbox pool: CPU-pinned, isolated tool execution under admission control.

    pool = SandboxPool(SandboxConfig(slots=2))
    result = await pool.run("session-1", ExecSpec(command=["pytest", "-q"]), tool="terminal")

Backends: ``process`` (bubblewrap + cgroups, the default) and ``docker``.
"""

from agentmars.sandbox.config import SandboxConfig
from agentmars.sandbox.spec import ExecResult, ExecSpec, SandboxError

__all__ = ["ExecResult", "ExecSpec", "SandboxConfig", "SandboxError"]
