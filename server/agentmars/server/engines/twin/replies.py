"""What the twin's answer says, spread over the tokens its engine decodes, and the
request fields that shape it (``stop``, ``response_format``, ``logprobs``, ``echo``).

The engine paces ``max_tokens`` tokens (or fewer, when a stop string ends the answer);
a ``Reply`` says which text each token carries:

- by default the synthetic words, one a token (token ``i`` is ``WORDS[i % 8]`` and a
  space), ``finish_reason`` "length";
- with ``response_format`` ``json_object`` / ``json_schema``, a JSON document
  (``schema_values``), spread evenly over the tokens, "stop";
- a tool call (``tool_calls``): its arguments, spread evenly, "tool_calls".

NOTE: ours — the twin has no end-of-sequence token, so a JSON document or a tool call
takes the call's whole ``max_tokens``: the paced decode (which replays a workload's
output lengths) decides how many tokens an answer takes, not its text's length.
``stop`` is honoured as vLLM honours it: the content is cut before the first stop
string, and the call ends on the token that completes it ("stop"). A tool call's
arguments are never cut: a cut call is not JSON, and no agent could run it.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from agentmars.server.engines.twin.engine import LiveError
from agentmars.server.engines.twin.schema_values import SchemaError, json_for
from agentmars.server.engines.twin.tool_calls import ToolCall

WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")
"""The synthetic answer's vocabulary: token ``i`` is ``WORDS[i % 8]`` and a space."""
_OFFSETS = [sum(len(word) + 1 for word in WORDS[:i]) for i in range(len(WORDS) + 1)]
MAX_STOPS = 64
"""Most stop strings a request may give (ours: each one is looked for in the whole
answer; OpenAI takes 4)."""
JSON_OBJECT: Mapping[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}
"""The schema of a ``json_object`` answer (which names none): an object of one string."""
RESPONSE_FORMATS = (
    "'response_format' must be {'type': 'text'}, {'type': 'json_object'} or "
    "{'type': 'json_schema', 'json_schema': {'schema': {...}}}"
)


def token_text(index: int) -> str:
    return WORDS[index % len(WORDS)] + " "


def token_id(index: int) -> int:
    """The synthetic id of answer token ``index`` (its word's place in ``WORDS``)."""
    return index % len(WORDS)


def _words_offset(index: int) -> int:
    """Where token ``index`` starts in the synthetic words."""
    cycles, rest = divmod(index, len(WORDS))
    return cycles * _OFFSETS[-1] + _OFFSETS[rest]


@dataclass(frozen=True, slots=True)
class Reply:
    """The text an answer's tokens say: token ``i`` carries ``text[start(i):start(i+1)]``,
    up to ``said`` characters."""

    text: str
    """All the answer would say in ``span`` tokens."""
    span: int
    """The tokens the text is spread over (the call's ``max_tokens``)."""
    finish_reason: str
    words: bool = False
    """One synthetic word a token; else the text is spread evenly."""
    tool_call: ToolCall | None = None
    """The call whose arguments the text is (None: the text is the content)."""
    tokens: int | None = None
    """The tokens the answer ends after, when fewer than ``span`` (a stop string)."""
    said: int | None = None
    """The characters the answer keeps, when fewer than the text's (a stop string)."""

    @property
    def length(self) -> int:
        """Tokens the engine decodes for the answer."""
        return self.span if self.tokens is None else self.tokens

    @property
    def content(self) -> str:
        """All the answer says."""
        return self.text[: self.said]

    def piece(self, index: int) -> str:
        """What token ``index`` says."""
        end = len(self.text) if self.said is None else self.said
        return self.text[min(self.start(index), end) : min(self.start(index + 1), end)]

    def start(self, index: int) -> int:
        """Where token ``index``'s piece starts in ``text``."""
        if self.words:
            return _words_offset(index)
        # Rounded up: the first token always says something (a client's first token).
        return -(-index * len(self.text) // self.span)

    def cut_at_stop(self, stops: list[str]) -> Reply:
        """The reply ended by the first of ``stops`` that its text completes."""
        ends = []
        for stop in stops:
            found = self.text.find(stop)
            if found >= 0:
                # The call goes on until the token that completes the stop string.
                tokens = bisect.bisect_left(range(self.span + 1), found + len(stop), key=self.start)
                ends.append((tokens, found))
        if not ends:
            return self
        tokens, found = min(ends)
        return replace(self, tokens=tokens, said=found, finish_reason="stop")


def reply_for(body: Mapping[str, Any], tool_call: ToolCall | None, span: int) -> Reply:
    """The reply to a request whose call may decode ``span`` tokens."""
    # Checked whatever the answer turns out to be: a bad field is refused, not ignored.
    stops = stop_strings(body)
    schema = json_schema_of(body)
    if tool_call is not None:
        return Reply(tool_call.arguments, span, "tool_calls", tool_call=tool_call)
    if schema is None:
        words = "".join(token_text(i) for i in range(span))
        return Reply(words, span, "length", words=True).cut_at_stop(stops)
    try:
        document = json_for(schema)
    except SchemaError as error:
        raise LiveError(f"'response_format' json_schema: {error}", "response_format") from None
    return Reply(document, span, "stop").cut_at_stop(stops)


def stop_strings(body: Mapping[str, Any]) -> list[str]:
    """``stop``: a string or a list of them (none empty)."""
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise LiveError(
            f"'stop' must be a non-empty string or a list of them, got {stop!r:.80}", "stop"
        )
    if len(stops) > MAX_STOPS:
        raise LiveError(f"'stop' may hold at most {MAX_STOPS} strings", "stop")
    return stops


def json_schema_of(body: Mapping[str, Any]) -> object | None:
    """The schema ``response_format`` asks the content to follow; None: plain text."""
    form = body.get("response_format")
    kind = form.get("type") if isinstance(form, Mapping) else None
    if form is None or kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    spec = form.get("json_schema") if isinstance(form, Mapping) else None
    if kind != "json_schema" or not isinstance(spec, Mapping):
        raise LiveError(RESPONSE_FORMATS, "response_format")
    schema: object = spec.get("schema", JSON_OBJECT)
    return schema


def refuse_logprobs(body: Mapping[str, Any], *, chat: bool) -> None:
    """Logprobs are refused (400), not made up.

    NOTE: ours — the twin's tokens come from no distribution. Well-formed synthetic
    logprobs (every token certain) would be easy for the words, but not for the tokens
    of a JSON document or a tool call, and a client that acts on them (a confidence
    threshold, a reranker) would act on numbers that mean nothing."""
    for field in ("logprobs", "top_logprobs") if chat else ("logprobs",):
        value = body.get(field)
        # Chat's fields may be sent switched off; the completions API's ``logprobs`` = 0
        # still asks for the sampled token's.
        if value is not None and not (chat and value in (False, 0)):
            raise LiveError(
                f"the simulated engine computes no logprobs (its tokens are synthetic): "
                f"'{field}' must be {'false or 0' if chat else 'null'}, got {value!r:.80}",
                field,
            )


def echoes(body: Mapping[str, Any], *, chat: bool) -> bool:
    """Whether the answer starts with the prompt (``echo``, the completions API's)."""
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise LiveError(f"'echo' must be true or false, got {echo!r:.80}", "echo")
    if echo and chat:
        raise LiveError("the simulated engine echoes completions prompts only", "echo")
    return echo
