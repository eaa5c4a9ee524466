"""Distributions fitted to published moments, shared by the workload generators.

Every function takes the caller's seeded ``numpy.random.Generator`` and returns
plain numpy arrays; the generators turn them into sessions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate
from typing import TypeVar

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
T = TypeVar("T")


def lognormal_params(mean: float, sd: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and standard deviation."""
    if mean <= 0 or sd <= 0:
        raise ValueError(f"a lognormal needs a positive mean and sd (got {mean}, {sd})")
    sigma2 = math.log1p((sd / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def lognormal_mean_sd(rng: np.random.Generator, mean: float, sd: float, size: int) -> Floats:
    """Lognormal draws with the given mean and standard deviation (heavy tails)."""
    mu, sigma = lognormal_params(mean, sd)
    return rng.lognormal(mu, sigma, size)


def lognormal_median(rng: np.random.Generator, median: float, sigma: float, size: int) -> Floats:
    """Lognormal draws with the given median and log-space spread."""
    return rng.lognormal(math.log(median), sigma, size)


def lognormal_mean(median: float, sigma: float) -> float:
    return median * math.exp(sigma**2 / 2)


def counts_with_moments(
    rng: np.random.Generator, mean: float, sd: float, size: int, minimum: int = 1
) -> Ints:
    """Integers >= ``minimum`` with the given mean and standard deviation.

    The excess over ``minimum`` is negative binomial when it is over-dispersed
    (variance > mean), binomial when under-dispersed, Poisson in between: the
    discrete distributions with exactly these two moments (up to the rounding of the
    binomial's trial count)."""
    excess, var = mean - minimum, sd**2
    if excess <= 0:
        raise ValueError(f"mean {mean} must exceed the minimum {minimum}")
    if math.isclose(var, excess, rel_tol=1e-2):
        draws = rng.poisson(excess, size)
    elif var > excess:
        shape = excess**2 / (var - excess)
        draws = rng.negative_binomial(shape, shape / (shape + excess), size)
    else:
        trials = max(1, round(excess / (1 - var / excess)))
        draws = rng.binomial(trials, excess / trials, size)
    return draws.astype(np.int64) + minimum


def scaled_beta(
    rng: np.random.Generator, low: float, high: float, mean: float, a: float, size: int
) -> Floats:
    """Draws on [low, high] with the given mean: a beta(a, b) stretched to the range,
    b chosen for the mean (for a published "min-max (mean)" with no shape)."""
    unit = (mean - low) / (high - low)
    if not 0 < unit < 1:
        raise ValueError(f"mean {mean} is not inside ({low}, {high})")
    return low + (high - low) * rng.beta(a, a * (1 - unit) / unit, size)


def tokens(values: Floats, minimum: int = 1) -> list[int]:
    """Round token counts to integers, at least ``minimum``."""
    rounded: list[int] = np.maximum(np.rint(values), minimum).astype(np.int64).tolist()
    return rounded


def split(values: Sequence[T], sizes: Sequence[int]) -> list[Sequence[T]]:
    """``values`` cut into consecutive pieces of the given sizes (drawing a whole
    workload's values at once is much faster than session by session)."""
    ends = list(accumulate(sizes))
    return [values[end - size : end] for size, end in zip(sizes, ends, strict=True)]
