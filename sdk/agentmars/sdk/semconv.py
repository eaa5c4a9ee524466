"""The OpenTelemetry names agentmars' spans and metrics carry, in the two versions of
the GenAI semantic conventions ``OTEL_SEMCONV_STABILITY_OPT_IN`` chooses between, and
agentmars' own names (``agentmars.*``).

The GenAI conventions are in development and moved out of the main repository
(semantic-conventions v1.36.0 is the last release with them there) into
open-telemetry/semantic-conventions-genai. Their transition rule
(docs/gen-ai/gen-ai-agent-spans.md there): an instrumentation keeps emitting what it
emitted, v1.36.0 or before, by default, and emits the latest, and not the old, when
``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental``. agentmars
emitted v1.36.0's names, so:

- ``Semconv.V1_36`` (the default): the provider in ``gen_ai.system``; metrics
  ``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``.
- ``Semconv.LATEST``: the provider in ``gen_ai.provider.name``; the inference metrics
  ``gen_ai.client.inference.duration`` / ``.time_to_first_chunk`` / ``.usage.*`` /
  ``.operation.*`` (docs/gen-ai/client-inference.md, gen-ai-token-metrics.md),
  ``gen_ai.execute_tool.duration`` (gen-ai-metrics.md), and the span attributes only
  the latest defines (``gen_ai.request.stream``, ``gen_ai.response.time_to_first_chunk``).

Names both versions share (``server.address``, ``gen_ai.response.id``...) are emitted
in both. This module imports no OpenTelemetry: the gateway, the sandbox and the SDK's
integrations name things with it too.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Final

OPT_IN_ENV: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST_OPT_IN: Final = "gen_ai_latest_experimental"


class Semconv(enum.Enum):
    """Which version of the GenAI conventions to emit (module docstring)."""

    V1_36 = "1.36.0"
    LATEST = "latest"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Semconv:
        """``LATEST`` when ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma-separated list)
        names ``gen_ai_latest_experimental``, else ``V1_36``."""
        values = {value.strip() for value in environ.get(OPT_IN_ENV, "").split(",")}
        return cls.LATEST if LATEST_OPT_IN in values else cls.V1_36

    @property
    def provider_key(self) -> str:
        """The attribute naming the GenAI provider, required on inference spans."""
        return PROVIDER_NAME if self is Semconv.LATEST else SYSTEM

    def provider_value(self, provider: str) -> str:
        """``provider`` (a latest well-known value or a custom one) as this version
        spells it: v1.36.0's ``gen_ai.system`` names three providers differently."""
        if self is Semconv.LATEST:
            return provider
        return _V1_36_SYSTEM.get(provider, provider)


# --- GenAI (both versions) ---------------------------------------------------------------
OPERATION: Final = "gen_ai.operation.name"
SYSTEM: Final = "gen_ai.system"
PROVIDER_NAME: Final = "gen_ai.provider.name"
AGENT_NAME: Final = "gen_ai.agent.name"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_ID: Final = "gen_ai.response.id"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
USAGE_INPUT: Final = "gen_ai.usage.input_tokens"
USAGE_OUTPUT: Final = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ: Final = "gen_ai.usage.cache_read.input_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_TYPE_FUNCTION: Final = "function"
"""Agents' tools run on the client side (the agent's host or its sandbox pool), not
in the model provider: the conventions' ``function`` type."""
TOKEN_TYPE: Final = "gen_ai.token.type"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# --- GenAI (latest only) -----------------------------------------------------------------
REQUEST_STREAM: Final = "gen_ai.request.stream"
RESPONSE_TTFC: Final = "gen_ai.response.time_to_first_chunk"
TOKEN_MODALITY: Final = "gen_ai.token.modality"
MODALITY_UNKNOWN: Final = "unknown"
"""What the usage counters' required modality is when the answer does not break its
usage down by modality (chat and text completions do not)."""

