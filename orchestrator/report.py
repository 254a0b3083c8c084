"""The morning report of a run: a terminal summary, `progress.png` and a self-contained `report.html`.

Everything comes from the run folder (results.tsv read through its torn-line-tolerant reader,
then pandas; eval.json per scored run; diff.patch of kept experiments; failure.txt;
translate.json; transfer.tsv/png when `transfer` ran). The baseline-to-best gain carries a 95%
bootstrap CI of the difference of mean episode returns, computed from the per-episode returns
of the trusted harness. `refresh(run_dir)` rewrites the files; it never raises (the loop calls
it after every row). Charts are drawn with matplotlib's object API (no pyplot, no GUI backend).
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import numpy as np

from .daemon import lock_holder, log
from .inflight import recorded
from .results import ExpFolder, ResultsFile, RunFolder

FAILED = ("crash", "timeout", "invalid", "interrupted")
MAX_KEPT_LINES = 20                   # of the terminal summary
CONFIDENCE = 0.95
RESAMPLES = 10_000
COLORS = {"baseline": "#222222", "keep": "#1a9850", "discard": "#8c96a8", "failed": "#d73027",
          "translate": "#7b3294", "best": "#1a9850", "band": "#fdae61", "start": "#4575b4"}


# ---------------------------------------------------------------- statistics
def iqm(values) -> float:
    """Interquartile mean: the mean of the middle 50% (scipy's trim_mean, as the harness computes it)."""
    from scipy.stats import trim_mean

    values = np.asarray(values, dtype=float)
    return float(trim_mean(values, 0.25)) if values.size else math.nan


def diff_ci(before, after, confidence: float = CONFIDENCE, n_resamples: int = RESAMPLES,
            seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(after) - mean(before), episodes resampled independently
    within each sample (scipy.stats.bootstrap). (nan, nan) when a sample has < 2 episodes."""
    from scipy.stats import bootstrap

    a, b = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan

    def difference(x, y, axis=-1):
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate samples (every episode 500.0) are fine here
        result = bootstrap((b, a), difference, vectorized=True, paired=False, confidence_level=confidence,
                           n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return float(low), float(high)


# ---------------------------------------------------------------- what a run folder holds
@dataclass
class Sample:
    """Per-episode returns of one or more scored runs of the same commit (pooled)."""
    label: str
    exp: Optional[int]
    returns: np.ndarray
    runs: int

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

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.run_dir)

    @property
    def tag(self) -> str:
        return self.run_dir.name

    @property
    def noise(self) -> float:
        return self.noise_and_source[0]

    @cached_property
    def noise_and_source(self) -> tuple[float, str]:
        """The seed-to-seed noise (sigma) of a run's score as the keep rule measures it: from the
        latest train experiment's decision.json (every same-code pair of the night so far), else
        from the baseline pair alone."""
        from .keep_rule import ScoredRun, estimate

        trained = self.rows[(self.rows.phase == "train") & (self.rows.exp > 0)]
        for exp in reversed(list(dict.fromkeys(trained.exp))):
            noise = _read_json(self.folder.exp(int(exp)).decision).get("noise")
            if isinstance(noise, dict) and noise.get("sigma") is not None:
                return float(noise["sigma"]), f"keep rule, {noise.get('df', '?')} pair(s)"
        runs = []
        for i, score in enumerate(self.rows.loc[(self.rows.exp == 0) & (self.rows.status == "baseline"), "score"]):
            se = _read_json(self.folder.exp(0).run(i + 1).eval_json).get("se") or 0.0
            runs.append(ScoredRun("baseline", i, float(score), float(se)))
        if len(runs) < 2:
            return math.nan, "no pair yet"
        return estimate(runs).sigma, "keep rule, the baseline pair"

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
        """95% bootstrap CI of best minus baseline, over episodes."""
        if self.baseline is None or self.best is None:
            return math.nan, math.nan
        return diff_ci(self.baseline.returns, self.best.returns)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _returns(folder: ExpFolder) -> Optional[np.ndarray]:
    data = _read_json(folder.eval_json)
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
    return Sample(label, exp, np.concatenate(parts), len(parts))


def load(run_dir: Path) -> Night:
    import pandas as pd

    run_dir = Path(run_dir)
    folder = RunFolder(run_dir)
    config = _read_json(folder.config)
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
    start = _parse_time(config.get("created")) or (_parse_time(rows[0].time) if rows else None)
    frame["t_hours"] = [(_parse_time(r.time) - start) / 3600 if start and _parse_time(r.time) else math.nan
                        for r in rows]
    night = Night(run_dir, config, frame)

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
            night.translations.append({**vars(row), **_read_json(folder.exp(row.exp).translate)})
    night.pid = lock_holder(run_dir)
    night.in_flight = recorded(run_dir) if night.pid else []
    if folder.transfer_tsv.exists():
        try:
            night.transfer = pd.read_csv(folder.transfer_tsv, sep="\t", dtype={"commit": str})
        except (ValueError, OSError):
            night.transfer = None
    return night


def _parse_time(text: Optional[str]) -> Optional[float]:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


# ---------------------------------------------------------------- the terminal summary
def _num(value, spec: str = ".1f", signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, ("+" if signed else "") + spec)


def _status_counts(night: Night) -> str:
    experiments = night.rows[night.rows.exp > 0]
    last = experiments.drop_duplicates("exp", keep="last")
    counts = last.status.value_counts()
    order = ["keep", "discard", "baseline", *FAILED]
    parts = [f"{status} {counts[status]}" for status in order if status in counts]
    noun = "experiment" if len(last) == 1 else "experiments"
    return f"{len(last)} {noun} after the baseline" + (f": {', '.join(parts)}" if parts else "")


def _hours(night: Night) -> float:
    start = _parse_time(night.config.get("created"))
    if start is None:
        return math.nan
    end = time.time() if night.pid else (_parse_time(night.rows.time.iloc[-1]) if len(night.rows) else start)
    return max(0.0, ((end or start) - start) / 3600)


def _kept(night: Night):
    return night.rows[(night.rows.status == "keep") | ((night.rows.status == "baseline") & (night.rows.exp > 0))]


def _state_line(night: Night) -> str:
    if not night.pid:
        return "not running"
    return f"running (pid {night.pid})"


def _in_flight_lines(night: Night) -> list[str]:
    if not night.pid:
        return ["in flight: nothing (the daemon is not running)"]
    if not night.in_flight:
        return ["in flight: nothing (between experiments)"]
    now = time.time()
    return [f"in flight: exp {r['exp']} ({r.get('phase')}, {r.get('stage')}) for "
            f"{now - r.get('started', now):.0f}s" for r in night.in_flight]


def summary_text(night: Night) -> str:
    c, rows = night.config, night.rows
    lines = [f"{night.tag}: {c.get('env_id', '?')}, {c.get('agent', '?')} agent, budget {c.get('budget_s', 0):g}s, "
             f"{c.get('eval_episodes', '?')} eval episodes; {_state_line(night)}"]
    if night.baseline_score == night.baseline_score:  # not nan
        base = night.baseline
        iqm_text = _num(base.iqm if base else None, ".2f")
        lines.append(f"  baseline {_num(night.baseline_score, '.2f'):>10}   IQM {iqm_text}"
                     f"   ({base.runs if base else 0} seeds x {c.get('eval_episodes', '?')} episodes; "
                     f"seed-to-seed noise sigma {_num(night.noise, '.2f')}, {night.noise_and_source[1]})")
    else:
        lines.append("  baseline   not measured yet")
    if night.best_row is not None and night.best_row["exp"] > 0:
        b = night.best_row
        low, high = night.ci
        iqm_text = _num(night.best.iqm if night.best else None, ".2f")
        lines.append(f"  best     {_num(b['score'], '.2f'):>10}   IQM {iqm_text}   exp {b['exp']}, "
                     f"commit {b['commit']}")
        lines.append(f"  gain     {_num(night.gain, '.2f', True):>10}   95% CI [{_num(low, '.2f', True)}, "
                     f"{_num(high, '.2f', True)}] (bootstrap over episodes, difference of means)")
    elif night.best_row is not None:
        lines.append("  best       the baseline (no experiment has beaten it yet)")
    kept = _kept(night)
    if len(kept):
        lines.append("  kept, in order:")
        previous = night.baseline_score
        for i, (_, row) in enumerate(kept.iterrows()):
            delta = "" if row.score != row.score else f" ({_num(row.score - previous, '.2f', True)})"
            score = "" if row.score != row.score else _num(row.score, ".2f")
            if row.score == row.score:
                previous = row.score
            if i < len(kept) - MAX_KEPT_LINES:
                if i == 0:
                    lines.append(f"    ... {len(kept) - MAX_KEPT_LINES} earlier (all in report.html)")
                continue
            lines.append(f"    exp {row.exp:>3} {row.phase:<9} {score:>9}{delta:<11} {_short(row.description, 90)}")
    lines.append("  " + _status_counts(night))
    lines.append(f"  env steps/s {_sps_line(night)}; {_num(_hours(night), '.2f')} h; "
                 f"cost ${rows.cost_usd.sum():.2f}")
    lines += ["  " + line for line in _in_flight_lines(night)]
    return "\n".join(lines)


def _sps_line(night: Night) -> str:
    trained = night.rows[(night.rows.phase == "train") & night.rows.sps.notna()]
    if trained.empty:
        return "-"
    base = trained[trained.exp == 0].sps.mean()
    best = night.best_row.get("sps") if night.best_row else None
    median = trained.sps.median()
    text = f"median {median:,.0f}"
    if base == base and best:
        text = f"baseline {base:,.0f} -> best {best:,.0f} ({text})"
    return text


def _short(text: str, width: int) -> str:
    text = str(text)
    return text if len(text) <= width else text[:width - 1] + "…"


# ---------------------------------------------------------------- charts
def _figure(width: float, height: float, **margins):
    """A figure with fixed margins (a layout engine would cost most of the report's time)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    fig.subplots_adjust(**{"left": 0.07, "right": 0.98, "bottom": 0.13, "top": 0.88, "wspace": 0.22, **margins})
    return fig


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def progress_png(night: Night) -> bytes:
    """Every experiment as a point, the running best as a step line, kept ones annotated."""
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    rows = night.rows
    fig = _figure(11, 5.6, left=0.075, right=0.80, bottom=0.1, top=0.93)
    ax = fig.add_subplot()
    strip = blended_transform_factory(ax.transData, ax.transAxes)
    base = night.baseline_score
    train = rows[rows.score.notna()]
    low, high = _score_range(train, base)
    if base == base:
        noise = night.noise if night.noise == night.noise else 0.0
        ax.axhspan(base - noise, base + noise, color=COLORS["band"], alpha=0.25, lw=0)
        ax.axhline(base, color=COLORS["band"], lw=1, ls="--")
    shown = train[train.score >= low] if low is not None else train
    below = train[train.score < low] if low is not None else train.iloc[:0]
    discard = shown[shown.status == "discard"]
    ax.scatter(discard.exp, discard.score, s=28, facecolors="none", edgecolors=COLORS["discard"], lw=1.2, zorder=3)
    ax.scatter(below.exp, [0.08] * len(below), transform=strip, marker="v", s=28, facecolors="none",
               edgecolors=COLORS["discard"], lw=1.2, zorder=3, clip_on=False)
    baseline = train[train.status == "baseline"]
    ax.scatter(baseline.exp, baseline.score, s=36, marker="s", color=COLORS["baseline"], zorder=4)
    keep = train[train.status == "keep"]
    ax.scatter(keep.exp, keep.score, s=70, color=COLORS["keep"], edgecolors="white", lw=0.8, zorder=5)
    failed = rows[rows.status.isin(FAILED) & (rows.phase != "translate")]
    ax.scatter(failed.exp, [0.03] * len(failed), transform=strip, marker="x", color=COLORS["failed"], s=36,
               zorder=4, clip_on=False)
    translate = rows[rows.phase == "translate"]
    for kept, part in ((True, translate[translate.status == "keep"]), (False, translate[translate.status != "keep"])):
        ax.scatter(part.exp, [0.96] * len(part), transform=strip, marker="D", s=40 if kept else 26, clip_on=False,
                   facecolors=COLORS["translate"] if kept else "none", edgecolors=COLORS["translate"], zorder=4)
    if len(night.translations):
        ax.vlines([t["exp"] for t in night.translations], 0, 1, transform=strip, color=COLORS["translate"],
                  lw=0.8, ls=":", zorder=1)
    steps = rows[rows.best.notna()].drop_duplicates("exp", keep="last")
    if len(steps):
        xs = list(steps.exp) + [max(rows.exp.max(), steps.exp.max()) + 0.5]
        ys = list(steps.best) + [steps.best.iloc[-1]]
        ax.step(xs, ys, where="post", color=COLORS["best"], lw=1.8, zorder=2)
    if low is not None:
        ax.set_ylim(low, high)
    ax.set_xlim(-0.6, max(rows.exp.max() if len(rows) else 1, 1) + 0.8)
    for t in night.translations:  # along the dotted line of a kept translation: its speed-up
        speed = t.get("speedup")
        ax.annotate(f"exp {t['exp']}" + (f": {speed:.1f}x faster env" if speed else ": kept translation"),
                    (t["exp"], 0.93), xycoords=strip, xytext=(3, 0), textcoords="offset points", rotation=90,
                    fontsize=7.5, color=COLORS["translate"], ha="left", va="top")
    _label_kept(fig, ax, rows, night.baseline_score)
    ax.set_xlabel("experiment")
    episodes = night.config.get("eval_episodes", "?")
    ax.set_ylabel(f"mean eval return ({episodes} episodes)")
    ax.grid(alpha=0.25)
    ax.spines[["top", "right"]].set_visible(False)
    title = f"{night.tag} · {night.config.get('env_id', '')}"
    if night.best_row is not None and night.best_row["exp"] > 0 and night.gain == night.gain:
        title += f" · best {night.best_row['score']:.1f} ({night.gain:+.1f} vs baseline {base:.1f})"
    ax.set_title(title, loc="left", fontsize=11)
    handles = [
        Line2D([], [], marker="s", ls="", color=COLORS["baseline"], label="baseline runs"),
        Line2D([], [], marker="o", ls="", color=COLORS["keep"], markersize=8, label="kept"),
        Line2D([], [], marker="o", ls="", mfc="none", color=COLORS["discard"], label="discarded"),
        Line2D([], [], color=COLORS["best"], lw=1.8, label="running best"),
        Line2D([], [], color=COLORS["band"], lw=6, alpha=0.4, label="baseline ± seed noise σ"),
    ]
    if len(below):
        handles.append(Line2D([], [], marker="v", ls="", mfc="none", color=COLORS["discard"],
                              label=f"discarded, below {low:.4g}"))
    if len(failed):
        handles.append(Line2D([], [], marker="x", ls="", color=COLORS["failed"], label="no score (crash, timeout,\n"
                                                                                         "invalid, interrupted)"))
    if len(translate):
        handles.append(Line2D([], [], marker="D", ls="", color=COLORS["translate"], label="translate (filled: kept)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8.5)
    return _png(fig)


def _score_range(train, baseline: float) -> tuple[Optional[float], Optional[float]]:
    """The y range: every score, unless a few far-off failures would squash the rest; then from a
    little below the lower of the baseline and the 20th percentile (the others drawn at the edge)."""
    if train.empty:
        return None, None
    scores = train.score.to_numpy(dtype=float)
    top, bottom = float(scores.max()), float(scores.min())
    core = min(float(np.percentile(scores, 20)), baseline if baseline == baseline else top,
               float(train[train.status.isin(["baseline", "keep"])].score.min()) if
               train.status.isin(["baseline", "keep"]).any() else top)
    if top - core > 0 and core - bottom > 1.0 * (top - core):
        bottom = core - 0.25 * (top - core)
    span = top - bottom if top > bottom else max(1.0, abs(top) * 0.1)
    return bottom - 0.12 * span, top + 0.14 * span


MAX_LABELS = 12
LABEL_OFFSETS = [(8, -16), (8, -30), (-8, 10), (8, 12), (8, -44), (-8, -16), (-8, 24), (8, 26), (8, -58),
                 (-8, -30), (-8, 38), (8, 40)]  # points from the kept experiment, tried in order


def _label_kept(fig, ax, rows, baseline: float) -> None:
    """Annotate kept train experiments with their descriptions: the largest gains first (at most
    MAX_LABELS, always the best), each at the first offset where it overlaps no other label and
    stays inside the axes; one that fits nowhere is left to the table."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    kept = rows[(rows.status == "keep") & rows.score.notna()]
    if kept.empty:
        return
    previous = [baseline] + list(kept.score[:-1])
    gains = kept.score.to_numpy() - np.asarray(previous, dtype=float)
    order = sorted(range(len(kept)), key=lambda i: (i != len(kept) - 1, -np.nan_to_num(gains[i], nan=0.0)))
    renderer = FigureCanvasAgg(fig).get_renderer()
    frame = ax.get_window_extent(renderer)
    points = ax.transData.transform(np.column_stack([kept.exp, kept.score]))
    placed = []
    for i in order[:MAX_LABELS]:
        row = kept.iloc[i]
        text = f"{row.exp}: {_short(_plain_description(row.description), 44)}"
        for dx, dy in LABEL_OFFSETS:
            label = ax.annotate(text, (row.exp, row.score), xytext=(dx, dy), textcoords="offset points",
                                fontsize=8, color="#14532d", ha="left" if dx > 0 else "right", va="center",
                                arrowprops=dict(arrowstyle="-", color="#14532d", lw=0.6, alpha=0.6,
                                                shrinkA=0, shrinkB=4),
                                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8), zorder=6)
            box = label.get_window_extent(renderer).expanded(1.04, 1.15)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 + 18 <= box.y0 and box.y1 <= frame.y1 - 22
            covers = any(box.contains(x, y) for j, (x, y) in enumerate(points) if j != i)
            if inside and not covers and not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()


def _plain_description(text: str) -> str:
    """A description without the daemon's bracketed verdict note."""
    text = str(text)
    cut = text.rfind(" [")
    return text[:cut] if cut > 0 and text.endswith("]") else text


def distributions_png(night: Night) -> Optional[bytes]:
    if night.baseline is None:
        return None
    samples = [night.baseline] + ([night.best] if night.best is not None and night.best is not night.baseline
                                  else [])
    colors = [COLORS["start"], COLORS["keep"]]
    fig = _figure(11, 3.6)
    hist, ecdf = fig.subplots(1, 2)
    values = np.concatenate([s.returns for s in samples])
    low, high = float(values.min()), float(values.max())
    bins = np.linspace(low, high if high > low else low + 1, 31)
    for sample, color in zip(samples, colors):
        label = f"{sample.label}: mean {sample.mean:.1f}, IQM {sample.iqm:.1f} (n={sample.returns.size})"
        hist.hist(sample.returns, bins=bins, histtype="stepfilled", alpha=0.35, color=color, label=label)
        hist.axvline(sample.mean, color=color, lw=1.5)
        xs = np.sort(sample.returns)
        ecdf.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", color=color, lw=1.6)
    hist.set_xlabel("episode return")
    hist.set_ylabel("episodes")
    hist.legend(fontsize=8, frameon=False, loc="upper left")
    ecdf.set_xlabel("episode return")
    ecdf.set_ylabel("fraction of episodes ≤ x")
    for ax in (hist, ecdf):
        ax.grid(alpha=0.25)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("evaluation returns per episode: baseline vs best (lines: means)", x=0.01, ha="left",
                 fontsize=10)
    return _png(fig)


def night_png(night: Night) -> Optional[bytes]:
    """Training speed and cumulative cost over the night (hours since the run started)."""
    rows = night.rows[night.rows.t_hours.notna()]
    if rows.empty:
        return None
    fig = _figure(11, 3.4)
    sps_ax, cost_ax = fig.subplots(1, 2)
    trained = rows[(rows.phase == "train") & rows.sps.notna()]
    for status, color in (("baseline", COLORS["baseline"]), ("keep", COLORS["keep"]),
                          ("discard", COLORS["discard"])):
        part = trained[trained.status == status]
        if len(part):
            sps_ax.scatter(part.t_hours, part.sps, s=20, color=color, label=status)
    other = trained[~trained.status.isin(["baseline", "keep", "discard"])]
    if len(other):
        sps_ax.scatter(other.t_hours, other.sps, s=20, marker="x", color=COLORS["failed"], label="failed")
    for t in night.translations:
        hours = rows.loc[rows.exp == t["exp"], "t_hours"]
        if len(hours):
            sps_ax.axvline(hours.iloc[0], color=COLORS["translate"], ls=":", lw=1)
    sps_ax.set_ylabel("train env steps / s")
    sps_ax.set_xlabel("hours since the run started")
    sps_ax.legend(fontsize=7.5, frameon=False)
    cost = rows.cost_usd.cumsum()
    cost_ax.step(list(rows.t_hours), list(cost), where="post", color="#b2182b", lw=1.6)
    cost_ax.set_ylabel("cumulative cost (USD)")
    cost_ax.set_xlabel("hours since the run started")
    for ax in (sps_ax, cost_ax):
        ax.grid(alpha=0.25)
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_ylim(bottom=0)
    if not cost.iloc[-1] > 0:
        cost_ax.set_ylim(0, 1)
    sps_ax.set_title("throughput (dotted: kept translations)", loc="left", fontsize=10)
    cost_ax.set_title(f"cost: ${rows.cost_usd.sum():.2f} (agent + compute)", loc="left", fontsize=10)
    return _png(fig)


# ---------------------------------------------------------------- the HTML page
CSS = """
body{font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1240px;margin:0 auto;padding:20px 28px 60px;background:#fff}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;
padding-bottom:4px}.sub{color:#57606a;margin:0 0 12px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #d0d7de;border-radius:8px;padding:8px 14px;flex:1 1 0;min-width:130px}
.card b{display:block;font-size:20px}.card span{color:#57606a;font-size:12px}
.up{color:#1a7f37}.down{color:#cf222e}img{max-width:100%;height:auto;display:block}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;
text-align:left;vertical-align:top}th{background:#f6f8fa;position:sticky;top:0}td.n{text-align:right;
font-variant-numeric:tabular-nums;white-space:nowrap}
.st{display:inline-block;padding:0 7px;border-radius:10px;font-size:12px;color:#fff;background:#8c96a8}
.st-keep{background:#1a7f37}.st-baseline{background:#24292f}.st-crash,.st-timeout,.st-invalid{background:#cf222e}
.st-interrupted{background:#bf8700}tr.keep td{background:#f0fbf3}tr.failed td{background:#fff6f5}
details{margin:4px 0}summary{cursor:pointer;color:#0969da}
pre{background:#f6f8fa;border:1px solid #eaeef2;border-radius:6px;padding:8px;overflow:auto;max-height:420px;
font:12px/1.35 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre}
.add{color:#116329;background:#e6ffec}.del{color:#82071e;background:#ffebe9}.hunk{color:#8250df}
.muted{color:#57606a}code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
"""


def _img(data: Optional[bytes], alt: str) -> str:
    if not data:
        return ""
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _muted(text: str) -> str:
    return f'<p class="muted">{html.escape(text)}</p>'


def _diff_html(text: str, limit: int = 60_000) -> str:
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text) - limit:,} more characters in diff.patch)"
    out = []
    for line in text.splitlines():
        escaped = html.escape(line)
        if line.startswith("+") and not line.startswith("+++"):
            out.append(f'<span class="add">{escaped}</span>')
        elif line.startswith("-") and not line.startswith("---"):
            out.append(f'<span class="del">{escaped}</span>')
        elif line.startswith("@@"):
            out.append(f'<span class="hunk">{escaped}</span>')
        else:
            out.append(escaped)
    return "<pre>" + "\n".join(out) + "</pre>"


def _tail(path: Path, lines: int = 40, chars: int = 6000) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-chars:]


def _cards(night: Night) -> str:
    cards = []

    def card(value: str, label: str, css: str = "") -> None:
        cards.append(f'<div class="card"><b class="{css}">{html.escape(value)}</b><span>{html.escape(label)}</span>'
                     "</div>")

    base = night.baseline
    card(_num(night.baseline_score, ".2f"), f"baseline (IQM {_num(base.iqm if base else None, '.2f')}; "
                                            f"noise σ {_num(night.noise, '.2f')})")
    if night.best_row is not None and night.best_row["exp"] > 0:
        low, high = night.ci
        card(_num(night.best_row["score"], ".2f"), f"best: exp {night.best_row['exp']} "
                                                   f"(IQM {_num(night.best.iqm if night.best else None, '.2f')})")
        card(_num(night.gain, ".2f", True), f"gain, 95% CI [{_num(low, '.2f', True)}, {_num(high, '.2f', True)}]",
             "up" if night.gain > 0 else "down")
    experiments = night.rows[night.rows.exp > 0].drop_duplicates("exp", keep="last")
    card(str(len(experiments)), f"experiments ({(experiments.status == 'keep').sum()} kept)")
    card(f"{_num(_hours(night), '.2f')} h", "wall clock")
    card(f"${night.rows.cost_usd.sum():.2f}", "cost")
    return '<div class="cards">' + "".join(cards) + "</div>"


def _experiment_rows(night: Night) -> str:
    folder = night.folder
    head = ("<tr><th>exp</th><th>time (UTC)</th><th>phase</th><th>status</th><th>score ± se</th><th>IQM</th>"
            "<th>best</th><th>env steps</th><th>steps/s</th><th>wall s</th><th>cost</th><th>commit</th>"
            "<th>description</th></tr>")
    body = []
    for _, row in night.rows.iterrows():
        failed = row.status in FAILED
        css = "keep" if row.status == "keep" else "failed" if failed else ""
        score = "" if row.score != row.score else f"{row.score:.2f}" + (
            f" ± {row.se:.2f}" if row.se == row.se else "")
        details = ""
        exp_folder = folder.exp(row.exp)
        if row.status == "keep" and exp_folder.diff.exists():
            diff = exp_folder.diff.read_text(encoding="utf-8", errors="replace")
            details += (f"<details><summary>diff ({diff.count(chr(10)):,} lines, "
                        f"exp-{row.exp:04d}/{ExpFolder.DIFF})</summary>{_diff_html(diff)}</details>")
        if failed or (row.status == "discard" and row.phase == "translate"):  # a discarded train run's
            failure = _tail(exp_folder.failure) if exp_folder.failure.exists() else ""  # reason is its score
            if failure:
                details += (f"<details><summary>why ({'failure' if failed else 'verification or benchmark'}, "
                            f"exp-{row.exp:04d}/{ExpFolder.FAILURE})</summary><pre>{html.escape(failure)}</pre>"
                            "</details>")
        time_text = str(row.time)[11:16] if row.time else ""
        body.append(
            f'<tr class="{css}" id="exp-{row.exp}"><td class="n">{row.exp}</td><td>{html.escape(time_text)}</td>'
            f"<td>{html.escape(row.phase)}</td><td><span class=\"st st-{html.escape(row.status)}\">"
            f"{html.escape(row.status)}</span></td><td class=\"n\">{score}</td>"
            f"<td class=\"n\">{_num(row.iqm, '.2f') if row.score == row.score else ''}</td>"
            f"<td class=\"n\">{_num(row.best, '.2f')}</td>"
            f"<td class=\"n\">{'' if row.env_steps != row.env_steps else f'{int(row.env_steps):,}'}</td>"
            f"<td class=\"n\">{'' if row.sps != row.sps else f'{row.sps:,.0f}'}</td>"
            f"<td class=\"n\">{_num(row.wall_s, '.0f')}</td><td class=\"n\">${row.cost_usd:.3f}</td>"
            f"<td><code>{html.escape(str(row.commit))}</code></td>"
            f"<td>{html.escape(str(row.description))}{details}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _translations(night: Night) -> str:
    if not night.translations:
        kind = "no translate experiment ran" if not (night.rows.phase == "translate").any() \
            else "no translation was kept"
        return f'<p class="muted">{kind}.</p>'
    head = ("<tr><th>exp</th><th>commit</th><th>backend</th><th>speed-up vs incumbent</th><th>vs reference</th>"
            "<th>steps/s (at envs)</th><th>description</th></tr>")
    body = []
    for t in night.translations:
        speed = t.get("speedup")
        ratio = t.get("ratio")
        sps = t.get("adapter_sps")
        body.append(
            f"<tr><td class=\"n\">{t['exp']}</td><td><code>{html.escape(str(t.get('commit', '')))}</code></td>"
            f"<td><code>{html.escape(str(t.get('spec', '')))}</code></td>"
            f"<td class=\"n\">{_num(speed, '.2f')}x over {html.escape(str(t.get('incumbent', '?')))}</td>"
            f"<td class=\"n\">{_num(ratio, '.0f')}x</td>"
            f"<td class=\"n\">{'-' if sps is None else f'{sps:,.0f}'} ({t.get('num_envs', '?')})</td>"
            f"<td>{html.escape(str(t.get('description', '')))}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _transfer(night: Night) -> str:
    frame = night.transfer
    if frame is None or frame.empty:
        return ""
    from .transfer import summary

    head = ("<tr><th>env</th><th>baseline [95% CI]</th><th>best [95% CI]</th><th>change</th><th>seeds</th>"
            "<th>failed</th></tr>")
    body = []
    for r in summary(frame).itertuples():
        cells = [f"{_num(getattr(r, w), '.1f')} [{_num(getattr(r, w + '_low'), '.1f')}, "
                 f"{_num(getattr(r, w + '_high'), '.1f')}]" for w in ("baseline", "best")]
        css = "up" if r.change > 0 else "down" if r.change < 0 else ""
        pct = "" if r.change_pct != r.change_pct else f" ({r.change_pct:+.0f}%)"
        body.append(f"<tr><td>{html.escape(r.env)}</td><td class=\"n\">{cells[0]}</td><td class=\"n\">{cells[1]}"
                    f"</td><td class=\"n {css}\">{_num(r.change, '.1f', True)}{pct}</td>"
                    f"<td class=\"n\">{r.baseline_seeds}/{r.best_seeds}</td>"
                    f"<td class=\"n\">{r.baseline_failed + r.best_failed}</td></tr>")
    png = night.folder.transfer_png
    return ("<h2>Transfer to other environments</h2><p class=\"sub\">The run's starting train.py (baseline) and "
            "its best, trained with the same budget and seeds on each environment and scored by the run's harness "
            f"(every cell in <code>{RunFolder.TRANSFER_TSV}</code>). CI: percentile bootstrap over seeds; with one "
            "seed, ±1.96 se over its evaluation episodes.</p>"
            + _img(png.read_bytes() if png.exists() else None, "transfer chart")
            + f"<table>{head}{''.join(body)}</table>")


def html_page(night: Night, progress: bytes, distributions: Optional[bytes], over_night: Optional[bytes]) -> str:
    c = night.config
    written = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    summary = html.escape(summary_text(night))
    kept = _kept(night)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<link rel="icon" href="data:,"><title>autorl · {html.escape(night.tag)}</title><style>{CSS}</style></head>
<body><main>
<h1>{html.escape(night.tag)} <span class="muted">· {html.escape(str(c.get('env_id', '')))}</span></h1>
<p class="sub">{html.escape(str(c.get('agent', '?')))} agent · budget {c.get('budget_s', 0):g} s per experiment ·
{html.escape(str(c.get('eval_episodes', '?')))} evaluation episodes
· runner {html.escape(str(c.get('runner', 'local')))}
· branch <code>{html.escape(str(c.get('branch', '')))}</code> · started {html.escape(str(c.get('created', '?')))}
· {html.escape(_state_line(night))} · written {written}</p>
{_cards(night)}
<h2>Summary</h2><pre>{summary}</pre>
<p class="muted">Gain CI: percentile bootstrap ({RESAMPLES:,} resamples) of the difference of mean episode returns,
best minus baseline, episodes resampled within each; baseline = both seeds' episodes pooled. IQM: mean of the middle
50% of episode returns.</p>
<h2>Progress</h2>{_img(progress, "progress chart")}
<h2>Returns: baseline vs best</h2>{_img(distributions, "return distributions") or _muted("no scored run yet.")}
<h2>Throughput and cost over the night</h2>{_img(over_night, "throughput and cost") or _muted("no rows yet.")}
<h2>Translations kept</h2>{_translations(night)}
{_transfer(night)}
<h2>Experiments ({len(night.rows)} rows; {len(kept)} kept)</h2>
<p class="sub">Kept experiments show their diff; failed ones (and discarded translations) the reason the agent was given.</p>
{_experiment_rows(night)}
</main></body></html>
"""


# ---------------------------------------------------------------- writing
def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write(run_dir: Path) -> Night:
    """Write progress.png and report.html of a run; returns what they were made from."""
    night = load(run_dir)
    progress = progress_png(night)
    page = html_page(night, progress, distributions_png(night), night_png(night))
    folder = night.folder
    _write_atomic(folder.progress_png, progress)
    _write_atomic(folder.report_html, page.encode("utf-8"))
    return night


def refresh(run_dir: Path) -> None:
    """Rewrite the report (after every row, at the end of a run); never raises."""
    try:
        started = time.monotonic()
        write(Path(run_dir))
        elapsed = time.monotonic() - started
        if elapsed > 2.0:
            log.info("report rewritten in %.1fs", elapsed)
    except Exception as exc:  # the night goes on without a fresh report
        log.warning("could not write the report of %s: %s: %s", Path(run_dir).name, type(exc).__name__, exc)


def latest_run(results_root: Path) -> Optional[Path]:
    """The run folder whose results.tsv (or run.json) changed last."""
    candidates = []
    for config in Path(results_root).glob(f"*/{RunFolder.CONFIG}"):
        results = config.parent / RunFolder.RESULTS
        candidates.append(((results if results.exists() else config).stat().st_mtime, config.parent))
    return max(candidates)[1] if candidates else None
