"""Whole nights on synthetic scores, judged by the loop's own code: how often the keep rule keeps
a candidate no better than the best, how often it finds a real gain, and what it costs in runs.

Nothing of the rule is copied here. Each round goes through what `loop.Run.run_train_round` calls:
the incumbent is rebuilt from results.tsv's rows and the exp folders (`phases.incumbent_of`, as a
resumed daemon rebuilds it), the round is judged by `TrainPhase.judge_round` (its confirmations
answered with synthetic runs), decision.json is written by `decision_record` and the rows go in
`concluding_order`. Only the runner is synthetic: a run's score is the candidate's true mean plus
normal seed noise (sd `sigma` for the start, `candidate_sd` x sigma for candidates), with the
harness's standard error `se`, written where the runner writes eval.json, with a policy.pt of the
run's own. A seed-copying candidate (`copy_jitter`, a train.py that pins its own seed) has
confirmations that copy its first run: the same score and policy.pt (0), or its score plus normal
jitter of sd copy_jitter x sigma (a wall-clock budget's slightly different number of updates). The
files live in a scratch folder (in memory where /dev/shm exists).

The scores and the gains come from independent random streams: a night's gains (drawn by the
caller or given) never share a generator with its seed noise.
"""
from __future__ import annotations

import json
import random
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from .config import BASELINE_RUNS, FIRST_CONFIRM_SEED
from .keep_rule import first_confirmation_seed, start_needs_run, write_decision
from .phases import TrainPhase, concluding_order, decision_record, incumbent_of, judge
from .results import ExpFolder, Row, RunFolder
from .runners.base import Measurement

Gains = Union[Sequence[float], Callable[[random.Random], Sequence[float]]]


@dataclass
class SimulatedNights:
    """Nights judged by the loop's rule on synthetic scores (gains and sds in units of sigma)."""
    false_keep_nights: float   # fraction of nights that kept a candidate no better than the best then
    found: float               # fraction of nights whose final best is truly better than the start
    keeps: float               # mean keeps per night
    gain: float                # mean true gain of the night's final best over the start
    runs: float                # mean train runs per night (baselines and confirmations included)
    runs_per_candidate: float  # mean train runs per candidate (1 + its confirmations)
    trials: int
    start_remeasures: float = 0.0   # mean runs per night of a noisy start beyond its baselines


def scratch_root() -> Path:
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="autorl-keep-sim-", dir=shm if shm.is_dir() else None))


def simulate_nights(gains: Gains, trials: int, seed: int = 0, sigma: float = 1.0, se: float = 0.0,
                    baselines: int = BASELINE_RUNS, candidate_sd: float = 1.0, parallel: int = 1,
                    root: Optional[Path] = None, copy_jitter: Optional[float] = None) -> SimulatedNights:
    """`trials` nights: `baselines` runs of the start, then the candidates (true score the start's +
    gains[j] * sigma; `gains` a list, or a function drawing one per night from its own generator),
    `parallel` per round, each judged against the best so far as the loop judges it. `copy_jitter`
    (None: honest candidates): every candidate's confirmations copy its first run, within that
    jitter (in sigmas; 0: exact copies)."""
    gain_stream, noise_stream = random.Random(f"gains {seed}"), random.Random(f"noise {seed}")
    own_root = root is None
    root = scratch_root() if own_root else Path(root)
    totals = dict(false=0, found=0, keeps=0, gain=0.0, runs=0, candidates=0, candidate_runs=0, remeasures=0)
    try:
        for trial in range(trials):
            night_gains = list(gains(gain_stream) if callable(gains) else gains)
            folder = RunFolder(root / f"night-{trial}")
            night = _Night(folder, noise_stream, sigma, se, candidate_sd, copy_jitter)
            night.run(night_gains, baselines, max(1, parallel))
            totals["false"] += night.false_keep
            totals["found"] += night.best_true > 0
            totals["keeps"] += night.keeps
            totals["gain"] += night.best_true / sigma
            totals["runs"] += night.runs
            totals["candidates"] += len(night_gains)
            totals["candidate_runs"] += night.runs - night.start_runs
            totals["remeasures"] += night.start_runs - baselines
            shutil.rmtree(folder.path, ignore_errors=True)
    finally:
        if own_root:
            shutil.rmtree(root, ignore_errors=True)
    return SimulatedNights(totals["false"] / trials, totals["found"] / trials, totals["keeps"] / trials,
                           totals["gain"] / trials, totals["runs"] / trials,
                           totals["candidate_runs"] / max(totals["candidates"], 1), trials,
                           totals["remeasures"] / trials)


