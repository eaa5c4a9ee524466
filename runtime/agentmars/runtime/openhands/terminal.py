"""OpenHands' terminal tool with its commands run in the sandbox pool.

``SandboxTerminal`` is a ``ToolExecutor`` for ``TerminalTool.create(conv_state,
executor=...)`` (the SDK's own extension point): each command is one call of the pool
(``bash -c``, pinned to a slot's cores, in the conversation's sandbox), admitted and
reported (``tool_enqueue`` / ``tool_start`` / ``tool_end``) like any tool of the pool.

What a terminal session keeps between commands is carried from one call to the next: the
working directory and the exported variables, read from the shell when it exits (an
``EXIT`` trap prints them after a marker unique to the call, cut from the output). The
stock executor's contract is kept:

- ``timeout`` is a soft limit, as OpenHands means it: when it passes (or, without one,
  when the command has printed nothing new for ``no_change_timeout_s``) the observation
  has the output so far and exit code -1, and the command goes on; an empty command
  waits for more, ``C-c`` (``is_input``) stops it, another command is refused while it
  runs. The pool's own time limit (``SandboxConfig.default_timeout_s``) is the hard one.
- ``reset`` stops a running command and forgets the working directory and variables.
- ``interrupt()`` (a conversation's interrupt, from another thread) stops the command.
- The exit code is the command's (a signal ``n`` reads ``128 + n``, as in a shell).

Ours: input other than ``C-c`` / ``C-d`` / ``C-z`` cannot reach a running command (the
pool runs commands without a terminal, stdin closed); such an action is answered with
an error observation saying so.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from openhands.sdk.llm import TextContent
from openhands.sdk.tool import ToolExecutor
from openhands.tools.terminal.constants import NO_CHANGE_TIMEOUT_SECONDS, TIMEOUT_MESSAGE_TEMPLATE
from openhands.tools.terminal.definition import TerminalAction, TerminalObservation
from openhands.tools.terminal.metadata import CmdOutputMetadata

from agentmars.runtime.openhands.binding import SandboxSession
from agentmars.sandbox.spec import ExecResult, ExecSpec

if TYPE_CHECKING:
    from openhands.sdk.conversation import LocalConversation

TOOL = "terminal"
STOP_KEYS = ("C-c", "C-d", "C-z")
"""The keys that stop the running command (the pool kills its process tree)."""
SHELL_STATE = ("PWD", "OLDPWD", "SHLVL", "_")
"""Variables each shell sets itself: not carried to the next command."""
INTERRUPTED_EXIT = 130
"""A shell's exit code for a command stopped by Ctrl+C (128 + SIGINT)."""
_WRAPPER = """exec 2>&1
__agentmars_end() {{ __status=$?; printf '\\n%s%s\\0' '{marker}' "$PWD"; env -0; exit $__status; }}
trap __agentmars_end EXIT
cd {cwd} || exit 1
{command}
"""
"""The command as the pool runs it: stderr joined to stdout (as a terminal shows them),
the shell's state printed after ``marker`` on the way out, however the command ends."""


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@dataclass
class _Running:
    """A command of this terminal, running or just ended."""

    command: str
    call_id: str
    marker: str
    future: concurrent.futures.Future[ExecResult]
    output: bytearray = field(default_factory=bytearray)
    shown: int = 0
    """How much of ``output`` an observation has shown already."""
    last_output: float = field(default_factory=time.monotonic)


