"""A run folder read once for the report: its configuration, its rows and the samples they point to.

Everything comes from the run folder (results.tsv read through its torn-line-tolerant reader,
then pandas; eval.json per scored run; translate.json; transfer.tsv when `transfer` ran).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Optional

import numpy as np

from ..daemon import lock_holder
from ..inflight import recorded
from ..results import ExpFolder, ResultsFile, RunFolder, read_json
from ..keep_rule import Noise, night_noise
from .statistics import iqm, seed_ci
from .rescored import Rescore
from .rescored import load as load_rescore

FAILED = ("crash", "timeout", "invalid", "interrupted")


@dataclass
class Sample:
    """Per-episode returns of one or more scored runs of the same commit (pooled)."""
    label: str
    exp: Optional[int]
    returns: np.ndarray
    runs: int
    run_scores: list = field(default_factory=list)   # each run's mean return: one per training seed

    @property
    def mean(self) -> float:
        return float(self.returns.mean()) if self.returns.size else math.nan

    @property
    def iqm(self) -> float:
        return iqm(self.returns)

    @property
    def se(self) -> float:
        n = self.returns.size
        return float(self.returns.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan


@dataclass
class Night:
    """A run folder read once: its configuration, its rows (a DataFrame), and what they point to."""
    run_dir: Path
    config: dict
    rows: "object"                      # pandas.DataFrame: results.tsv plus se, iqm, episodes, t_hours
    baseline: Optional[Sample] = None
    best: Optional[Sample] = None
    best_row: Optional[dict] = None
    translations: list = field(default_factory=list)
    in_flight: list = field(default_factory=list)
    pid: Optional[int] = None
    transfer: "object" = None           # pandas.DataFrame of transfer.tsv, or None
    noise_estimate: Optional[Noise] = None   # the keep rule's, from every run of the night
    rescore: Optional[Rescore] = None   # the start and the best on fresh seeds (rescore.json), if done

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.run_dir)

    @property
    def tag(self) -> str:
        return self.run_dir.name

    @property
    def noise(self) -> float:
        return self.noise_and_source[0]

    @property
    def noise_and_source(self) -> tuple[float, str]:
        """The seed-to-seed noise (sigma) of a run's score: the keep rule's own estimate from every
        same-code group of runs the night has produced (keep_rule.night_noise, as the loop judges)."""
        noise = self.noise_estimate
        if noise is None or noise.df == 0:
            return math.nan, "no pair yet"
        return noise.sigma, f"keep rule, {noise.df} degree(s) of freedom"

    @property
    def baseline_score(self) -> float:
        scores = self.rows.loc[(self.rows.exp == 0) & (self.rows.status == "baseline"), "score"].dropna()
        return float(scores.mean()) if len(scores) else math.nan

    @property
    def gain(self) -> float:
        if self.best_row is None:
            return math.nan
        return float(self.best_row["score"]) - self.baseline_score

    @cached_property
    def ci(self) -> tuple[float, float]:
        """95% CI of best minus baseline with training seeds as the units (the keep rule's noise): a
        bootstrap over pooled episodes ignored seed-to-seed variation, far too narrow for a decision."""
        if self.baseline is None or self.best is None or self.noise_estimate is None:
            return math.nan, math.nan
        noise = self.noise_estimate
        return seed_ci(self.baseline.run_scores, self.best.run_scores, noise.sigma if noise.df else math.nan,
                       noise.df)


def _returns(folder: ExpFolder) -> Optional[np.ndarray]:
    data = read_json(folder.eval_json)
    values = data.get("returns")
    if not isinstance(values, list) or not values:
        return None
    return np.asarray(values, dtype=float)


def _eval_folders(run: RunFolder, exp: int, index: int) -> list[ExpFolder]:
    """The folders whose eval.json make a row's score: baseline run `index` of exp 0; an
    experiment's own run plus its confirmation runs when it had some."""
    if exp == 0:
        return [run.exp(0).run(index)]
    folder = run.exp(exp)
    return [folder] + [c for c in folder.confirmations() if c.eval_json.exists()]


def _pooled(label: str, exp: Optional[int], folders: list[ExpFolder]) -> Optional[Sample]:
    parts = [r for r in (_returns(f) for f in folders) if r is not None]
    if not parts:
        return None
    return Sample(label, exp, np.concatenate(parts), len(parts), [float(p.mean()) for p in parts])


def load(run_dir: Path) -> Night:
    import pandas as pd

    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    config = read_json(folder.config)
    rows = ResultsFile(folder.results).read()
    frame = pd.DataFrame([vars(r) for r in rows], columns=[
        "exp", "time", "phase", "commit", "status", "score", "best", "env_steps", "sps", "wall_s", "cost_usd",
        "description"])
    frame["score"] = pd.to_numeric(frame["score"], errors="coerce")
    frame["best"] = pd.to_numeric(frame["best"], errors="coerce")
    for column in ("sps", "env_steps", "wall_s", "cost_usd"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    # Per row: the harness's se and IQM over the pooled episodes of its runs.
    se, iq, episodes, baseline_index = [], [], [], 0
    for row in rows:
        if row.exp == 0 and row.status == "baseline":
            baseline_index += 1  # baseline run N (N-th scored) lives in exp-0000/run-N
        sample = _pooled("", row.exp, _eval_folders(folder, row.exp, baseline_index)) \
            if row.score is not None else None
        se.append(sample.se if sample else math.nan)
        iq.append(sample.iqm if sample else math.nan)
        episodes.append(sample.returns.size if sample else 0)
    frame["se"], frame["iqm"], frame["episodes"] = se, iq, episodes
    start = parse_time(config.get("created")) or (parse_time(rows[0].time) if rows else None)
    frame["t_hours"] = [(parse_time(r.time) - start) / 3600 if start and parse_time(r.time) else math.nan
                        for r in rows]
    night = Night(run_dir, config, frame)
    night.noise_estimate = night_noise(rows, folder, config.get("train_seeds") or [1, 2],
                                       int(config.get("confirm_seed") or 2))

    baseline_runs = [folder.exp(0).run(i + 1) for i in range(len([r for r in rows if r.exp == 0 and
                                                                   r.status == "baseline"]))]
    night.baseline = _pooled("baseline", 0, baseline_runs)
    scored = [r for r in rows if r.status in ("baseline", "keep") and r.score is not None]
    if scored:
        best = scored[-1]
        night.best_row = vars(best)
        if best.exp == 0:
            night.best = night.baseline
        else:
            night.best = _pooled(f"best (exp {best.exp})", best.exp, _eval_folders(folder, best.exp, 0))
    for row in rows:
        if row.phase == "translate" and row.status == "keep":
            night.translations.append({**vars(row), **read_json(folder.exp(row.exp).translate)})
    night.rescore = load_rescore(run_dir)
    night.pid = lock_holder(run_dir)
    night.in_flight = recorded(run_dir) if night.pid else []
    if folder.transfer_tsv.exists():
        try:
            night.transfer = pd.read_csv(folder.transfer_tsv, sep="\t", dtype={"commit": str})
        except (ValueError, OSError):
            night.transfer = None
    return night


def parse_time(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
