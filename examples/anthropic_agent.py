"""An agent loop on Anthropic's client, unmodified, served through agentmars: the
Messages API with one tool, run until the model answers without a tool call.

Nothing of agentmars is imported: the client is pointed at the gateway (its
``/v1/messages``), and the loop names its conversation in ``metadata.user_id``, as
Claude Code does, which the gateway reads as the session.
"""

from __future__ import annotations

import argparse
import subprocess
import uuid
from typing import Any

import anthropic

TERMINAL = {
    "name": "terminal",
    "description": "Run a read-only shell command (a few are allowed).",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
ALLOWED = {"ls", "pwd", "date", "whoami"}


def terminal(command: str) -> str:
    program = command.split()[0] if command.split() else ""
    if program not in ALLOWED:
        return f"not allowed: {program!r}; use one of {sorted(ALLOWED)}"
    done = subprocess.run(command.split(), capture_output=True, text=True, timeout=10)
    return done.stdout or done.stderr


def solve(client: anthropic.Anthropic, model: str, max_turns: int) -> int:
    """The loop; returns the LLM calls it made."""
    conversation = f"agent_session_{uuid.uuid4()}"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in this folder?"}]
    for turn in range(max_turns):
        reply = client.messages.create(
            model=model,
            max_tokens=64,
            tools=[TERMINAL],
            messages=messages,
            metadata={"user_id": conversation},
        )
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return turn + 1
        results = [
            {"type": "tool_result", "tool_use_id": use.id, "content": terminal(**use.input)}
            for use in uses
        ]
        messages.append({"role": "user", "content": results})
    return max_turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--model", default="cpu-tiny")
    parser.add_argument("--max-turns", type=int, default=10)
    args = parser.parse_args()
    client = anthropic.Anthropic(base_url=args.base_url, api_key=args.api_key)
    print(f"{solve(client, args.model, args.max_turns)} LLM calls")


if __name__ == "__main__":
    main()
