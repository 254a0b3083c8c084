"""Learning curves: how each experiment learned, read from the `update ...` lines train.py prints
into its train.log (the format is documented in program.md, so a rewritten train.py keeps it):

    update 12 steps 98304 sps 41210 return(last 20 episodes) 187.35 kl 0.0123 time 3.1s

Each curve is (env steps, seconds since train.py started, mean return of the recent episodes), one
point per printed update; lines whose return is nan (no episode finished yet) are left out.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..results import ExpFolder

UPDATE_LINE = re.compile(r"^update \d+ steps (\d+)\b.*?\breturn\([^)]*\) (\S+)(?:.*?\btime ([\d.]+)s)?", re.MULTILINE)


@dataclass
class Curve:
    label: str                        # "baseline 1", "exp 7"
    exp: int
    status: str                       # the row's: baseline, keep, discard, ...
    steps: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    returns: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.returns)


def read_curve(train_log: Path) -> tuple[list, list, list]:
    """(env steps, seconds, returns) of a train.log's update lines; empty lists without any."""
    try:
        text = Path(train_log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return [], [], []
    steps, seconds, returns = [], [], []
    for match in UPDATE_LINE.finditer(text):
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        steps.append(int(match.group(1)))
        seconds.append(float(match.group(3)) if match.group(3) else math.nan)
        returns.append(value)
    return steps, seconds, returns


def train_logs(run_dir: Path, exp: int, status: str, baseline_runs: int) -> list[tuple[str, Path]]:
    """The train.log(s) a row's score came from: both baseline runs for exp 0, the screen's run for
    a screened candidate, else the experiment's own run."""
    folder = ExpFolder(Path(run_dir) / f"exp-{exp:04d}")
    if exp == 0:
        return [(f"baseline {i}", folder.run(i).train_log) for i in range(1, baseline_runs + 1)]
    if status == "screened":
        return [(f"exp {exp} (screen)", ExpFolder(folder.screen).train_log)]
    return [(f"exp {exp}", folder.train_log)]


def night_curves(run_dir: Path, rows) -> list[Curve]:
    """Every train experiment's curve, in the order of results.tsv (rows: its DataFrame)."""
    curves = []
    train = rows[rows.phase == "train"].drop_duplicates("exp", keep="last") if len(rows) else rows
    baseline_runs = int(((rows.exp == 0) & (rows.status == "baseline")).sum()) if len(rows) else 0
    for row in train.itertuples():
        for label, log in train_logs(run_dir, int(row.exp), row.status, baseline_runs):
            curve = Curve(label, int(row.exp), "baseline" if row.exp == 0 else row.status)
            curve.steps, curve.seconds, curve.returns = read_curve(log)
            if curve:
                curves.append(curve)
    return curves


def incumbent_of(curves: list[Curve], kept: Curve) -> Optional[Curve]:
    """The curve a kept experiment beat: the last kept one before it, else the first baseline run."""
    before = [c for c in curves if 0 < c.exp < kept.exp and c.status in ("keep", "baseline")]  # (a re-baseline too)
    if before:
        return before[-1]
    return next((c for c in curves if c.exp == 0), None)
