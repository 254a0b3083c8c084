"""The keep rule: when a candidate's score beats the best by more than seed-to-seed noise.

Noise is measured, not assumed. Every pair of runs of the same code with different training
seeds that the night produces is a sample of it: the two baseline runs, each candidate's first
run and its confirmation run, and a re-baseline (the best train.py retrained on a newly kept
backend) with the best train.py's runs of other seeds. "Same code" means the same train.py: a
kept translation was verified equivalent to the reference env, so it changes speed, not the
distribution of scores. A re-baseline repeats the seed of the run it replaces (train seed 1),
so within a group the latest run of a seed counts and the older one is dropped.

    sigma^2 = sum over groups of sum_i (x_i - mean_group)^2 / sum over groups of (n_group - 1)

(a pair contributes (a - b)^2 / 2 with one degree of freedom). Few pairs give a noisy sigma, so
thresholds use Student's t with that many degrees of freedom rather than a normal quantile, and
sigma never goes below the evaluation's own standard error (the root mean square of the runs'
`se`): an estimate of 0.000 from two identical runs cannot let a lucky candidate through on a
difference the 100-episode evaluation cannot resolve.

The decision, for a candidate's first score x1 against the best B:

    x1 <= B                                  discard
    (x1 - B) / sigma > t(1 - A_OUTRIGHT, df)  keep without confirmation
    otherwise                                train it again with the confirmation seed (x2),
                                             add the pair (x1, x2) to the estimate (df + 1), and
    (mean - B) / (sigma / sqrt 2) > t(1 - A_CONFIRM, df)  keep, else discard

With B taken as the reference, a candidate no better than B is kept with probability at most
A_OUTRIGHT + A_CONFIRM = 5% whatever sigma and however few pairs (the t quantiles are exact for
normal scores); tests/test_keep_rule.py measures the error rates and the cost in runs.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from scipy import stats

A_OUTRIGHT = 0.01      # false keeps allowed to the first look (no confirmation)
A_CONFIRM = 0.04       # ... and to the confirmed look: 5% in all
MIN_SIGMA = 1e-9       # sigma when every run and every evaluation agree exactly


@dataclass
class ScoredRun:
    """One train run of some code, scored by the harness."""
    code: str              # what was trained: runs with the same code differ only by their seed
    seed: int
    score: float
    se: float = 0.0        # the harness's standard error of the mean over its episodes
    label: str = ""        # where it came from (exp 0 run 1, exp 3 confirm, ...)


@dataclass
class Noise:
    """The seed-to-seed noise of one run's score, with the runs it was measured from."""
    sigma: float                         # what the rule uses: max(pooled, floor)
    pooled: Optional[float]              # from the pairs alone (None: no pair yet)
    df: int                              # degrees of freedom (a pair is one)
    floor: float                         # RMS of the evaluation standard errors
    groups: list[list[ScoredRun]] = field(default_factory=list)   # groups of 2+ runs of the same code
    extra_se: list[float] = field(default_factory=list)           # candidate runs not in a group

    @property
    def pairs(self) -> int:
        return self.df

    def including(self, runs: list[ScoredRun] = (), extra_se: list[float] = ()) -> "Noise":
        """The estimate with more runs (a candidate and its confirmation), the floor also over
        `extra_se` (a candidate's runs that pair with nothing)."""
        return estimate([r for g in self.groups for r in g] + list(runs), list(extra_se))

    def evidence(self) -> dict:
        return {"sigma": self.sigma, "pooled": self.pooled, "df": self.df, "floor_se": self.floor,
                "groups": [[asdict(r) for r in group] for group in self.groups]}

    def short(self) -> str:
        source = f"{self.df} pair{'s' if self.df != 1 else ''}" if self.df else "no pair"
        floored = ", eval se floor" if self.pooled is None or self.pooled < self.floor else ""
        return f"sigma {self.sigma:.3g} from {source}{floored}"


