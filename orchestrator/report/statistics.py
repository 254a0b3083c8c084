"""The report's statistics: the interquartile mean and the CI of a gain over training seeds."""
from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95


def iqm(values) -> float:
    """Interquartile mean: the mean of the middle 50% (scipy's trim_mean, as the harness computes it)."""
    from scipy.stats import trim_mean

    values = np.asarray(values, dtype=float)
    return float(trim_mean(values, 0.25)) if values.size else math.nan


def seed_ci(before: list[float], after: list[float], sigma: float, df: int,
            confidence: float = CONFIDENCE) -> tuple[float, float]:
    """CI of mean(after) - mean(before) with training seeds as the units: `before` and `after` are
    the scores of each side's runs (one per seed), each side's variance the night's sigma^2 (with its
    df), or its own runs' sample variance where that is larger (n - 1 df), a Student t quantile with
    Welch-Satterthwaite's df. (Wider than the keep rule's for a best whose runs spread only by
    chance wider than sigma: the rule weighs a best's own spread only when an F test says so.) (nan, nan) without a measure of seed
    noise (no pair of runs yet, and neither side has two runs)."""
    from scipy.stats import t as student_t

    from ..keep_rule import welch_df

    parts = []
    for scores in (before, after):
        n = len(scores)
        if n == 0:
            return math.nan, math.nan
        mean = sum(scores) / n
        own = sum((x - mean) ** 2 for x in scores) / (n - 1) if n > 1 else math.nan
        night = sigma * sigma if sigma == sigma else math.nan
        if n > 1 and not (own <= night):  # (a nan night: its own spread is all there is)
            parts.append((own / n, n - 1))
        elif night == night:
            parts.append((night / n, df))
        else:
            return math.nan, math.nan
    difference = sum(after) / len(after) - sum(before) / len(before)
    half = float(student_t.ppf(0.5 + confidence / 2, welch_df(parts))) * math.sqrt(sum(v for v, _ in parts))
    return difference - half, difference + half
