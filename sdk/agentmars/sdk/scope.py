"""One object that works as a sync / async context manager and as a decorator.

``with session(): ...``, ``async with session(): ...`` and ``@session()`` on a
sync or async function all go through ``Scope``; a decorated function gets a
fresh scope per invocation (built by ``fresh()``), so concurrent invocations
never share state.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def outcome_of(exc: BaseException | None) -> tuple[str, str | None]:
    """Map how a block ended to an event status and an error message."""
    if exc is None:
        return "ok", None
    if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | GeneratorExit):
        return "cancelled", type(exc).__name__
    return "error", f"{type(exc).__name__}: {exc}"[:1000]


class Scope:
    """Subclasses implement ``_open`` / ``_close`` and ``fresh``."""

    def fresh(self) -> Self:
        """A new, unopened scope with the same arguments (one per decorated call)."""
        raise NotImplementedError

    def _open(self) -> None:
        raise NotImplementedError

    def _close(self, exc: BaseException | None) -> None:
        raise NotImplementedError

    def _on_result(self, result: Any) -> None:
        """Hook for decorated functions: look at the return value before closing."""

    def __enter__(self) -> Self:
        self._open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(exc)

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(exc)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with self.fresh() as scope:
                    result = await fn(*args, **kwargs)
                    scope._on_result(result)
                    return result

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with self.fresh() as scope:
                result = fn(*args, **kwargs)
                scope._on_result(result)
                return result

        return run
