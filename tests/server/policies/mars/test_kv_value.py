"""What keeping a session's KV through a tool is worth (policies/mars/kv_value.py)."""

from __future__ import annotations

import pytest

from agentmars.sdk.events import LLMEnd, LLMFirstToken, ToolEnd
from agentmars.server.policies.mars.kv_value import KeepingRegime, keeping_pays
from agentmars.server.policies.mars.settings import MarsSettings


def prefill(regime: KeepingRegime, seconds_per_token: float) -> None:
    """One call of 100 uncached tokens (of 150, 50 cached) at ``seconds_per_token``."""
    regime.observe(LLMFirstToken(session_id="s", call_id="c", ttft_s=100 * seconds_per_token))
    regime.observe(
        LLMEnd(session_id="s", call_id="c", prompt_tokens=150, cached_tokens=50, output_tokens=3)
    )


def tool(regime: KeepingRegime, seconds: float) -> None:
    regime.observe(ToolEnd(session_id="s", call_id="t", tool="bash", duration_s=seconds))


def test_keeping_parked_kv_pays_while_the_pool_recomputes_longer_than_a_tool() -> None:
    regime = KeepingRegime(MarsSettings(regime_tool_samples=2))
    # Nothing known, or only one side: it pays (the parked sessions count).
    assert regime.keeping_pays(1000)
    tool(regime, 8.0)
    assert regime.keeping_pays(1000)
    # 1 ms a token: a pool of 1,000 tokens recomputes in 1 s, against an 8 s tool.
    prefill(regime, 0.001)
    assert not regime.keeping_pays(1000)
    assert regime.keeping_pays(10_000)  # 10 s
    # The mean of the last two tools: 8 s drops out as 0.5 s tools come.
    tool(regime, 0.5)
    assert not regime.keeping_pays(1000)  # 4.25 s
    tool(regime, 0.5)
    assert regime.keeping_pays(1000)  # 0.5 s


def test_keeping_pays_when_the_saving_beats_the_held_share() -> None:
    # A tenth of the pool for 2 s at full pressure costs 0.2 s of the pool.
    assert keeping_pays(lambda: 0.3, 0.1, 2.0, 1.0)
    assert not keeping_pays(lambda: 0.1, 0.1, 2.0, 1.0)
    # No pressure: free KV is kept without working out the saving; unknown saving: not.
    assert keeping_pays(lambda: pytest.fail("not asked"), 0.1, 2.0, 0.0)
    assert not keeping_pays(lambda: None, 0.1, 2.0, 1.0)
