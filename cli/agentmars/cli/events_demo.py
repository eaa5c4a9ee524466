"""``agentmars events demo``: two instrumented agent sessions and the event stream they make.

A scripted OpenAI-compatible server runs on loopback; two agents run
concurrently against it, one through the OpenAI client (streaming), one
through LiteLLM. Each asks the model, runs the tool the model calls as a real
subprocess, and answers. Every boundary event is printed as it happens, then
what the server saw on the wire.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentmars import sdk
from agentmars.cli.render import details
from agentmars.sdk.events import Event

console = Console(soft_wrap=True)

TASK = "How many Python files are in the current directory?"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command and return its output.",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
        },
    }
]
# The command the demo's terminal tool runs (a real process, timed as the tool call).
COMMAND = [sys.executable, "-c", "import glob; print(len(glob.glob('*.py')))"]
MAX_TURNS = 4


class ConsoleSink:
    """Prints each event as one line the moment it is emitted."""

    def __init__(self) -> None:
        self._t0: int | None = None
        self._lock = threading.Lock()
        self._colours: dict[str, str] = {}

    def emit(self, event: Event) -> None:
        with self._lock:
            self._t0 = self._t0 if self._t0 is not None else event.mono_ns
            session = str(getattr(event, "session_id", "-"))
            colour = self._colours.setdefault(
                session, ["cyan", "magenta", "green"][len(self._colours) % 3]
            )
            turn = getattr(event, "turn", None)
            turn_text = "" if turn is None else f"turn {turn}"
            console.print(
                f"{(event.mono_ns - self._t0) / 1e6:8.1f} ms  [{colour}]{session[:8]}[/]  "
                f"{turn_text:7} [bold]{event.kind:16}[/] {details(event)}",
                highlight=False,
            )

    def close(self) -> None:
        pass


def run_tool() -> str:
    with sdk.tool("terminal") as call:
        done = subprocess.run(COMMAND, capture_output=True, text=True, timeout=30, check=False)
        call.set_exit_status(done.returncode)
    return done.stdout.strip() or done.stderr.strip()


def _tool_reply(message: dict[str, Any], output: str) -> list[dict[str, Any]]:
    return [
        message,
        *(
            {"role": "tool", "tool_call_id": call["id"], "content": output}
            for call in message["tool_calls"]
        ),
    ]


async def openai_agent(base_url: str) -> None:
    import openai

    from agentmars.sdk.integrations.openai import instrument_openai

    client = instrument_openai(openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="demo"))
    messages: list[Any] = [{"role": "user", "content": TASK}]
    async with sdk.session(agent="openai-agent"):
        for _ in range(MAX_TURNS):
            stream: Any = await client.chat.completions.create(
                model="scripted", messages=messages, tools=TOOLS, stream=True, max_tokens=12
            )
            tool_calls: list[dict[str, Any]] = []
            async for chunk in stream:
                for choice in chunk.choices:
                    tool_calls += [c.model_dump() for c in choice.delta.tool_calls or ()]
            if not tool_calls:
                return
            # to_thread copies the context, so the tool runs inside this session.
            output = await asyncio.to_thread(run_tool)
            messages += _tool_reply({"role": "assistant", "tool_calls": tool_calls}, output)


async def litellm_agent(base_url: str) -> None:
    from agentmars.sdk.integrations import litellm

    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    async with sdk.session(agent="litellm-agent"):
        for _ in range(MAX_TURNS):
            reply = await litellm.acompletion(
                model="hosted_vllm/scripted", api_base=f"{base_url}/v1", api_key="demo",
                messages=messages, tools=TOOLS, max_tokens=8,
            )  # fmt: skip
            message = reply.choices[0].message.model_dump(exclude_none=True)
            if not message.get("tool_calls"):
                return
            messages += _tool_reply(message, run_tool())


def _wire_table(requests: list[Any]) -> Table:
    table = Table(title="What the server received", header_style="bold")
    for column in ("path", "X-Session-ID", "body session_id", "vllm_xargs"):
        table.add_column(column)
    for request in requests:
        xargs = request.body.get("vllm_xargs", {})
        table.add_row(
            request.path,
            request.headers.get("x-session-id", "")[:8],
            str(request.body.get("session_id", ""))[:8],
            json.dumps({k: v for k, v in xargs.items() if k != "session_id"}),
        )
    return table


def run_demo(out: Path | None) -> None:
    # Import the clients before the agents start: LiteLLM's import takes seconds and
    # would stall the event loop both agents share.
    import agentmars.sdk.integrations.litellm
    import agentmars.sdk.integrations.openai  # noqa: F401
    from agentmars.server.engines.scripted.app import create_scripted_llm_app
    from agentmars.server.web.serving import serve_in_thread

    sinks: list[sdk.Sink] = [ConsoleSink()]
    if out is not None:
        sinks.append(sdk.JsonlSink(out))
    sdk.configure(*sinks)
    app = create_scripted_llm_app()
    console.rule("agentmars demo: two agents, one event stream")
    try:
        with serve_in_thread(app) as url:
            console.print(f"scripted OpenAI-compatible server on {url}\n")

            async def both() -> None:
                await asyncio.gather(openai_agent(url), litellm_agent(url))

            asyncio.run(both())
    finally:
        sdk.configure()
    console.print()
    console.print(_wire_table(app.state.requests))
    if out is not None:
        console.print(f"event stream written to {out} (check it: agentmars events validate {out})")
