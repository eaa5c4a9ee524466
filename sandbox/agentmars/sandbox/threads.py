"""The sandbox's own threads for blocking work (workspaces, cgroups, process groups,
in-process tools, the Docker API).

Never the event loop's default executor: a caller that runs OpenHands conversations
there (``asyncio.to_thread``: 6 threads on 2 cores) and waits on the pool from them
would leave the pool no thread to finish their calls with (issue 40: 6 concurrent
conversations deadlocked). In-process tools hold at most one thread per slot.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

MAX_THREADS = 64
"""Ours: past any slot count a host here has, plus the workspace and cgroup work."""

_THREADS = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="agentmars-sandbox")


async def in_thread(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``asyncio.to_thread`` on the sandbox's threads."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_THREADS, functools.partial(function, *args, **kwargs))