class SandboxTerminal(ToolExecutor[TerminalAction, TerminalObservation]):
    """One conversation's terminal, in its sandbox session."""

    def __init__(
        self, session: SandboxSession, *, no_change_timeout_s: float = NO_CHANGE_TIMEOUT_SECONDS
    ) -> None:
        self._session = session
        self._no_change_timeout_s = no_change_timeout_s
        self._cwd = str(session.workspace)
        self._env: dict[str, str] = {}
        self._running: _Running | None = None
        self._calls = 0
        self._lock = threading.Lock()

    @property
    def working_dir(self) -> str:
        return self._cwd

    def __call__(
        self, action: TerminalAction, conversation: LocalConversation | None = None
    ) -> TerminalObservation:
        with self._lock, self._session.span(TOOL) as span:
            observation = self._reset_then(action) if action.reset else self._execute(action)
            # The command the action started, waited for or stopped.
            span.set_attribute("gen_ai.tool.call.id", f"{TOOL}-{self._calls}")
            return observation

    def interrupt(self) -> None:
        running = self._running
        if running is not None:
            self._session.interrupt(running.call_id)

    def close(self) -> None:
        self.interrupt()

    # --- actions --------------------------------------------------------------------

    def _execute(self, action: TerminalAction) -> TerminalObservation:
        running = self._running
        if action.is_input:
            return self._input(action, running)
        if running is not None:
            if action.command.strip():
                return self._refused(action.command, running)
            return self._wait(running, action.timeout)
        if not action.command.strip():
            return _observation("", "", exit_code=0, cwd=self._cwd)
        return self._wait(self._start(action.command), action.timeout)

    def _reset_then(self, action: TerminalAction) -> TerminalObservation:
        if self._running is not None:
            self._stop(self._running)
        self._cwd, self._env = str(self._session.workspace), {}
        text = (
            "Terminal session has been reset. All previous environment variables and "
            "session state have been cleared."
        )
        if not action.command.strip():
            return _observation(text, "[RESET]", exit_code=0, cwd=self._cwd)
        observation = self._execute(action.model_copy(update={"reset": False}))
        return observation.model_copy(
            update={
                "content": [TextContent(text=f"{text}\n\n{observation.text}")],
                "command": f"[RESET] {action.command}",
            }
        )

    def _input(self, action: TerminalAction, running: _Running | None) -> TerminalObservation:
        if running is None:
            return _error(
                action.command, "No command is running: there is nothing to send input to."
            )
        if action.command.strip() in STOP_KEYS:
            self._stop(running)
            return self._ended(running, running.future.result())
        return _error(
            action.command,
            "The sandboxed terminal runs commands without a TTY and with stdin closed, so "
            f"input cannot reach the running command; send one of {', '.join(STOP_KEYS)} "
            "to stop it, or an empty command to wait for it.",
        )

    def _refused(self, command: str, running: _Running) -> TerminalObservation:
        suffix = (
            f'\n[Your command "{command}" is NOT executed. The previous command is still '
            "running - You CANNOT send new commands until the previous command is "
            "completed. By setting `is_input` to `true`, you can interact with the current "
            f"process: {TIMEOUT_MESSAGE_TEMPLATE}]"
        )
        return _observation(
            self._new_output(running), command, exit_code=-1, cwd=self._cwd, suffix=suffix
        )

    # --- commands in the pool ----------------------------------------------------------

    def _start(self, command: str) -> _Running:
        self._calls += 1
        marker = f"__agentmars_state_{uuid.uuid4().hex}__"
        script = _WRAPPER.format(marker=marker, cwd=_quoted(self._cwd), command=command)
        spec = ExecSpec(command=["bash", "-c", script], env=self._env)
        call_id = f"{TOOL}-{self._calls}"
        running: _Running

        def on_output(_stream: str, chunk: bytes) -> None:
            running.output += chunk
            running.last_output = time.monotonic()

        future = self._session.submit(
            self._session.pool.run(
                self._session.session_id,
                spec,
                tool=TOOL,
                priority=self._session.tool_priority(),
                call_id=call_id,
                turn=self._session.turn(),
                on_output=on_output,
            )
        )
        running = _Running(command, call_id, marker, future)
        self._running = running
        return running

    def _wait(self, running: _Running, timeout_s: float | None) -> TerminalObservation:
        """The command's observation once it ends, or at its soft time limit: ``timeout_s``
        from now, or without one, ``no_change_timeout_s`` without new output."""
        started = time.monotonic()

        def left() -> float:
            if timeout_s is not None:
                return started + timeout_s - time.monotonic()
            quiet_since = max(running.last_output, started)
            return quiet_since + self._no_change_timeout_s - time.monotonic()

        while (wait_s := left()) > 0:
            try:
                return self._ended(running, running.future.result(timeout=wait_s))
            except concurrent.futures.TimeoutError:
                continue  # new output moved the limit on, or it passed: ``left`` says
        if running.future.done():
            return self._ended(running, running.future.result())
        return self._still_running(running, timeout_s)

    def _still_running(self, running: _Running, timeout_s: float | None) -> TerminalObservation:
        if timeout_s is not None:
            note = f"The command timed out after {timeout_s:g} seconds."
        else:
            note = f"The command has no new output after {self._no_change_timeout_s:g} seconds."
        suffix = f"\n[{note} {TIMEOUT_MESSAGE_TEMPLATE}]"
        return _observation(
            self._new_output(running),
            running.command,
            exit_code=-1,
            cwd=self._cwd,
            suffix=suffix,
            timeout=True,
        )

    def _ended(self, running: _Running, result: ExecResult) -> TerminalObservation:
        self._running = None
        self._session.pool.emitter.flush()
        output = result.stdout
        cut = output.rfind("\n" + running.marker)
        if cut >= 0:
            self._keep_state(output[cut + 1 + len(running.marker) :])
            output = output[:cut]
        output = output[running.shown :]
        if result.status == "cancelled":
            exit_code, suffix = INTERRUPTED_EXIT, "\n[The command was interrupted.]"
        elif result.status == "timeout":
            exit_code = -1
            suffix = (
                f"\n[The command was killed at the sandbox's time limit ({result.wall_s:.0f} s).]"
            )
        else:
            status = result.exit_status
            exit_code = (128 - status if status < 0 else status) if status is not None else -1
            suffix = f"\n[{result.detail}]" if result.status == "killed" and result.detail else ""
        if result.stdout_truncated:
            suffix += "\n[The output was cut at the sandbox's output limit.]"
        return _observation(
            output, running.command, exit_code=exit_code, cwd=self._cwd, suffix=suffix
        )

    def _keep_state(self, trailer: str) -> None:
        cwd, _, variables = trailer.partition("\0")
        if cwd:
            self._cwd = cwd
        pairs = (entry.partition("=") for entry in variables.split("\0") if "=" in entry)
        self._env = {name: value for name, _, value in pairs if name and name not in SHELL_STATE}

    def _stop(self, running: _Running) -> None:
        self._session.interrupt(running.call_id)
        try:
            running.future.result()
        finally:
            self._running = None

    def _new_output(self, running: _Running) -> str:
        text = bytes(running.output).decode("utf-8", errors="replace")
        # The state printed on the way out is no output of the command.
        text = text.split("\n" + running.marker, 1)[0][running.shown :]
        running.shown += len(text)
        return text


def _observation(
    text: str,
    command: str,
    *,
    exit_code: int,
    cwd: str,
    suffix: str = "",
    timeout: bool = False,
) -> TerminalObservation:
    metadata = CmdOutputMetadata(exit_code=exit_code, working_dir=cwd, suffix=suffix)
    return TerminalObservation.from_text(
        text=text, command=command, exit_code=exit_code, timeout=timeout, metadata=metadata
    )


def _error(command: str, text: str) -> TerminalObservation:
    return TerminalObservation.from_text(text=text, command=command, is_error=True, exit_code=-1)
