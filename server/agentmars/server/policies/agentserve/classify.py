"""The Request Manager (seed 002 §III-A): each call is a cold prefill, a resume prefill
or a decode, and goes to Q_D or Q_P by Algorithm 1 lines 12-18.

- **decode**: a running call past its prompt (it has output and computes one token a
  step).
- **resume prefill**: a call that follows a tool (``follows_tool``) whose earlier
  context is cached; its new tokens are the tool's output (and whatever else the
  client appended).
- **cold prefill**: a call with no cached prefix of its own session: the session's
  first call (a shared system prompt found in the cache does not make it a resume),
  or one whose context was evicted.

What is cached is the engine's to say, at the call's admission (``CallView.
cached_tokens``). Before it (a waiting call) the half expects what its session's
previous call left: that context's full blocks (NOTE: ours, the prefix cache keeps
only full blocks, and the last generated token's KV is never computed). A call
admitted with less than that cached lost its context, in part or whole, to eviction:
cold.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agentmars.sdk.events import AnyEvent, LLMEnd, SessionEnd
from agentmars.server.policies.views import CallView, EngineView


class Kind(StrEnum):
    COLD = "cold_prefill"
    RESUME = "resume_prefill"
    DECODE = "decode"


class Queue(StrEnum):
    DECODE = "Q_D"
    """Decodes and resume prefills of at most B_prefill new tokens."""
    PREFILL = "Q_P"
    """Cold prefills and longer resume prefills."""


@dataclass(frozen=True, slots=True)
class Classified:
    kind: Kind
    new_tokens: int
    """Prompt tokens the call computes beyond its cached prefix (0 for a decode)."""


class Contexts:
    """Each session's context after its last finished call (its prompt and output),
    from the stream's ``llm_end`` and the engine's finished calls."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}

    def on_event(self, event: AnyEvent) -> None:
        if isinstance(event, LLMEnd) and event.prompt_tokens is not None:
            self.tokens[event.session_id] = event.prompt_tokens + (event.output_tokens or 0)
        elif isinstance(event, SessionEnd):
            self.tokens.pop(event.session_id, None)

    def finished(self, call: CallView) -> None:
        self.tokens[call.session_id] = call.num_tokens

    def expected_prefix(self, call: CallView, block_size: int) -> int:
        """Tokens of ``call``'s prompt its session's previous context leaves cached:
        its full blocks, short of the prompt's last token (0: no previous call known,
        or the call does not follow a tool)."""
        previous = self.tokens.get(call.session_id)
        if previous is None or not call.follows_tool:
            return 0
        return max(min((previous - 1) // block_size * block_size, call.prompt_tokens - 1), 0)


def classify(call: CallView, contexts: Contexts, view: EngineView) -> Classified:
    """The call's kind (module docstring)."""
    if call.output_tokens > 0 and call.num_computed_tokens >= call.num_tokens - 1:
        return Classified(Kind.DECODE, 0)
    expected = contexts.expected_prefix(call, view.block_size)
    cached = call.cached_tokens
    if cached is None:
        cached = expected
    new_tokens = max(call.prompt_tokens - cached, 0)
    if call.follows_tool and cached > 0 and cached >= expected:
        return Classified(Kind.RESUME, new_tokens)
    return Classified(Kind.COLD, new_tokens)


def queue_of(classified: Classified, b_prefill: int) -> Queue:
    """Algorithm 1 lines 13-17: decodes and resume prefills of at most ``b_prefill``
    new tokens to Q_D, the rest (cold prefills, longer resumes) to Q_P."""
    if classified.kind is Kind.DECODE or (
        classified.kind is Kind.RESUME and classified.new_tokens <= b_prefill
    ):
        return Queue.DECODE
    return Queue.PREFILL
