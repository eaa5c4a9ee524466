"""The LLM-call APIs the gateway forwards, as vLLM serves them: OpenAI's chat and text
completions, OpenAI's Responses API (OpenHands uses it for some models) and
Anthropic's Messages API.

An LLM call is an LLM call whatever its API: each goes through admission and records
the same events (``call_meta``, ``events``). What differs is where a request carries
its prompt, its tool markers and (for Anthropic's) its session, and where an answer,
whole or streamed, carries the output, the usage and the finish: one class per API
says so. Every reader takes raw JSON, which is read, never trusted: a malformed part
reads as absent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agentmars.sdk.calls import as_name
from agentmars.sdk.events import as_count
from agentmars.sdk.integrations.request import project_prompt_tokens

Operation = Literal["chat", "text_completion"]


@dataclass(frozen=True, slots=True)
class Usage:
    """An answer's token figures; None where it gives none."""

    prompt: int | None = None
    cached: int | None = None
    output: int | None = None

    def updated(self, later: Usage) -> Usage:
        """These figures with those of a later report laid over them (an Anthropic
        stream reports the prompt's at its start and the output's at its end)."""
        return Usage(
            prompt=self.prompt if later.prompt is None else later.prompt,
            cached=self.cached if later.cached is None else later.cached,
            output=self.output if later.output is None else later.output,
        )


@dataclass(frozen=True, slots=True)
class Identity:
    """An answer's id (``chatcmpl-...``) and model; None where it gives none."""

    response_id: str | None = None
    model: str | None = None

    @classmethod
    def of(cls, carrier: object) -> Identity:
        """The ``id`` and ``model`` fields of a JSON object, if they are names."""
        fields = _dict(carrier)
        return cls(as_name(fields.get("id")), as_name(fields.get("model")))

    def updated(self, later: Identity) -> Identity:
        """This identity with what a later chunk gives laid over it."""
        return Identity(later.response_id or self.response_id, later.model or self.model)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _last(value: object) -> dict[str, Any]:
    """The last item of a JSON list, if it is an object."""
    return _dict(value[-1]) if isinstance(value, list) and value else {}


MAX_PROMPT_TEXT = 16_384
"""Characters of a prompt's text a policy may read (ours: an agent's input, which is
what Justitia's predictor reads, is its first call's prompt; a prompt's tail adds
nothing to a TF-IDF of thousands of words but per-call work in the gateway)."""
TEXT_FIELDS = ("content", "text", "input", "prompt", "instructions", "system")
"""Where the APIs' message objects keep their text (a tool call's arguments are not
the agent's input)."""


MAX_PROMPT_VISITS = 10_000
"""Values of a prompt's fields looked into for its text, at most (ours: a real prompt
gives ``MAX_PROMPT_TEXT`` characters long before; a body of a hundred thousand empty
messages must not cost the event loop a walk of them all)."""


def _texts(value: object, budget: list[int], depth: int = 0) -> Iterator[str]:
    """The strings of a prompt field, depth first (no deeper than the APIs nest text:
    a body nested deeper is not walked into a recursion error), in at most
    ``budget[0]`` values (spent as they are looked into)."""
    if value is None:  # a text field the object does not have
        return
    budget[0] -= 1
    if budget[0] < 0:
        return
    if isinstance(value, str):
        yield value
    elif depth >= 8:
        return
    elif isinstance(value, list):
        for item in value:
            if budget[0] <= 0:
                return
            yield from _texts(item, budget, depth + 1)
    elif isinstance(value, dict):
        for name in TEXT_FIELDS:
            yield from _texts(value.get(name), budget, depth + 1)


