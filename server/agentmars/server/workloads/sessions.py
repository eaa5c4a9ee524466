"""Turning sampled token counts and tool calls into a valid session."""

from __future__ import annotations

from collections.abc import Sequence

from agentmars.server.workloads.model import SessionSpec, ToolSpec, TurnSpec


def assemble_session(
    session_id: str,
    *,
    agent: str,
    first_prompt: int,
    appends: Sequence[int],
    outputs: Sequence[int],
    tools: Sequence[ToolSpec],
    max_context: int,
    shared_prefix: int = 0,
    prefix_group: str | None = None,
    task_id: str | None = None,
    arrival_s: float = 0.0,
    after: Sequence[str] = (),
) -> SessionSpec:
    """A session of ``len(outputs)`` turns: turn 0 appends ``first_prompt``, turn
    ``i > 0`` appends ``appends[i - 1]`` (the observation of tool ``i - 1``).

    Every call's prompt plus output stays within ``max_context`` (a model's context
    limit): a first prompt that does not fit is cut, and the session ends at the
    last turn that fits (its tool call dropped) -- an agent whose context is full
    stops. ``shared_prefix`` is cut to the first prompt. ``task_id``: the agent
    instance the session is a branch of (seed 004); ``after``: the sessions it waits
    for."""
    if not len(appends) == len(tools) == len(outputs) - 1:
        raise ValueError("need one append and one tool per turn after the first")
    if max_context < 2:
        raise ValueError(f"max_context {max_context} leaves no room for a prompt and an output")
    first_output = min(outputs[0], max_context - 1)
    first_append = min(first_prompt, max_context - first_output)
    kept, context = 1, first_append + first_output
    for append, output in zip(appends, outputs[1:], strict=True):
        if context + append + output > max_context:
            break
        kept, context = kept + 1, context + append + output
    sizes = [(first_append, first_output), *zip(appends[: kept - 1], outputs[1:kept], strict=True)]
    turns = tuple(
        TurnSpec(
            append_tokens=append, output_tokens=output, tool=tools[i] if i < kept - 1 else None
        )
        for i, (append, output) in enumerate(sizes)
    )
    shared = min(shared_prefix, first_append)
    return SessionSpec(
        session_id=session_id,
        arrival_s=arrival_s,
        agent=agent,
        shared_prefix_tokens=shared,
        prefix_group=prefix_group if shared else None,
        task_id=task_id,
        after=tuple(after),
        turns=turns,
    )
