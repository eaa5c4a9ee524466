"""The agent loop of decorated_agent_loop.py, through LiteLLM instead of the OpenAI client.

instrument_litellm() swaps litellm.completion (and acompletion, responses, ...) for
recording wrappers wherever loaded code holds them, so an agent written against
LiteLLM (OpenHands is one) is recorded without touching its calls.
"""

from __future__ import annotations

from typing import Any

# First: importing the integration tells LiteLLM not to fetch its model-cost map from the
# internet when LiteLLM is imported (serving hosts often have no route out).
from agentmars.sdk.integrations.litellm import instrument_litellm

# isort: split
import litellm

# The tools, their runner and the command line are the OpenAI example's (same folder).
from decorated_agent_loop import TASK, TOOLS, parse_args, run_tool_calls

from agentmars import sdk


def solve(base_url: str, api_key: str, model: str, max_turns: int) -> int:
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    with sdk.session(agent="coder"):  # as a `with` block this time: the same events
        for turn in range(max_turns):
            reply = litellm.completion(
                # "openai/" makes LiteLLM speak the OpenAI API to api_base (the gateway).
                model=f"openai/{model}",
                api_base=base_url,
                api_key=api_key,
                messages=messages,
                tools=TOOLS,
                tool_choice="auto",
                max_tokens=32,
            )
            message = reply.choices[0].message
            messages.append(message)  # LiteLLM takes its own message objects back
            if not run_tool_calls(message, messages):
                return turn + 1
    return max_turns


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    sdk.configure(sdk.JsonlSink(args.events))
    instrument_litellm()  # before or after importing the agent's modules: either works
    turns = solve(args.base_url, args.api_key, args.model, args.max_turns)
    sdk.configure()  # closes the sink, flushing the file
    print(f"{turns} LLM calls; events in {args.events}")


if __name__ == "__main__":
    main()