class LLMApi:
    """Where one API's requests and answers carry what the gateway reads. The base
    reads what the APIs share; each API overrides the rest."""

    path: str
    summary: str
    prompt_field: str
    """The field besides ``model`` the OpenAPI document requires."""
    prompt_fields: tuple[str, ...] = ()
    """The fields whose text makes the prompt (projected at 4 characters a token)."""
    max_tokens_fields: tuple[str, ...] = ("max_tokens",)
    session_fields: tuple[tuple[str, str], ...] = ()
    """Where this API names the session, below ``call_meta.FOREIGN_SESSION_FIELDS``."""
    continues_field: str | None = None
    """The body field naming an earlier answer, by its response id, that the call
    continues (None: the API has none): the call is in that answer's session, below
    all of ``session_fields``."""

    def stores_answer(self, body: Mapping[str, Any]) -> bool:
        """The engine keeps the answer for a later call to continue
        (``continues_field``)."""
        return False

    def operation(self, body: Mapping[str, Any]) -> Operation:
        return "chat"

    def prompt_tokens(self, body: Mapping[str, Any]) -> int | None:
        """The SDK's projection over the prompt's fields and the tools offered (None:
        the body has no prompt)."""
        parts = [body[name] for name in self.prompt_fields if name in body]
        if not parts:
            return None
        return project_prompt_tokens({"messages": parts, "tools": body.get("tools")})

    def prompt_text(self, body: Mapping[str, Any]) -> str:
        """The prompt's text, its messages' contents joined by new lines, at most
        ``MAX_PROMPT_TEXT`` characters (found in the first ``MAX_PROMPT_VISITS`` values):
        what a policy reading the agent's input sees (seed 004's cost predictor)."""
        fields = [body.get(name) for name in self.prompt_fields or (self.prompt_field,)]
        texts, length = [], 0
        for text in _texts(fields, [MAX_PROMPT_VISITS]):
            texts.append(text)
            length += len(text) + 1
            if length >= MAX_PROMPT_TEXT:
                break
        return "\n".join(texts)[:MAX_PROMPT_TEXT]

    def max_tokens(self, body: Mapping[str, Any]) -> int | None:
        return as_count(next((body[f] for f in self.max_tokens_fields if f in body), None))

    def follows_tool(self, body: Mapping[str, Any]) -> bool:
        """The request's context ends with a tool's result."""
        raise NotImplementedError

    def tools_offered(self, body: Mapping[str, Any]) -> bool:
        """Tools are offered and the model may call them (``tool_choice`` is not none:
        ``"none"`` for OpenAI's APIs, ``{"type": "none"}`` for Anthropic's)."""
        choice = body.get("tool_choice")
        refused = choice == "none" or _dict(choice).get("type") == "none"
        return bool(body.get("tools")) and not refused

    def carries_output(self, chunk: dict[str, Any]) -> bool:
        """A stream chunk carries generated text, reasoning or a tool call (the first
        token's rule, as the SDK's)."""
        raise NotImplementedError

    def usage(self, answer: dict[str, Any]) -> Usage | None:
        """The token figures a whole answer or a stream chunk reports, if any."""
        raise NotImplementedError

    def finish(self, answer: dict[str, Any]) -> tuple[str, bool] | None:
        """How a whole answer or a stream chunk says the call ended: its reason and
        whether it ended in a tool call (None: it does not say)."""
        raise NotImplementedError

    def identity(self, answer: dict[str, Any]) -> Identity:
        """The answer's id and the model that produced it, as a whole answer or a
        stream chunk gives them (the Completions APIs: on the object itself)."""
        return Identity.of(answer)

    def asks_stream_usage(self, body: Mapping[str, Any]) -> bool | None:
        """Whether this streamed request asks for its usage (None: the API reports
        usage on every stream unasked)."""
        return None

    def usage_only(self, chunk: dict[str, Any]) -> bool:
        """A stream chunk that carries nothing but the usage asked for."""
        return False


class Completions(LLMApi):
    """OpenAI's chat completions (``messages``) and text completions (``prompt``): one
    answer format, ``choices``."""

    max_tokens_fields = ("max_tokens", "max_completion_tokens")

    def operation(self, body: Mapping[str, Any]) -> Operation:
        return "chat" if "messages" in body else "text_completion"

    def prompt_tokens(self, body: Mapping[str, Any]) -> int | None:
        return project_prompt_tokens(body)

    def follows_tool(self, body: Mapping[str, Any]) -> bool:
        return _last(body.get("messages")).get("role") in ("tool", "function")

    def carries_output(self, chunk: dict[str, Any]) -> bool:
        for choice in _choices(chunk):
            if choice.get("text"):
                return True
            delta = _dict(choice.get("delta"))
            if any(delta.get(k) for k in ("content", "tool_calls", "reasoning_content")):
                return True
        return False

    def usage(self, answer: dict[str, Any]) -> Usage | None:
        return _openai_usage(answer.get("usage"), "prompt_tokens", "completion_tokens")

    def finish(self, answer: dict[str, Any]) -> tuple[str, bool] | None:
        reasons = [str(c["finish_reason"]) for c in _choices(answer) if c.get("finish_reason")]
        return (reasons[-1], reasons[-1] == "tool_calls") if reasons else None

    def asks_stream_usage(self, body: Mapping[str, Any]) -> bool | None:
        return bool(_dict(body.get("stream_options")).get("include_usage"))

    def usage_only(self, chunk: dict[str, Any]) -> bool:
        return chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict)


def _openai_usage(usage: object, prompt: str, output: str) -> Usage | None:
    """OpenAI's usage object, whose names differ by API; the cached tokens are in
    ``<prompt>_details``."""
    if not isinstance(usage, dict):
        return None
    return Usage(
        prompt=as_count(usage.get(prompt)),
        cached=as_count(_dict(usage.get(f"{prompt}_details")).get("cached_tokens")),
        output=as_count(usage.get(output)),
    )


def _choices(answer: dict[str, Any]) -> list[dict[str, Any]]:
    choices = answer.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


class ChatCompletions(Completions):
    path = "/v1/chat/completions"
    summary = "OpenAI chat completions, forwarded after the session is admitted."
    prompt_field = "messages"