def estimate(runs: list[ScoredRun], extra_se: Optional[list[float]] = None) -> Noise:
    """Pool the within-code variance over every code with two runs or more (distinct seeds; the
    latest run of a seed counts). The floor is the RMS of the evaluation standard errors of these
    runs and of `extra_se` (the candidate's own runs)."""
    by_code: dict[str, dict[int, ScoredRun]] = {}
    for run in runs:
        by_code.setdefault(run.code, {})[run.seed] = run  # a later run of a seed replaces the older one
    groups = [list(seeds.values()) for seeds in by_code.values() if len(seeds) >= 2]
    squares, df = 0.0, 0
    for group in groups:
        mean = sum(r.score for r in group) / len(group)
        squares += sum((r.score - mean) ** 2 for r in group)
        df += len(group) - 1
    pooled = math.sqrt(squares / df) if df else None
    ses = [r.se for g in groups for r in g] + list(extra_se or [])
    floor = math.sqrt(sum(s * s for s in ses) / len(ses)) if ses else 0.0
    sigma = max(pooled or 0.0, floor, MIN_SIGMA)
    return Noise(sigma, pooled, df, floor, groups, list(extra_se or []))


@lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    return float(stats.t.ppf(p, max(df, 1)))  # no pair yet: as conservative as one pair


@dataclass
class Decision:
    action: str            # keep, discard, confirm
    threshold: float       # the score (or 2-seed mean) that had to be beaten
    note: str              # the short form for the row's description

    def evidence(self) -> dict:
        return asdict(self)


def first_look(score: float, best: float, noise: Noise) -> Decision:
    """A candidate's first run: discard, keep outright, or confirm."""
    outright = best + t_quantile(1 - A_OUTRIGHT, noise.df) * noise.sigma
    if score <= best:
        return Decision("discard", best, f"not above best {best:.3f}")
    if score > outright:
        return Decision("keep", outright, f"beats best {best:.3f} by {score - best:.3g} > {outright - best:.3g} "
                                          f"({noise.short()}; keep outright at p<{A_OUTRIGHT:g})")
    return Decision("confirm", outright, f"{score:.3f} is above best {best:.3f} but not above {outright:.3f} "
                                         f"({noise.short()}): confirm")


def second_look(first: float, second: float, best: float, noise: Noise) -> Decision:
    """After the confirmation run; `noise` already holds the pair (first, second)."""
    mean = (first + second) / 2
    threshold = best + t_quantile(1 - A_CONFIRM, noise.df) * noise.sigma / math.sqrt(2)
    seeds = f"{first:.3f}, {second:.3f}"
    if mean > threshold:
        return Decision("keep", threshold, f"confirmed over 2 seeds: {seeds} (mean {mean:.3f} > {threshold:.3f} = "
                                           f"best + t*sigma/sqrt2; {noise.short()})")
    return Decision("discard", threshold, f"not confirmed over 2 seeds: {seeds} (mean {mean:.3f} <= {threshold:.3f} "
                                          f"= best + t*sigma/sqrt2; {noise.short()})")


def write_decision(path: Path, record: dict) -> None:
    tmp = Path(path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------- the rule's error rates
@dataclass
class Simulated:
    """How often the rule keeps a candidate, and what that costs, on synthetic scores."""
    kept: float            # fraction of candidates kept
    runs: float            # mean train runs per candidate (1 + the confirmations)
    outright: float        # fraction kept without confirmation
    trials: int


def simulate(gain: float, pairs: int, trials: int, seed: int = 0, sigma: float = 1.0, se: float = 0.0,
             best_runs: int = 0) -> Simulated:
    """`trials` candidates whose true score is the best's + gain * sigma, judged by this rule.
    Every score is normal with seed-to-seed noise sigma (evaluation standard error `se`); the
    night so far has produced `pairs` pairs of runs of the same code. The best is the reference
    (best_runs=0) or itself the mean of `best_runs` runs of code as good as the best."""
    import random

    rng = random.Random(seed)
    kept = runs = outright = 0
    true_best = 100.0
    for _ in range(trials):
        history = []
        for k in range(pairs):
            mu = rng.uniform(0.0, 200.0)
            history += [ScoredRun(f"code {k}", s, mu + rng.gauss(0.0, sigma), se) for s in (1, 2)]
        noise = estimate(history)
        best = true_best if not best_runs else \
            sum(true_best + rng.gauss(0.0, sigma) for _ in range(best_runs)) / best_runs
        first = ScoredRun("candidate", 1, true_best + gain * sigma + rng.gauss(0.0, sigma), se)
        look = first_look(first.score, best, noise.including(extra_se=[se]))
        runs += 1
        if look.action == "keep":
            outright += 1
        elif look.action == "confirm":
            second = ScoredRun("candidate", 2, true_best + gain * sigma + rng.gauss(0.0, sigma), se)
            runs += 1
            look = second_look(first.score, second.score, best, noise.including([first, second]))
        kept += look.action == "keep"
    return Simulated(kept / trials, runs / trials, outright / trials, trials)
