"""Hooks into LLM clients: ``openai`` (OpenAI / AsyncOpenAI) and ``litellm``.

Each integration loads its client library only when imported.
"""
