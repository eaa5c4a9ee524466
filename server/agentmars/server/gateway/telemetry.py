"""Where the gateway reads the engine's KV figures: a ``KVSource`` answers the newest
``kv_stats`` event it has (the one shape KV figures travel in). The scheduler plugin's
side channel (``plugin_link.PluginLink``) is one; the wall-clock twin's engine is
another (``engines.twin``). Without a source the admission view keeps the newest
``kv_stats`` event of the stream (anyone with the token can post them to
``POST /v1/events``).
"""

from __future__ import annotations

from typing import Protocol

from agentmars.sdk.events import KVStats


class KVSource(Protocol):
    """The engine's newest KV figures (None until any arrived)."""

    def kv_stats(self) -> KVStats | None: ...
