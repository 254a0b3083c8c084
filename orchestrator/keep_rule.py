"""The keep rule: when a candidate's score beats the best by more than seed-to-seed noise.

Noise is measured, not assumed. Every pair of runs of the same code with different training
seeds that the night produces is a sample of it: the baseline runs, a candidate's first
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
run, with mean m_n of its n scores, against the best B (itself the mean of n_B runs: the
baselines, a kept candidate's runs), and sigma with df degrees of freedom (the candidate's own runs
join the estimate: n - 1 more df):

    t_n = (m_n - B) / (sigma * sqrt(1/n + 1/n_B))
    t_n > t(1 - alpha_k * LOOK_SHARES[n-1], df)   keep
    t_n <= FUTILITY_T[n-1], or n = MAX_RUNS       discard (at n = 1: not above B)
    otherwise                                     train it again with the next confirmation seed

B is measured too: comparing against it as if it were exact kept 11-12% of candidates no better
than the best (bench/keep_rule.py), and a night whose baselines came out low would keep one
equal candidate after another. With B's standard error in the denominator, t_n is Student-t with
df degrees of freedom for a candidate no better than the best (normal scores), so the candidate
is kept with probability at most alpha_k (Bonferroni over its looks; the futility stops only
lower it).

alpha_k is what the night spends on a candidate when k - 1 candidates since the last keep (or
since the start) got past their first look: NIGHT_ALPHA / 2 / (k (k + 1)), i.e. 1/4, 1/12, 1/24,
... of it. A candidate whose first run is not above the best (t_1 <= 0: most of a night's) is
discarded free of charge: it could never be kept, and one no better than the best gets past that
look at most half the time, which the halving pays for (the discarding of ADDIS-spending, online
family-wise error control; Tian & Ramdas 2021). The shares sum to one half, doubled: a night in
which nothing can be gained (every candidate as good as the start) keeps something with
probability at most NIGHT_ALPHA however long it runs, not 5% per candidate (46% over 12). A keep
starts a new stretch with the full level: real gains renew what the search may spend, as online
false-discovery control (alpha investing, LORD) does. The price is power after a long run of
candidates that looked better on their first run and were not: the first candidate of a
stretch is judged at 1.25%, the 5th at 0.08%.
tests/test_keep_rule.py measures the error rates and the cost in runs; `python bench/keep_rule.py`
prints them by number of pairs and for whole nights.
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

NIGHT_ALPHA = 0.05                        # false keeps allowed per stretch of candidates between keeps
LOOK_SHARES = (0.04, 0.16, 0.30, 0.50)    # how a candidate's level is split over its looks (sum 1)
FUTILITY_T = (0.0, 1.0, 1.5)              # t at or below which a look stops confirming
MAX_RUNS = len(LOOK_SHARES)               # a candidate's runs at most: 1 + 3 confirmations
MIN_SIGMA = 1e-9       # sigma when every run and every evaluation agree exactly


def candidate_alpha(k: int) -> float:
    """The false-keep level of a candidate when k - 1 (0, 1, ...) candidates since the last keep got
    past their first look."""
    return NIGHT_ALPHA / 2 / (k * (k + 1))


def got_past_first_look(looks: list[dict]) -> bool:
    """Whether a candidate's decision spent its level: it was confirmed or kept (a discard at the
    first look, not above the best, is free)."""
    return any(look.get("action") in ("confirm", "keep") for look in looks)


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
            add(best_code, train_seeds[min(baselines, len(train_seeds)) - 1], exp_folder.run(baselines),
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


def best_evidence(rows: list[Row], folder: RunFolder) -> tuple[int, int]:
    """(how many runs the best score is the mean of, candidates since the last keep that got past
    their first look), from results.tsv's rows and decision.json: the baselines' count, a kept
    candidate's runs (its first and its confirmations), one for a re-baseline. A resumed night
    spends where it left off."""
    runs, entered, baselines = 0, 0, 0
    for row in rows:
        if row.phase != "train" or row.score is None:
            continue
        if row.status == "baseline":
            baselines += row.exp == 0
            runs = baselines if row.exp == 0 else 1
        elif row.status == "keep":
            runs, entered = 1 + len(folder.exp(row.exp).confirmations()), 0
        elif row.status == "discard":
            decision = read_json(folder.exp(row.exp).decision)
            entered += "alpha" in decision and got_past_first_look(decision.get("looks") or [])
    return runs, entered


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


def look(scores: list[float], best: float, noise: Noise, best_runs: int = 0, alpha: float = NIGHT_ALPHA) -> Decision:
    """After a candidate's n-th run (`scores` are its n scores; `noise` already holds them as a
    group when n >= 2), against `best`, the mean of `best_runs` runs (0: a reference known
    exactly), at the candidate's level `alpha`: keep, discard, or confirm once more."""
    n = len(scores)
    mean = sum(scores) / n
    spread = noise.sigma * math.sqrt(1 / n + (1 / best_runs if best_runs else 0.0))
    t = (mean - best) / spread
    level = alpha * LOOK_SHARES[n - 1]
    threshold = best + t_quantile(1 - level, noise.df) * spread
    runs = f"{n} seeds: {', '.join(f'{s:.3f}' for s in scores)} (mean {mean:.3f})" if n > 1 else f"{mean:.3f}"
    of_best = f"1/{best_runs}" if best_runs else "0"
    gap = f"threshold {threshold:.3f} = best {best:.3f} + t(1-{level:.2g}, {noise.df})" \
          f"*sigma*sqrt(1/{n}+{of_best}); {noise.short()}"
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
             best_runs: int = 0, k: int = 1, rule_sees_best_runs: bool = True) -> Simulated:
    """`trials` candidates whose true score is the best's + gain * sigma, judged by this rule after
    k - 1 candidates since the last keep got past their first look. Every score is normal with seed-to-seed noise sigma
    (evaluation standard error `se`); the night so far has produced `pairs` pairs of runs of the
    same code. The best is the reference (best_runs=0) or itself the mean of `best_runs` runs of
    code as good as the best; `rule_sees_best_runs=False` judges as if that mean were exact (the
    rule before it counted the best's own noise)."""
    import random

    rng = random.Random(seed)
    kept = runs = outright = 0
    true_best = 100.0
    for _ in range(trials):
        history = []
        for pair in range(pairs):
            mu = rng.uniform(0.0, 200.0)
            history += [ScoredRun(f"code {pair}", s, mu + rng.gauss(0.0, sigma), se) for s in (1, 2)]
        noise = estimate(history)
        best = true_best if not best_runs else \
            sum(true_best + rng.gauss(0.0, sigma) for _ in range(best_runs)) / best_runs
        candidate: list[ScoredRun] = []
        while True:
            candidate.append(ScoredRun("candidate", len(candidate) + 1,
                                       true_best + gain * sigma + rng.gauss(0.0, sigma), se))
            decision = look([r.score for r in candidate], best, noise.including(candidate, [se]),
                            best_runs if rule_sees_best_runs else 0, candidate_alpha(k))
            if decision.action != "confirm":
                break
        runs += len(candidate)
        kept += decision.action == "keep"
        outright += decision.action == "keep" and len(candidate) == 1
    return Simulated(kept / trials, runs / trials, outright / trials, trials)


