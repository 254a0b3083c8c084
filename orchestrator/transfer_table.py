"""transfer.tsv: the table `transfer` writes (one row per trained cell, appended and fsynced) and
its summary per env (baseline vs best with a 95% CI over seeds), read by `transfer` and the report."""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Optional

import numpy as np

COLUMNS = ("env", "which", "seed", "commit", "budget_s", "status", "score", "se", "iqm", "env_steps", "sps",
           "wall_s", "time")
WHICH = ("baseline", "best")          # the run's starting train.py, its best train.py


def read_rows(path: Path) -> list[dict]:
    """The finished cells (a torn last line, from a kill mid-write, is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")[:-1]
    if not lines:
        return []
    rows = []
    for record in csv.DictReader(lines, delimiter="\t"):
        if None in record.values() or set(record) != set(COLUMNS):
            continue
        try:
            record["seed"], record["budget_s"] = int(record["seed"]), float(record["budget_s"])
        except ValueError:
            continue
        rows.append(record)
    return rows


def row_key(row: dict) -> tuple:
    return row["env"], row["which"], int(row["seed"]), row["commit"], float(row["budget_s"])


def append_row(path: Path, row: dict) -> None:
    path = Path(path)
    text = ("" if path.exists() and path.stat().st_size else "\t".join(COLUMNS) + "\n")
    text += "\t".join(_cell_text(row.get(c)) for c in COLUMNS) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _cell_text(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:.0f}"
    return " ".join(str(value).split())


def load_frame(path: Path):
    import pandas as pd

    rows = read_rows(path)
    if not rows:
        return None
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for column in ("score", "se", "iqm", "env_steps", "sps", "wall_s"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def seed_ci(scores, se_of_one: Optional[float] = None) -> tuple[float, float]:
    """95% CI of the mean over seeds: a percentile bootstrap over seeds (as rliable does) with two
    or more, else +-1.96 se of the one run's evaluation episodes."""
    from scipy.stats import bootstrap

    scores = np.asarray(scores, dtype=float)
    if scores.size >= 2:
        if np.ptp(scores) == 0:
            return float(scores[0]), float(scores[0])
        ci = bootstrap((scores,), np.mean, method="percentile", n_resamples=10_000,
                       rng=np.random.default_rng(0)).confidence_interval
        return float(ci.low), float(ci.high)
    if scores.size == 1 and se_of_one is not None and se_of_one == se_of_one:
        return float(scores[0] - 1.96 * se_of_one), float(scores[0] + 1.96 * se_of_one)
    return math.nan, math.nan


def summary(frame):
    """Per env: baseline and best mean score over seeds with a 95% CI (`seed_ci`), and the change.
    The latest row of each (env, which, seed) counts."""
    import pandas as pd

    latest = frame.drop_duplicates(["env", "which", "seed"], keep="last")
    out = []
    for env in dict.fromkeys(latest.env):
        record = {"env": env}
        for which in WHICH:
            part = latest[(latest.env == env) & (latest.which == which)]
            scored = part[part.score.notna()]
            low, high = seed_ci(scored.score, float(scored.se.iloc[0]) if len(scored) == 1 else None)
            record[which] = float(scored.score.mean()) if len(scored) else math.nan
            record[f"{which}_low"], record[f"{which}_high"] = low, high
            record[f"{which}_seeds"] = len(scored)
            record[f"{which}_failed"] = int((part.status != "ok").sum())
        base = record["baseline"]
        record["change"] = record["best"] - base
        record["change_pct"] = 100 * record["change"] / abs(base) if base and base == base else math.nan
        out.append(record)
    return pd.DataFrame(out)


def summary_text(frame) -> str:
    table = summary(frame)
    lines = [f"{'env':<18} {'baseline [95% CI]':>26} {'best [95% CI]':>26} {'change':>16}  seeds"]
    for r in table.itertuples():
        failed = r.baseline_failed + r.best_failed
        lines.append(f"{r.env:<18} {_ci(r.baseline, r.baseline_low, r.baseline_high):>26} "
                     f"{_ci(r.best, r.best_low, r.best_high):>26} {_signed(r.change):>9} {_pct(r.change_pct):>6}  "
                     f"{r.baseline_seeds}/{r.best_seeds}" + (f"  ({failed} failed)" if failed else ""))
    return "\n".join(lines)


def _ci(value: float, low: float, high: float) -> str:
    if value != value:
        return "-"
    return f"{value:.1f}" + (f" [{low:.1f}, {high:.1f}]" if low == low else "")


def _signed(value: float) -> str:
    return "-" if value != value else f"{value:+.1f}"


def _pct(value: float) -> str:
    return "" if value != value else f"({value:+.0f}%)"
