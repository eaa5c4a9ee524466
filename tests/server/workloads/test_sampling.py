"""The fitted distributions hit their moments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentmars.server.workloads.sampling import (
    counts_with_moments,
    lognormal_mean_sd,
    lognormal_params,
    scaled_beta,
    split,
    tokens,
)


def test_lognormal_params_by_hand() -> None:
    # mean 1, sd 1: sigma^2 = ln(1 + 1) and mu = -sigma^2 / 2.
    mu, sigma = lognormal_params(1.0, 1.0)
    assert sigma == pytest.approx(math.sqrt(math.log(2)))
    assert mu == pytest.approx(-math.log(2) / 2)
    with pytest.raises(ValueError, match="positive mean and sd"):
        lognormal_params(0.0, 1.0)


def test_lognormal_draws_have_the_mean_and_sd() -> None:
    draws = lognormal_mean_sd(np.random.default_rng(1), 2.0, 1.0, 200_000)
    assert draws.mean() == pytest.approx(2.0, rel=0.01)
    assert draws.std() == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize(
    ("mean", "sd"),
    [
        (28.18, 15.2),  # over-dispersed: negative binomial
        (3.75, 1.3),  # under-dispersed: binomial
        (6.3, 2.3),  # variance of the excess = its mean: Poisson
    ],
)
def test_counts_have_the_mean_and_sd(mean: float, sd: float) -> None:
    draws = counts_with_moments(np.random.default_rng(2), mean, sd, 200_000)
    assert draws.min() >= 1
    assert draws.mean() == pytest.approx(mean, rel=0.01)
    assert draws.std() == pytest.approx(sd, rel=0.03)


def test_counts_need_a_mean_above_the_minimum() -> None:
    with pytest.raises(ValueError, match="must exceed the minimum"):
        counts_with_moments(np.random.default_rng(0), 1.0, 0.5, 10)


def test_scaled_beta_stays_in_range_with_the_mean() -> None:
    draws = scaled_beta(np.random.default_rng(3), 30, 127, 56, 1.5, 100_000)
    assert draws.min() >= 30 and draws.max() <= 127
    assert draws.mean() == pytest.approx(56, rel=0.01)
    with pytest.raises(ValueError, match="not inside"):
        scaled_beta(np.random.default_rng(3), 30, 127, 200, 1.5, 1)


def test_tokens_round_and_floor() -> None:
    assert tokens(np.array([0.2, 1.5, 2.49, 7.0])) == [1, 2, 2, 7]
    assert tokens(np.array([0.2]), minimum=0) == [0]


def test_split_cuts_consecutive_pieces() -> None:
    assert split([1, 2, 3, 4, 5, 6], [2, 0, 3, 1]) == [[1, 2], [], [3, 4, 5], [6]]