@dataclass
class SimulatedNight:
    """Whole nights judged by this rule, on synthetic scores."""
    false_keep_nights: float   # fraction of nights that kept a candidate no better than the best then
    keeps: float               # mean keeps per night
    gain: float                # mean true gain of the night's final best over the start, in sigmas
    runs: float                # mean train runs per night (baselines and confirmations included)
    trials: int


def simulate_night(gains: list[float], trials: int, seed: int = 0, sigma: float = 1.0, se: float = 0.0,
                   baseline_runs: int = BASELINE_RUNS) -> SimulatedNight:
    """`trials` nights: the start is scored by `baseline_runs` runs, then candidate j (true score
    the start's + gains[j] * sigma) is judged against the best so far, as the loop does: its runs
    join the noise estimate, one that gets past its first look lowers the next one's level, a keep
    makes its mean the best (of its runs) and starts a new stretch."""
    import random

    rng = random.Random(seed)
    false_nights = keeps = runs = 0
    gain_sum = 0.0
    for _ in range(trials):
        history = [ScoredRun("start", s, rng.gauss(0.0, sigma), se) for s in range(1, baseline_runs + 1)]
        best = sum(r.score for r in history) / baseline_runs
        best_runs, best_true, entered, false_keep = baseline_runs, 0.0, 0, False
        for j, gain in enumerate(gains):
            candidate: list[ScoredRun] = []
            while True:
                candidate.append(ScoredRun(f"exp {j}", len(candidate) + 1, gain * sigma + rng.gauss(0.0, sigma), se))
                decision = look([r.score for r in candidate], best, estimate(history + candidate, [se]),
                                best_runs, candidate_alpha(entered + 1))
                if decision.action != "confirm":
                    break
            history += candidate
            runs += len(candidate)
            entered += len(candidate) > 1 or decision.action == "keep"
            if decision.action == "keep":
                keeps += 1
                false_keep |= gain * sigma <= best_true
                best, best_runs, best_true, entered = sum(r.score for r in candidate) / len(candidate), \
                    len(candidate), gain * sigma, 0
        false_nights += false_keep
        gain_sum += best_true / sigma
        runs += baseline_runs
    return SimulatedNight(false_nights / trials, keeps / trials, gain_sum / trials, runs / trials, trials)
