"""The report's statistics: the interquartile mean and a bootstrap CI of a difference of means."""
from __future__ import annotations

import math
import warnings

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 10_000


def iqm(values) -> float:
    """Interquartile mean: the mean of the middle 50% (scipy's trim_mean, as the harness computes it)."""
    from scipy.stats import trim_mean

    values = np.asarray(values, dtype=float)
    return float(trim_mean(values, 0.25)) if values.size else math.nan


def diff_ci(before, after, confidence: float = CONFIDENCE, n_resamples: int = RESAMPLES,
            seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(after) - mean(before), episodes resampled independently
    within each sample (scipy.stats.bootstrap). (nan, nan) when a sample has < 2 episodes."""
    from scipy.stats import bootstrap

    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan

    def difference(x, y, axis=-1):
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate samples (every episode 500.0) are fine here
        result = bootstrap((b, a), difference, vectorized=True, paired=False, confidence_level=confidence,
                           n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return float(low), float(high)
