"""Statistical tests used by verification: TOST equivalence of means and two-sample distribution tests."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass
class TostResult:
    equivalent: bool
    p_value: float
    margin: float
    mean_a: float
    mean_b: float
    std_a: float
    std_b: float
    n_a: int
    n_b: int

    def describe(self) -> str:
        verdict = "equivalent" if self.equivalent else "NOT shown equivalent"
        return (f"mean {self.mean_a:.4g} (sd {self.std_a:.3g}, n={self.n_a}) vs reference {self.mean_b:.4g} "
                f"(sd {self.std_b:.3g}, n={self.n_b}); margin +-{self.margin:.4g}; TOST p={self.p_value:.3g}: {verdict}")


def tost(a, b, margin_sd: float = 0.5, alpha: float = 0.05, min_margin: float = 1e-6) -> TostResult:
    """Two one-sided Welch t-tests (scipy) that |mean(a) - mean(b)| < margin.

    The margin is `margin_sd` pooled standard deviations (a standardised effect size), floored at
    `min_margin` (plus 1% of the reference mean) so zero-variance samples are still comparable.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    pooled = float(np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)) if min(len(a), len(b)) > 1 else 0.0
    margin = max(margin_sd * pooled, min_margin + 0.01 * abs(float(b.mean())))
    if pooled == 0.0:  # both samples constant: equivalent iff the constants are within the margin
        p_value = 0.0 if abs(a.mean() - b.mean()) < margin else 1.0
    else:
        lower = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue
        upper = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue
        p_value = float(max(lower, upper))
    return TostResult(p_value < alpha, p_value, margin, float(a.mean()), float(b.mean()),
                      float(a.std(ddof=1)) if len(a) > 1 else 0.0, float(b.std(ddof=1)) if len(b) > 1 else 0.0,
                      len(a), len(b))


def same_distribution_p(a, b) -> tuple[float, str]:
    """p-value that samples a and b (1-D) come from the same distribution, and the test used:
    chi-square on counts when both are discrete with few values, else two-sample Kolmogorov-Smirnov."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    values = np.union1d(np.unique(a), np.unique(b))
    if len(values) == 1:
        return 1.0, "constant"
    if len(values) <= 50 and np.all(values == np.round(values)):
        counts = np.array([[np.sum(a == v) for v in values], [np.sum(b == v) for v in values]])
        return float(stats.chi2_contingency(counts).pvalue), "chi-square"
    return float(stats.ks_2samp(a, b).pvalue), "Kolmogorov-Smirnov"
