"""The seat limit from measured gaps (``gateway.gaps``): the P95 of the session's own
gaps once it has a few, else of everyone's, within a floor and the idle expiry."""

from __future__ import annotations

from agentmars.server.gateway.gaps import (
    FIRST_GAP_S,
    MIN_GAP_S,
    OWN_GAPS_ENOUGH,
    REFRESH_EVERY,
    Gaps,
    own_gaps,
    quantile,
)


def test_quantile_is_nearest_rank() -> None:
    assert quantile(range(1, 101)) == 96  # the value at rank 95 of 100 (0-based)
    assert quantile([3.0]) == 3.0
    assert quantile([5.0, 1.0, 2.0, 4.0, 3.0], 0.5) == 3.0


def test_before_any_gap_the_first_limit_holds_within_the_expiry() -> None:
    assert Gaps(cap_s=300.0).limit_s(own_gaps()) == FIRST_GAP_S
    assert Gaps(cap_s=2.0).limit_s(own_gaps()) == 2.0


def test_the_populations_p95_until_the_session_has_its_own() -> None:
    gaps = Gaps(cap_s=300.0)
    others = own_gaps()
    count = 1 + 6 * REFRESH_EVERY  # the quantile is recomputed at the last of them
    for n in range(count):  # gaps of 1, 2, ... s
        gaps.record(others, float(n + 1))
    mine = own_gaps()
    assert gaps.limit_s(mine) == quantile(range(1, count + 1)) == int(0.95 * count) + 1
    for _ in range(OWN_GAPS_ENOUGH - 1):
        gaps.record(mine, 3.0)
    assert gaps.limit_s(mine) > 3.0  # still the population's
    gaps.record(mine, 3.0)
    assert gaps.limit_s(mine) == 3.0
    # never below the floor
    quick = own_gaps()
    for _ in range(OWN_GAPS_ENOUGH):
        gaps.record(quick, 0.01)
    assert gaps.limit_s(quick) == MIN_GAP_S
