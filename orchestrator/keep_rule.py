"""The keep rule: when a candidate's score beats the best by more than seed-to-seed noise.

Noise is measured, not assumed. Every pair of runs of the same code with different training
seeds that the night produces is a sample of it: the two baseline runs, a candidate's first
run with its confirmation runs, and a re-baseline (the best train.py retrained on a newly kept
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

The decision is sequential. A candidate is trained with seed 1, then, while the evidence is
ambiguous, retrained with the confirmation seeds (2, 3, ...) up to MAX_RUNS runs. After its n-th
run, with mean m_n of its n scores, against the best B, and sigma with df degrees of freedom
(the candidate's own runs join the estimate: n - 1 more df):

    t_n = (m_n - B) / (sigma / sqrt n)
    t_n > t(1 - LOOK_ALPHAS[n-1], df)        keep
    t_n <= FUTILITY_T[n-1], or n = MAX_RUNS  discard (at n = 1: not above B)
    otherwise                                train it again with the next confirmation seed

With B taken as the reference, each t_n is Student-t with df degrees of freedom for a candidate
no better than B (normal scores: the mean is independent of the pooled variance), so it is kept
with probability at most sum(LOOK_ALPHAS) = 5% whatever sigma and however few pairs the night
has produced (Bonferroni over the looks; the futility stops only lower it). Up to three
confirmations are what a true gain of 2 sigma needs to be kept >= 80% of the time from the
night's first pair on; the futility bounds stop confirming candidates that are not trending up.
tests/test_keep_rule.py measures the error rates and the cost in runs; `python bench/keep_rule.py`
prints them by number of pairs.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from scipy import stats

from .config import BASELINE_RUNS
from .results import Row, RunFolder, read_json

LOOK_ALPHAS = (0.002, 0.008, 0.015, 0.025)  # false keeps allowed to each look: 5% in all
FUTILITY_T = (0.0, 1.0, 1.5)                 # t at or below which a look stops confirming
MAX_RUNS = len(LOOK_ALPHAS)                  # a candidate's runs at most: 1 + 3 confirmations
MIN_SIGMA = 1e-9       # sigma when every run and every evaluation agree exactly


def confirmation_seed(first: int, k: int) -> int:
    """The train seed of a candidate's confirmation run k (1, 2, ...): `first` (the run's
    confirm_seed), then the next seeds."""
    return first + k - 1


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
        """The estimate with more runs (a candidate's: one run alone joins no group), the floor
        also over `extra_se` (the candidate's evaluation standard error)."""
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


def night_noise(rows: list[Row], folder: RunFolder, train_seeds: list[int], confirm_seed: int) -> Noise:
    """The estimate from every run of the night so far (results.tsv's rows and each run's
    eval.json): the baseline runs; each train candidate with its confirmations; a re-baseline,
    which retrains the best train.py with the train seed (replacing that seed's run: the backend
    changed) and so pairs with the best's runs of other seeds. The loop judges with it; the
    report shows it."""
    seed = train_seeds[0]
    runs: list[ScoredRun] = []

    def add(code: str, seed: int, run_folder, label: str) -> None:
        result = read_json(run_folder.eval_json)
        try:
            runs.append(ScoredRun(code, seed, float(result["mean"]), float(result.get("se") or 0.0), label))
        except (KeyError, TypeError, ValueError):
            pass

    best_code, baselines = "exp 0", 0
    for row in rows:
        if row.phase != "train" or row.status not in ("baseline", "keep", "discard"):
            continue
        exp_folder = folder.exp(row.exp)
        if row.exp == 0:
            baselines += 1
            add(best_code, train_seeds[min(baselines, BASELINE_RUNS) - 1], exp_folder.run(baselines),
                f"exp 0 run {baselines}")
        elif row.status == "baseline":
            add(best_code, seed, exp_folder, f"exp {row.exp} re-baseline")
        else:
            add(f"exp {row.exp}", seed, exp_folder, f"exp {row.exp}")
            for k, confirmation in enumerate(exp_folder.confirmations(), 1):
                add(f"exp {row.exp}", confirmation_seed(confirm_seed, k), confirmation,
                    f"exp {row.exp} confirm {k}")
            if row.status == "keep":
                best_code = f"exp {row.exp}"
    return estimate(runs)


@lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    return float(stats.t.ppf(p, max(df, 1)))  # no pair yet: as conservative as one pair


@dataclass
class Decision:
    action: str            # keep, discard, confirm
    threshold: float       # the score (or n-seed mean) that had to be beaten
    note: str              # the short form for the row's description

    def evidence(self) -> dict:
        return asdict(self)


def look(scores: list[float], best: float, noise: Noise) -> Decision:
    """After a candidate's n-th run (`scores` are its n scores; `noise` already holds them as a
    group when n >= 2): keep, discard, or confirm once more."""
    n = len(scores)
    mean = sum(scores) / n
    spread = noise.sigma / math.sqrt(n)
    t = (mean - best) / spread
    threshold = best + t_quantile(1 - LOOK_ALPHAS[n - 1], noise.df) * spread
    runs = f"{n} seeds: {', '.join(f'{s:.3f}' for s in scores)} (mean {mean:.3f})" if n > 1 else f"{mean:.3f}"
    gap = f"threshold {threshold:.3f} = best {best:.3f} + t(1-{LOOK_ALPHAS[n - 1]:g}, {noise.df})" \
          f"*sigma{'/sqrt' + str(n) if n > 1 else ''}; {noise.short()}"
    if mean > threshold:
        verb = "beats" if n == 1 else "confirmed over"
        return Decision("keep", threshold, f"{verb} {runs} > {gap}")
    if n >= MAX_RUNS or t <= FUTILITY_T[n - 1]:
        if n == 1 and mean <= best:  # the common case, said short
            return Decision("discard", threshold, f"not above best {best:.3f}")
        why = f"t {t:.2f} <= {FUTILITY_T[n - 1]:g}, stopped confirming" if n < MAX_RUNS else f"{n} runs at most"
        return Decision("discard", threshold, f"not confirmed over {runs} <= {gap}; {why}")
    return Decision("confirm", threshold, f"{runs} is above best {best:.3f} but not above {threshold:.3f} "
                                          f"({noise.short()}): confirm")


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
    outright: float        # fraction kept on the first run (no confirmation)
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
        candidate: list[ScoredRun] = []
        while True:
            candidate.append(ScoredRun("candidate", len(candidate) + 1,
                                       true_best + gain * sigma + rng.gauss(0.0, sigma), se))
            decision = look([r.score for r in candidate], best, noise.including(candidate, [se]))
            if decision.action != "confirm":
                break
        runs += len(candidate)
        kept += decision.action == "keep"
        outright += decision.action == "keep" and len(candidate) == 1
    return Simulated(kept / trials, runs / trials, outright / trials, trials)
