"""An agent loop on the plain OpenAI client, recorded by the agentmars SDK.

The model may call a "terminal" tool (a few read-only commands run as real
subprocesses) and a "finish" tool; the loop ends on "finish", on an answer without
a tool call, or after --max-turns. Every boundary the session crosses lands in
--events as one JSON line (`agentmars events show FILE` prints them).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from contextlib import nullcontext
from typing import Any

import openai

from agentmars import sdk
from agentmars.sdk.integrations.openai import instrument_openai

# The model picks a command from a list rather than writing one: an example should
# never run whatever a model wrote in a shell. (The twin answers with the first one.)
COMMANDS = ["ls -1", "pwd", "uname -s"]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a read-only shell command and read its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "enum": COMMANDS}},
                "required": ["command"],
            },
        },
    },
    {"type": "function", "function": {"name": "finish", "description": "End the task."}},
]
TASK = "Look around the current directory with the terminal, then call finish."


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="cpu-tiny")
    parser.add_argument("--api-key", default="unused", help="the gateway does not check it")
    parser.add_argument("--events", default="events.jsonl", help="JSONL file the events go to")
    parser.add_argument("--max-turns", type=int, default=6)
    return parser.parse_args()


def run_terminal(tool_call: Any) -> str:
    """Run one "terminal" call as a subprocess; its exit status goes into tool_end."""
    # Reusing the model's tool_call_id ties the tool's events to the call that asked.
    with sdk.tool("terminal", call_id=tool_call.id) as call:
        command = json.loads(tool_call.function.arguments or "{}").get("command")
        if command not in COMMANDS:
            call.set_exit_status(126)  # non-zero: tool_end says "error"
            return f"refused: {command!r} is not one of {COMMANDS}"
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=10)
        call.set_exit_status(done.returncode)
        return (done.stdout + done.stderr)[-2000:]


def run_tool_calls(message: Any, messages: list[dict[str, Any]]) -> bool:
    """Run the answer's tool calls, appending their results; False once the agent is done."""
    if not message.tool_calls:
        return False
    for tool_call in message.tool_calls:
        if tool_call.function.name == "finish":
            return False
        output = run_terminal(tool_call)
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": output})
    return True


@sdk.session(agent="coder")  # a fresh session (session_start .. session_end) per call
def solve(client: openai.OpenAI, model: str, max_turns: int) -> int:
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for turn in range(max_turns):
        # The agent knows its first step is a terminal call: telling the scheduler lets a
        # policy keep the session's KV cache across that tool. (Only then: the twin always
        # calls the hinted tool, so a hint on every call would never reach "finish".)
        hinted = sdk.hints(next_tool="terminal", expected_tool_s=1)
        with hinted if turn == 0 else nullcontext():
            reply = client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=32
            )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # the answer goes back
        if not run_tool_calls(message, messages):
            return turn + 1
    return max_turns


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    sdk.configure(sdk.JsonlSink(args.events))
    # Every call of this client inside a session carries the session's id and turn.
    client = instrument_openai(openai.OpenAI(base_url=args.base_url, api_key=args.api_key))
    turns = solve(client, args.model, args.max_turns)
    sdk.configure()  # closes the sink, flushing the file
    print(f"{turns} LLM calls; events in {args.events}")


if __name__ == "__main__":
    main()
