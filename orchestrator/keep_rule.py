"""The keep rule: when a candidate's score beats the best by more than seed-to-seed noise.

Noise is measured, not assumed. Every group of runs of the same code with different training
seeds that the night produces is a sample of it: the baseline runs, a candidate's first run with
its confirmation runs, and a re-baseline (the best train.py retrained on a newly kept backend) with
the best train.py's runs of other seeds. "Same code" means the same train.py: a kept translation
was verified equivalent to the reference env, so it changes speed, not the distribution of
scores. A re-baseline repeats the seed of the run it replaces (train seed 1), so within a group
the latest run of a seed counts and the older one is dropped.

    sigma^2 = sum over groups of sum_i (x_i - mean_group)^2 / sum over groups of (n_group - 1)

Few runs give a noisy sigma, so thresholds use Student's t rather than a normal quantile, and
sigma never goes below the evaluation's own standard error (the root mean square of the runs'
`se`): an estimate of 0.000 from two identical runs cannot let a lucky candidate through on a
difference the 100-episode evaluation cannot resolve.

A candidate need not be as noisy as the code the night has measured: a change that makes training
bimodal has a seed-to-seed spread of its own, several times sigma. So the comparison is
Welch-style, each side with its own variance:

    var_c = (PRIOR_SD_RATIO * sigma)^2                        n = 1: the stated prior, no runs of its own
          = max(sigma^2, s_c^2) with n - 1 df                 n >= 2: s_c, the sd of its own n runs
    var_B = sigma^2 with sigma's df                           the best, the mean of n_B runs
          = s_B^2 with its group's runs - 1 df                when its own runs spread significantly wider
    t_n   = (m_n - B) / sqrt(var_c / n + var_B / n_B),  df: sigma's at n = 1 while var_B = sigma^2,
                                                        else Welch-Satterthwaite

(sigma here is the night's, from every run but the candidate's.) The max() keeps a candidate whose
few runs happen to agree from being judged as quieter than the code the night knows. With the
pooled sigma alone, a candidate as good as the start but 3x, 5x or 8x as noisy was kept in 9%, 17%
and 29% of 12-candidate nights; this way, at most the promised 5% (bench/keep_rule.py).
The best, likewise, is judged at its own spread s_B when that is significantly wider than the
other codes' (one-sided F test at 5%). A detune that makes training unstable gives a noisy start
(Pendulum with one step per rollout: its 4 baselines spread over 750 points) among candidates far
quieter than it (its fix runs at sd ~10). As their confirmations join the pool, sigma falls below
the start's own spread, and judged at that sigma the start looked better measured than it is:
12-candidate null nights of candidates 10x quieter than the start kept something in 7.7% of
nights (bench/keep_rule.py, `0.1 x`); now 0.8%. Not max(sigma^2, s_B^2): 4 runs' s_B exceeds
sigma by chance half the time, and at its 3 df that cost equal-noise nights a fifth of the gains
they found.
A start judged at its own spread is also re-measured (start_needs_run; the loop trains it again
before the next round, exp 0 run 5, 6, ... with seeds 5, 6, ..., up to twice its baselines):
with 4 runs, its mean's error and t at 3 df put a fix out of reach at a candidate's level (the
JAX_NUM_STEPS start: 4 baselines over 750 points against its fix's 5 runs at sd ~10 leave a rank
test p = 1/126 at best); at 8 runs the t quantile at those levels is about half of 3 df's and the
mean's error 0.71 of 4 runs'. (Whether to run it again reads spreads, not means.)

The decision is sequential. A candidate is trained with seed 1, then, while the evidence is
ambiguous, retrained with the confirmation seeds (2, 3, ...) up to MAX_RUNS runs:

    t_n > t(1 - alpha_k * LOOK_SHARES[n-1], df)   keep
    t_n <= FUTILITY_T[n-1], or n = MAX_RUNS       discard (at n = 1: not above B)
    otherwise                                     train it again with the next confirmation seed

The first look has almost no share (its variance is only the prior): a keep needs runs of its own
in practice. B is measured too (its n_B runs in the spread): comparing against it as if it were
exact kept 11-12% of candidates no better than the best.

alpha_k is what the night spends on a candidate when k - 1 candidates since the last keep (or
since the start) got past their first look: NIGHT_ALPHA / 2 / (k (k + 1)), i.e. 1/4, 1/12, 1/24,
... of it. A candidate whose first run is not above the best (t_1 <= 0: most of a night's) is
discarded free of charge: one no better than the best gets past that look at most half the time,
whatever its noise, which the halving pays for (the discarding of ADDIS-spending, online
family-wise error control; Tian & Ramdas 2021). A night in which nothing can be gained keeps
something with probability at most NIGHT_ALPHA however long it runs. A keep starts a new stretch
with the full level; a candidate is charged to the stretch it was judged in (`stretch` in its
decision.json: the exp of the keep that began it), so one judged in the round of a keep never
lowers the new stretch's level, and one interrupted while confirming has spent its level all the same.
bench/keep_rule.py measures the error rates and the cost by driving the loop's own round and
bookkeeping (orchestrator/keep_rule_simulation.py) on synthetic scores.

All of this treats a candidate's runs as independent draws, which holds only if train.py seeds
everything from AUTORL_SEED: runs of one candidate that copy each other count as one run
(seed_copies.py says how they are told). Confirmation seeds are fresh (`first_confirmation_seed`): from
config.FIRST_CONFIRM_SEED on, far from every baseline and start seed, MAX_RUNS - 1 of them
reserved per experiment number, so no seed of a confirmation was seen by an earlier run.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

from scipy import stats

from .results import Row, RunFolder, read_json
from .seed_copies import COPY_ALPHA, KEEP_INDEPENDENCE, MIN_SIGMA, artifact_sha256, copy_evidence, seed_copies

NIGHT_ALPHA = 0.05                             # false keeps allowed per stretch of candidates between keeps
LOOK_SHARES = (0.01, 0.09, 0.20, 0.30, 0.40)   # how a candidate's level is split over its looks (sum 1)
FUTILITY_T = (0.0, 1.0, 1.5, 1.5)              # t at or below which a look stops confirming
MAX_RUNS = len(LOOK_SHARES)                    # a candidate's runs at most: 1 + 4 confirmations
PRIOR_SD_RATIO = 3.0   # before its own runs, a candidate's sd is taken as 3x the night's sigma
BEST_SPREAD_LEVEL = 0.05   # the best is judged at its own spread when that is this significantly wider
START_RUNS_FACTOR = 2      # a noisy start is re-measured up to this many times its baselines' runs
MAX_LOST_START_RUNS = 3    # interrupted re-measures of the start (a killed daemon, lost runs) that end them


def candidate_alpha(k: int) -> float:
    """The false-keep level of a candidate when k - 1 (0, 1, ...) candidates since the last keep got
    past their first look."""
    return NIGHT_ALPHA / 2 / (k * (k + 1))


def got_past_first_look(looks: list[dict]) -> bool:
    """Whether a candidate's decision spent its level: it was confirmed or kept (a discard at the
    first look, not above the best, is free)."""
    return any(look.get("action") in ("confirm", "keep") for look in looks)


def confirmation_seed(first: int, k: int) -> int:
    """The train seed of a candidate's confirmation run k (1, 2, ...): `first` (the candidate's
    first_confirmation_seed), then the next seeds."""
    return first + k - 1


def first_confirmation_seed(night_first: int, exp: int) -> int:
    """The seed of experiment `exp`'s first confirmation run: each experiment number has MAX_RUNS - 1
    seeds of its own from `night_first` (the run's confirm_seed) on, so no candidate's confirmation
    repeats a seed an earlier run of the night trained with (baselines and start runs use seeds
    below it)."""
    return night_first + (exp - 1) * (MAX_RUNS - 1)


@dataclass
class ScoredRun:
    """One train run of some code, scored by the harness."""
    code: str              # what was trained: runs with the same code differ only by their seed
    seed: int
    score: float
    se: float = 0.0        # the harness's standard error of the mean over its episodes
    label: str = ""        # where it came from (exp 0 run 1, exp 3 confirm, ...)
    artifact: str = ""     # sha256 of its policy artifact ("" unknown): copies export the same one


@dataclass
class Noise:
    """The seed-to-seed noise of one run's score, with the runs it was measured from."""
    sigma: float                         # what the rule uses: max(pooled, floor)
    pooled: Optional[float]              # from the pairs alone (None: no pair yet)
    df: int                              # degrees of freedom (a pair is one)
    floor: float                         # RMS of the evaluation standard errors
    groups: list[list[ScoredRun]] = field(default_factory=list)   # groups of 2+ runs of the same code
    best_code: Optional[str] = None      # the code of the best to beat (its group is its own runs)
    candidate_se: tuple = ()             # the evaluation standard errors of the candidate's runs (`including`)

    def including(self, runs: list[ScoredRun] = (), extra_se: list[float] = ()) -> "Noise":
        """The estimate with more runs (one candidate's: one run alone joins no group; runs that
        copy each other join as one), the floor also over `extra_se` (the candidate's evaluation
        standard errors, kept for its look: `seed_copies` reads them)."""
        noise = estimate([r for g in self.groups for r in g] + independent_runs(list(runs), self.sigma),
                         list(extra_se), self.best_code)
        noise.candidate_se = tuple(extra_se)
        return noise

    def wider_spread_of(self, code: Optional[str]) -> Optional[tuple[float, int]]:
        """(sample variance, df) of the runs of `code` when they spread significantly wider than
        every other code's (one-sided F test at BEST_SPREAD_LEVEL; none other: no evidence either
        way), else None: the pooled sigma describes them."""
        own = [g for g in self.groups if g[0].code == code]
        others = [g for g in self.groups if g[0].code != code]
        if not own or not others:
            return None
        df_own, df_others = len(own[0]) - 1, sum(len(g) - 1 for g in others)
        var_own, var_others = _squares(own[0]) / df_own, sum(_squares(g) for g in others) / df_others
        if var_own <= max(var_others, self.floor ** 2, MIN_SIGMA ** 2) * _f_quantile(1 - BEST_SPREAD_LEVEL, df_own, df_others):
            return None
        return var_own, df_own

    def evidence(self) -> dict:
        return {"sigma": self.sigma, "pooled": self.pooled, "df": self.df, "floor_se": self.floor,
                "best_code": self.best_code, "groups": [[asdict(r) for r in group] for group in self.groups]}

    def short(self) -> str:
        source = f"{self.df} degree{'s' if self.df != 1 else ''} of freedom" if self.df else "no pair of runs yet"
        floored = ", eval se floor" if self.pooled is None or self.pooled < self.floor else ""
        return f"sigma {self.sigma:.3g} from {source}{floored}"


def _squares(group: list[ScoredRun]) -> float:
    """The sum of squared deviations of a group's scores from their mean."""
    mean = sum(r.score for r in group) / len(group)
    return sum((r.score - mean) ** 2 for r in group)


def independent_runs(runs: list[ScoredRun], sigma: float) -> list[ScoredRun]:
    """One candidate's runs as evidence: all of them, or only the first when they copy each other
    (`seed_copies` at the night's `sigma`)."""
    copied = seed_copies([r.score for r in runs], sigma, [r.se for r in runs], [r.artifact for r in runs])
    return runs[:1] if copied else runs


def estimate(runs: list[ScoredRun], extra_se: Optional[list[float]] = None, best_code: Optional[str] = None) -> Noise:
    """Pool the within-code variance over every code with two runs or more (distinct seeds; the
    latest run of a seed counts). The floor is the RMS of the evaluation standard errors of these
    runs and of `extra_se` (the candidate's own runs)."""
    by_code: dict[str, dict[int, ScoredRun]] = {}
    for run in runs:
        by_code.setdefault(run.code, {})[run.seed] = run  # a later run of a seed replaces the older one
    groups = [list(seeds.values()) for seeds in by_code.values() if len(seeds) >= 2]
    squares = sum(_squares(group) for group in groups)
    df = sum(len(group) - 1 for group in groups)
    pooled = math.sqrt(squares / df) if df else None
    ses = [r.se for g in groups for r in g] + list(extra_se or [])
    floor = math.sqrt(sum(s * s for s in ses) / len(ses)) if ses else 0.0
    sigma = max(pooled or 0.0, floor, MIN_SIGMA)
    return Noise(sigma, pooled, df, floor, groups, best_code)


def night_noise(rows: list[Row], folder: RunFolder, train_seeds: list[int], confirm_seed: int) -> Noise:
    """The estimate from every run of the night so far (results.tsv's rows and each run's
    eval.json): the baseline runs; each train candidate with its confirmations; a re-baseline,
    which retrains the best train.py with the train seed (replacing that seed's run: the backend
    changed) and so pairs with the best's runs of other seeds. The loop judges with it; the
    report shows it."""
    seed = train_seeds[0]
    runs: list[ScoredRun] = []

    def scored(code: str, seed: int, run_folder, label: str) -> list[ScoredRun]:
        result = read_json(run_folder.eval_json)
        try:
            return [ScoredRun(code, seed, float(result["mean"]), float(result.get("se") or 0.0), label,
                              artifact_sha256(run_folder))]
        except (KeyError, TypeError, ValueError):
            return []

    def add(code: str, seed: int, run_folder, label: str) -> None:
        runs.extend(scored(code, seed, run_folder, label))

    best_code, baselines = "exp 0", 0
    for row in rows:
        if row.phase != "train" or row.status not in ("baseline", "keep", "discard"):
            continue
        exp_folder = folder.exp(row.exp)
        if row.exp == 0:
            baselines += 1
            add(best_code, start_seed(baselines, train_seeds), exp_folder.run(baselines), f"exp 0 run {baselines}")
        elif row.status == "baseline":
            add(best_code, seed, exp_folder, f"exp {row.exp} re-baseline")
        else:
            code, first = f"exp {row.exp}", first_confirmation_seed(confirm_seed, row.exp)
            candidate = scored(code, seed, exp_folder, code)
            for k, confirmation in enumerate(exp_folder.confirmations(), 1):
                candidate += scored(code, confirmation_seed(first, k), confirmation, f"{code} confirm {k}")
            # copies count as one run, judged against the night as it stood before them (as its look was)
            runs.extend(independent_runs(candidate, estimate(runs, [r.se for r in candidate]).sigma))
            if row.status == "keep":
                best_code = f"exp {row.exp}"
    return estimate(runs, best_code=best_code)


def start_seed(k: int, train_seeds: list[int]) -> int:
    """The train seed of the start's run k (1, 2, ...): its baselines' seeds, then the next ones
    (the runs a noisy start is re-measured with)."""
    return train_seeds[k - 1] if k <= len(train_seeds) else train_seeds[-1] + k - len(train_seeds)


def start_needs_run(rows: list[Row], folder: RunFolder, train_seeds: list[int], confirm_seed: int) -> Optional[int]:
    """The seed to train the start with once more, or None. While the start is the best (nothing
    kept, no re-baseline) and its runs spread significantly wider than the other codes' (the
    verdicts then judge it at that spread, with its few runs' df), each more run of it narrows
    what a candidate must clear, up to START_RUNS_FACTOR x its baselines. Whether to run it again
    depends on its runs' spread, not their mean (independent for normal scores), so the best to
    beat is not moved toward or away from any candidate. A re-measure that failed (crash, timeout,
    invalid) ends it, and so does a third interrupted one: the start's seeds stay in step with its
    scored runs, and a run the infrastructure keeps losing is not retried all night."""
    starts = [r for r in rows if r.exp == 0 and r.phase == "train"]
    if any(r.exp > 0 and r.phase == "train" and r.status in ("keep", "baseline") for r in rows):
        return None
    if any(r.status in ("crash", "timeout", "invalid") for r in starts):
        return None
    first_candidate = next((i for i, r in enumerate(rows) if r.exp > 0), len(rows))
    if sum(r.exp == 0 and r.status == "interrupted" for r in rows[first_candidate:]) >= MAX_LOST_START_RUNS:
        return None
    scored = sum(r.status == "baseline" for r in starts)
    if scored < len(train_seeds) or scored >= START_RUNS_FACTOR * len(train_seeds):
        return None
    noise = night_noise(rows, folder, train_seeds, confirm_seed)
    if noise.best_code != "exp 0" or noise.wider_spread_of("exp 0") is None:
        return None
    return start_seed(scored + 1, train_seeds)


def best_evidence(rows: list[Row], folder: RunFolder) -> tuple[int, int, int]:
    """(how many runs the best score is the mean of, candidates of the current stretch that got past
    their first look, the stretch: the exp of the train keep that began it, 0 for the start), from
    results.tsv's rows and decision.json: the baselines' count, a kept candidate's runs (its first and
    its confirmations), one for a re-baseline. A candidate counts in the stretch its decision.json
    names (it may have been judged in the round of the keep that began the next one), discarded or
    interrupted alike: a resumed night spends where it left off."""
    runs, baselines, stretch = 0, 0, 0
    charged: list[int] = []
    for row in rows:
        if row.phase != "train":
            continue
        if row.status == "baseline" and row.score is not None:
            baselines += row.exp == 0
            runs = baselines if row.exp == 0 else 1
        elif row.status == "keep" and row.score is not None:
            runs, stretch = 1 + len(folder.exp(row.exp).confirmations()), row.exp
        elif row.status in ("discard", "interrupted"):
            decision = read_json(folder.exp(row.exp).decision)
            if "alpha" in decision and got_past_first_look(decision.get("looks") or []):
                charged.append(int(decision.get("stretch", stretch)))  # (before `stretch` was recorded: the row's)
    return runs, sum(s == stretch for s in charged), stretch


def t_quantile(p: float, df: float) -> float:
    return _t_quantile(p, round(max(df, 1.0), 3))  # no pair yet: as conservative as one pair


@lru_cache(maxsize=65536)
def _t_quantile(p: float, df: float) -> float:
    return float(stats.t.ppf(p, df))


@lru_cache(maxsize=4096)
def _f_quantile(p: float, df_a: int, df_b: int) -> float:
    return float(stats.f.ppf(p, df_a, df_b))


@dataclass
class Decision:
    action: str            # keep, discard, confirm
    threshold: float       # the score (or n-seed mean) that had to be beaten
    note: str              # the short form for the row's description
    candidate_sd: float = 0.0   # the candidate's seed-to-seed sd the look used (prior, night's or its own)
    df: float = 0.0             # the degrees of freedom of the t quantile

    def evidence(self) -> dict:
        return asdict(self)


def welch_df(parts: list[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance terms (variance, its df); a term
    with no df yet counts as one (as conservative as one pair)."""
    total = sum(v for v, _ in parts)
    spread = sum(v * v / max(df, 1) for v, df in parts)
    return total * total / spread if spread > 0 else float(max(min(df for _, df in parts), 1))


def look(scores: list[float], best: float, noise: Noise, best_runs: int = 0, alpha: float = NIGHT_ALPHA,
         artifacts: Sequence[str] = ()) -> Decision:
    """After a candidate's n-th run (`scores` are its n scores, `artifacts` their policies' sha256
    where known; `noise` is the night's estimate from every run but these, its floor over their
    evaluation standard errors too), against `best`, the mean of `best_runs` runs (0: a reference
    known exactly), at the candidate's level `alpha`: keep, discard, or confirm once more.
    Runs that copy each other (`copy_evidence` below COPY_ALPHA) are judged as one run, their mean,
    and not confirmed again: more runs would copy it too. A keep on runs that spread less than
    independent seeds would with probability KEEP_INDEPENDENCE waits for one more run (the last
    allowed one: judged as one run): copies that differ a little are kept there otherwise."""
    p_independent, copied = copy_evidence(scores, noise.sigma, noise.candidate_se, artifacts)
    if p_independent < COPY_ALPHA:
        return _as_one_run(copied, scores, best, noise, best_runs, alpha)
    decision = _look(scores, best, noise, best_runs, alpha)
    if decision.action != "keep" or p_independent >= KEEP_INDEPENDENCE:
        return decision
    # Kept on runs closer than most independent seeds are: not yet (copies would be kept here)
    close = (f"its {len(scores)} runs agree more closely than independent seeds do "
             f"{100 * (1 - p_independent):.0f}% of the time")
    if len(scores) >= MAX_RUNS:
        return _as_one_run(f"{copied} ({close})", scores, best, noise, best_runs, alpha)
    return replace(decision, action="confirm", note=f"{close}: confirm before keeping ({decision.note})")


def _as_one_run(copied: str, scores: list[float], best: float, noise: Noise, best_runs: int, alpha: float) -> Decision:
    """Runs that copy each other judged as one run, their mean, and not confirmed again: more runs
    would copy it too."""
    one = _look([sum(scores) / len(scores)], best, noise, best_runs, alpha)
    if one.action == "keep":
        return replace(one, note=f"{copied}; judged as one run, it {one.note}")
    return replace(one, action="discard", note=f"{copied}; judged as one run: {one.note.replace(': confirm', '')}")


def _look(scores: list[float], best: float, noise: Noise, best_runs: int, alpha: float) -> Decision:
    """`look` for runs taken as independent."""
    n = len(scores)
    mean = sum(scores) / n
    sigma2 = noise.sigma ** 2
    level = alpha * LOOK_SHARES[n - 1]
    if n == 1:
        own, var_c, df_c = "prior", (PRIOR_SD_RATIO ** 2) * sigma2, noise.df
    else:
        sample = sum((x - mean) ** 2 for x in scores) / (n - 1)
        own, var_c, df_c = ("own", sample, n - 1) if sample > sigma2 else ("night's", sigma2, n - 1)
    # The best's side: sigma^2, or its own runs' spread when that is wider (a noisy start among
    # quiet candidates: their confirmations pull the pooled sigma down, not the start's noise).
    own_best = noise.wider_spread_of(noise.best_code) if best_runs else None
    var_b, df_b = own_best or (sigma2, noise.df)   # (significantly wider than the others: wider than sigma)
    parts = [(var_c / n, df_c)] + ([(var_b / best_runs, df_b)] if best_runs else [])
    spread = math.sqrt(sum(v for v, _ in parts))
    # one run: both sides are scaled from the one night's sigma, so they share its df (Welch's
    # formula would count them as two independent estimates); not so when the best's is its own
    df = float(max(noise.df, 1)) if n == 1 and var_b == sigma2 else welch_df(parts)
    t = (mean - best) / spread
    threshold = best + t_quantile(1 - level, df) * spread
    runs = f"{n} seeds: {', '.join(f'{s:.3f}' for s in scores)} (mean {mean:.3f})" if n > 1 else f"{mean:.3f}"
    sd_c = {"prior": f"{PRIOR_SD_RATIO:g} x sigma (prior)", "own": f"{math.sqrt(var_c):.3g} (its own)",
            "night's": "sigma"}[own]
    of_best = (f" + sd_B^2/{best_runs}, sd_B {math.sqrt(var_b):.3g} (the best's own)" if var_b != sigma2 else
               f" + sigma^2/{best_runs}") if best_runs else ""
    gap = f"threshold {threshold:.3f} = best {best:.3f} + t(1-{level:.2g}, {df:.1f})*sqrt(sd^2/{n}{of_best}), " \
          f"candidate sd {sd_c}; {noise.short()}"
    evidence = dict(candidate_sd=math.sqrt(var_c), df=df)
    if mean > threshold:
        verb = "beats" if n == 1 else "confirmed over"
        return Decision("keep", threshold, f"{verb} {runs} > {gap}", **evidence)
    if n >= MAX_RUNS or t <= FUTILITY_T[n - 1]:
        if n == 1 and mean <= best:  # the common case, said short
            return Decision("discard", threshold, f"not above best {best:.3f}", **evidence)
        why = f"t {t:.2f} <= {FUTILITY_T[n - 1]:g}, stopped confirming" if n < MAX_RUNS else f"{n} runs at most"
        return Decision("discard", threshold, f"not confirmed over {runs} <= {gap}; {why}", **evidence)
    return Decision("confirm", threshold, f"{runs} is above best {best:.3f} but not above the {gap}: confirm",
                    **evidence)


def write_decision(path: Path, record: dict) -> None:
    tmp = Path(path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