class _Night:
    """One night's synthetic runner and its rows, the rest the loop's."""

    def __init__(self, folder: RunFolder, rng: random.Random, sigma: float, se: float, candidate_sd: float,
                 copy_jitter: Optional[float] = None):
        self.folder, self.rng, self.sigma, self.se, self.candidate_sd = folder, rng, sigma, se, candidate_sd
        self.copy_jitter = copy_jitter
        self.rows: list[Row] = []
        self.best_score: Optional[float] = None
        self.best_true = 0.0
        self.false_keep = False
        self.keeps = self.runs = self.start_runs = 0
        self.phase = TrainPhase()

    def _run(self, where: ExpFolder, true_mean: float, sd: float, copy_of: Optional[ExpFolder] = None) -> Measurement:
        """One train run scored: the eval.json and policy.pt the runner would leave, and its
        Measurement. `copy_of`: the run it copies (a seed-copying candidate's first run)."""
        if copy_of is None:
            score, policy = true_mean + self.rng.gauss(0.0, sd * self.sigma), f"{where.path} {self.runs}"
        else:
            score, policy = json.loads(copy_of.eval_json.read_text())["mean"], (copy_of.out / "policy.pt").read_text()
            if self.copy_jitter:
                score, policy = score + self.rng.gauss(0.0, self.copy_jitter * self.sigma), f"{policy} {self.runs}"
        where.out.mkdir(parents=True, exist_ok=True)
        (where.out / "policy.pt").write_text(policy)
        evaluation = {"mean": score, "se": self.se}
        where.eval_json.write_text(json.dumps(evaluation))
        self.runs += 1
        return Measurement(score=score, evaluation=evaluation)

    def run(self, gains: list[float], baselines: int, parallel: int) -> None:
        self.train_seeds = list(range(1, baselines + 1))   # as a run's config has them: baseline k trains with seed k
        self.start_scores: list[float] = []
        for _ in range(baselines):
            self._start_run()
        exp = 1
        for start in range(0, len(gains), parallel):
            while start_needs_run(self.rows, self.folder, self.train_seeds, FIRST_CONFIRM_SEED) is not None:
                self._start_run()   # as the loop does before a round: a noisy start re-measured
            self._round(list(range(exp + start, exp + start + min(parallel, len(gains) - start))),
                        gains[start:start + parallel])

    def _start_run(self) -> None:
        """One more run of the start (exp 0 run k), its row with the mean of the start's runs as the best."""
        k = len(self.start_scores) + 1
        self.start_scores.append(self._run(self.folder.exp(0).run(k), 0.0, 1.0).score)
        self.start_runs += 1
        self.best_score = sum(self.start_scores) / k
        self.rows.append(Row(0, "train", "baseline", score=self.start_scores[-1], best=self.best_score))

    def _round(self, exps: list[int], gains: list[float]) -> None:
        true = {e: g * self.sigma for e, g in zip(exps, gains)}
        measured = [self._run(self.folder.exp(e), true[e], self.candidate_sd) for e in exps]
        incumbent = incumbent_of(self.rows, self.folder, self.best_score, "best", self.train_seeds, FIRST_CONFIRM_SEED)
        incumbent = replace(incumbent, seeds=(1, first_confirmation_seed(FIRST_CONFIRM_SEED, exps[0])))  # as the loop

        def confirm(request):
            e = exps[request.index]
            copy_of = self.folder.exp(e) if self.copy_jitter is not None else None
            return self._run(self.folder.exp(e).confirmation(request.k), true[e], self.candidate_sd, copy_of)

        verdicts = judge(self.phase.judge_round(measured, incumbent, exps), confirm)
        for e, v in zip(exps, verdicts):
            if v.decision:
                write_decision(self.folder.exp(e).decision, decision_record(v))
        for i in concluding_order(verdicts):
            v = verdicts[i]
            if v.status == "keep":
                self.keeps += 1
                self.false_keep |= true[exps[i]] <= self.best_true
                self.best_score, self.best_true = v.score, true[exps[i]]
            self.rows.append(Row(exps[i], "train", v.status, score=v.score, best=self.best_score))