# --- GenAI metrics -----------------------------------------------------------------------
V1_36_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
V1_36_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
INFERENCE_DURATION: Final = "gen_ai.client.inference.duration"
INFERENCE_TTFC: Final = "gen_ai.client.inference.time_to_first_chunk"
USAGE_INPUT_TOKENS: Final = "gen_ai.client.inference.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = "gen_ai.client.inference.usage.output_tokens"
USAGE_CACHE_READ_TOKENS: Final = "gen_ai.client.inference.usage.cache_read.input_tokens"
OPERATION_INPUT_TOKENS: Final = "gen_ai.client.inference.operation.input_tokens"
OPERATION_OUTPUT_TOKENS: Final = "gen_ai.client.inference.operation.output_tokens"
EXECUTE_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""The conventions' explicit buckets for the duration and time-to-first-chunk metrics."""
TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
    67108864,
)  # fmt: skip
"""The conventions' explicit buckets for per-operation token histograms."""

# --- HTTP (the gateway's server spans) ----------------------------------------------------
HTTP_METHOD: Final = "http.request.method"
HTTP_ROUTE: Final = "http.route"
HTTP_STATUS: Final = "http.response.status_code"

# --- agentmars' own -----------------------------------------------------------------------
SESSION_ID: Final = "agentmars.session.id"
TURN: Final = "agentmars.turn"
CALL_ID: Final = "agentmars.call.id"
TTFT: Final = "agentmars.llm.ttft_s"
QUEUE_WAIT: Final = "agentmars.tool.queue_wait_s"
TOOL_PRIORITY: Final = "agentmars.tool.priority"
TOOL_STATUS: Final = "agentmars.tool.status"
TOOL_EXIT_STATUS: Final = "agentmars.tool.exit_status"
TOOL_CPU_TIME: Final = "agentmars.tool.cpu_time_s"
ADMISSION_WAIT: Final = "agentmars.admission.wait_s"
ADMISSION_POLICY: Final = "agentmars.admission.policy"
SANDBOX_SLOT: Final = "agentmars.sandbox.slot"
SANDBOX_CORES: Final = "agentmars.sandbox.cores"
SANDBOX_BACKEND: Final = "agentmars.sandbox.backend"
KV_PINNED_BLOCKS: Final = "agentmars.kv.pinned_blocks"
KV_PIN_TTL: Final = "agentmars.kv.pin_ttl_s"
KV_RELEASE_REASON: Final = "agentmars.kv.release_reason"
KV_HELD: Final = "agentmars.kv.held_s"
UNFINISHED: Final = "agentmars.span.unfinished"
UNFINISHED_REASON: Final = "agentmars.span.unfinished_reason"
FIRST_TOKEN_EVENT: Final = "agentmars.llm.first_token"
TOOL_START_EVENT: Final = "agentmars.tool.start"
ADMITTED_EVENT: Final = "agentmars.admission.admitted"
KV_PIN_SPAN: Final = "agentmars.kv.pin"
"""The span of a session's KV pin, from the engine's ``kv_pin`` to its ``kv_unpin``."""

# --- providers ----------------------------------------------------------------------------
_V1_36_SYSTEM: Final = {
    "azure.ai.inference": "az.ai.inference",
    "azure.ai.openai": "az.ai.openai",
    "x_ai": "xai",
}
_LITELLM_PROVIDERS: Final = {
    "openai": "openai",
    "text-completion-openai": "openai",
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "bedrock_converse": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "vertex_ai_beta": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "azure": "azure.ai.openai",
    "azure_text": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "cohere": "cohere",
    "cohere_chat": "cohere",
    "deepseek": "deepseek",
    "groq": "groq",
    "mistral": "mistral_ai",
    "perplexity": "perplexity",
    "watsonx": "ibm.watsonx.ai",
    "xai": "x_ai",
    "moonshot": "moonshot_ai",
}
"""LiteLLM's provider names whose provider the conventions name (well-known values
MUST be used where one applies); any other stays LiteLLM's name, a custom value."""


def provider_of_litellm(litellm_provider: str) -> str:
    """The conventions' provider (latest spelling) for a LiteLLM provider name."""
    return _LITELLM_PROVIDERS.get(litellm_provider, litellm_provider)