class TextCompletions(Completions):
    path = "/v1/completions"
    summary = "OpenAI text completions, forwarded after the session is admitted."
    prompt_field = "prompt"


class Responses(LLMApi):
    """OpenAI's Responses API. A stream is typed events (``response.output_text.delta``
    ...); those of the response's life (``response.completed``...) carry the response
    object a whole answer is."""

    path = "/v1/responses"
    summary = "OpenAI Responses API, forwarded after the session is admitted."
    prompt_field = "input"
    prompt_fields = ("instructions", "input")
    max_tokens_fields = ("max_output_tokens",)
    session_fields = (("id_or_object", "conversation"),)
    continues_field = "previous_response_id"
    ENDED = ("completed", "incomplete", "failed", "cancelled")

    def stores_answer(self, body: Mapping[str, Any]) -> bool:
        return body.get("store") is not False  # OpenAI's default: stored

    def follows_tool(self, body: Mapping[str, Any]) -> bool:
        kind = _last(body.get("input")).get("type")
        return kind in ("function_call_output", "custom_tool_call_output")

    def carries_output(self, chunk: dict[str, Any]) -> bool:
        # Text, reasoning and tool-call arguments all arrive as "<...>.delta" events.
        return str(chunk.get("type")).endswith(".delta") and bool(chunk.get("delta"))

    @staticmethod
    def _response(answer: dict[str, Any]) -> dict[str, Any]:
        return answer if answer.get("object") == "response" else _dict(answer.get("response"))

    def usage(self, answer: dict[str, Any]) -> Usage | None:
        return _openai_usage(self._response(answer).get("usage"), "input_tokens", "output_tokens")

    def identity(self, answer: dict[str, Any]) -> Identity:
        return Identity.of(self._response(answer))

    def finish(self, answer: dict[str, Any]) -> tuple[str, bool] | None:
        response = self._response(answer)
        if (status := response.get("status")) not in self.ENDED:
            return None  # created, queued, in progress: not over yet
        reason = _dict(response.get("incomplete_details")).get("reason") or status
        output = response.get("output")
        items = [_dict(item) for item in output] if isinstance(output, list) else []
        calls = any(item.get("type") in ("function_call", "custom_tool_call") for item in items)
        return str(reason), calls


class Messages(LLMApi):
    """Anthropic's Messages API. A stream is typed events: ``message_start`` (the
    message with the prompt's usage), ``content_block_start`` / ``_delta``,
    ``message_delta`` (the stop reason and the final usage)."""

    path = "/v1/messages"
    summary = "Anthropic Messages API, forwarded after the session is admitted."
    prompt_field = "messages"
    prompt_fields = ("system", "messages")
    # NOTE: Anthropic's API has no conversation id; its user id is the only name a
    # client gives, and Claude Code puts its session id in it ("..._session_<uuid>").
    session_fields = (("metadata", "user_id"),)

    def follows_tool(self, body: Mapping[str, Any]) -> bool:
        last = _last(body.get("messages"))
        content = last.get("content")
        blocks = [_dict(block) for block in content] if isinstance(content, list) else []
        return last.get("role") == "user" and any(b.get("type") == "tool_result" for b in blocks)

    def carries_output(self, chunk: dict[str, Any]) -> bool:
        if chunk.get("type") == "content_block_start":
            return _dict(chunk.get("content_block")).get("type") == "tool_use"
        delta = _dict(chunk.get("delta"))
        return chunk.get("type") == "content_block_delta" and any(
            delta.get(k) for k in ("text", "partial_json", "thinking")
        )

    def usage(self, answer: dict[str, Any]) -> Usage | None:
        usage = answer.get("usage", _dict(answer.get("message")).get("usage"))
        if not isinstance(usage, dict):
            return None
        # Anthropic's input_tokens leave out the prompt's tokens read from or written to
        # the cache (vLLM's answers too: its prompt_tokens minus those).
        fresh = as_count(usage.get("input_tokens"))
        read = as_count(usage.get("cache_read_input_tokens"))
        written = as_count(usage.get("cache_creation_input_tokens")) or 0
        prompt = None if fresh is None else as_count(fresh + (read or 0) + written)
        return Usage(prompt=prompt, cached=read, output=as_count(usage.get("output_tokens")))

    def finish(self, answer: dict[str, Any]) -> tuple[str, bool] | None:
        reason = answer.get("stop_reason") or _dict(answer.get("delta")).get("stop_reason")
        return (str(reason), reason == "tool_use") if reason else None

    def identity(self, answer: dict[str, Any]) -> Identity:
        # A stream names the message in its first event, ``message_start``.
        return Identity.of(answer.get("message", answer))


CHAT = ChatCompletions()
LLM_APIS: tuple[LLMApi, ...] = (CHAT, TextCompletions(), Responses(), Messages())
"""The routes the gateway forwards as LLM calls."""
