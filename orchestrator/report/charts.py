"""The report's charts, drawn with matplotlib's object API (no pyplot, no GUI backend)."""
from __future__ import annotations

import io
from typing import Optional

import math

import numpy as np

from .night import FAILED, Night
from .text import short

COLORS = {"baseline": "#222222", "keep": "#1a9850", "discard": "#8c96a8", "failed": "#d73027",
          "translate": "#7b3294", "best": "#1a9850", "band": "#fdae61", "start": "#4575b4"}


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
    screened = rows[rows.status == "screened"]  # scored at the screen's shorter budget: not on this axis
    train = rows[rows.score.notna() & (rows.status != "screened")]
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
    ax.scatter(screened.exp, [0.03] * len(screened), transform=strip, marker="|", color=COLORS["discard"], s=60,
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
    if len(screened):
        handles.append(Line2D([], [], marker="|", ls="", color=COLORS["discard"], markersize=9,
                              label="screened (not promising at\na fraction of the budget)"))
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
        text = f"{row.exp}: {short(_plain_description(row.description), 44)}"
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
    other = trained[~trained.status.isin(["baseline", "keep", "discard", "screened"])]
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


def transfer_png(frame, title: str = "transfer") -> bytes:
    """One panel per env: baseline vs best, mean over seeds with a 95% CI, each seed a dot."""
    from matplotlib.figure import Figure

    from ..transfer_table import WHICH, summary

    table = summary(frame)
    latest = frame.drop_duplicates(["env", "which", "seed"], keep="last")
    n = len(table)
    cols = min(4, max(1, n))
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(2.9 * cols + 0.4, 3.1 * rows + 0.5), dpi=110)
    fig.subplots_adjust(left=0.1 if cols > 1 else 0.2, right=0.97, top=1 - 0.75 / (3.1 * rows + 0.5),
                        bottom=0.08 / rows, wspace=0.45, hspace=0.55)
    colors = {"baseline": "#4575b4", "best": "#1a9850"}
    for i, r in enumerate(table.itertuples()):
        ax = fig.add_subplot(rows, cols, i + 1)
        for x, which in enumerate(WHICH):
            mean, low, high = getattr(r, which), getattr(r, f"{which}_low"), getattr(r, f"{which}_high")
            if mean == mean:
                yerr = [[mean - low], [high - mean]] if low == low else None
                ax.bar(x, mean, width=0.6, color=colors[which], alpha=0.85, yerr=yerr, capsize=5,
                       error_kw={"lw": 1.2})
            seeds = latest[(latest.env == r.env) & (latest.which == which)].score.dropna()
            ax.scatter(np.full(len(seeds), x) + np.linspace(-0.12, 0.12, len(seeds)), seeds, s=12, color="black",
                       zorder=3)
        ax.axhline(0, color="#444", lw=0.6)
        ax.set_xticks([0, 1], ["baseline", "best"])
        ax.set_title(r.env, fontsize=9.5, loc="left")
        if r.change_pct == r.change_pct:
            ax.set_title(f"{r.change_pct:+.0f}%", fontsize=9.5, loc="right",
                         color="#1a7f37" if r.change_pct > 0 else "#cf222e" if r.change_pct < 0 else "#444")
        ax.grid(axis="y", alpha=0.25)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"{title}: mean eval return of the starting vs the best train.py\n"
                 "(whiskers: 95% CI, bootstrap over seeds; one seed: over episodes. dots: seeds)", fontsize=9, x=0.01,
                 ha="left")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


# ---------------------------------------------------------------- learning curves
MAX_KEPT_PANELS = 8


def curves_png(night: Night, curves: list) -> Optional[bytes]:
    """Every train experiment's learning curve, against env steps and against seconds: the baseline
    runs dark, the best green and bold, the other kept ones green, the rest faded."""
    if not curves:
        return None
    best_exp = int(night.best_row["exp"]) if night.best_row is not None else None
    fig = _figure(11, 3.8, bottom=0.15, top=0.9)
    by_steps, by_time = fig.subplots(1, 2)
    for curve in sorted(curves, key=lambda c: (c.exp == best_exp and c.exp > 0, c.status == "keep", c.exp == 0)):
        if curve.exp == best_exp and curve.exp > 0:
            style = dict(color=COLORS["best"], lw=2.2, alpha=1.0, zorder=5)
        elif curve.exp == 0:
            style = dict(color=COLORS["baseline"], lw=1.4, alpha=0.9, zorder=4)
        elif curve.status == "keep":
            style = dict(color=COLORS["keep"], lw=1.0, alpha=0.7, zorder=3)
        else:
            style = dict(color=COLORS["discard"], lw=0.8, alpha=0.3, zorder=2)
        by_steps.plot(curve.steps, curve.returns, **style)
        by_time.plot(curve.seconds, curve.returns, **style)
    by_steps.set_xlabel("env steps")
    by_time.set_xlabel("seconds since train.py started")
    by_steps.set_ylabel("return (recent episodes)")
    for ax in (by_steps, by_time):
        ax.grid(alpha=0.25)
        ax.spines[["top", "right"]].set_visible(False)
    from matplotlib.lines import Line2D

    by_steps.legend(handles=[Line2D([], [], color=COLORS["baseline"], label="baseline runs"),
                             Line2D([], [], color=COLORS["best"], lw=2.2, label="best"),
                             Line2D([], [], color=COLORS["keep"], label="kept"),
                             Line2D([], [], color=COLORS["discard"], alpha=0.5, label="others")],
                    fontsize=7.5, frameon=False, loc="lower right")
    by_steps.set_title("learning curves of the night", loc="left", fontsize=10)
    return _png(fig)


def kept_curves_png(curves: list, incumbent_of) -> Optional[bytes]:
    """Each kept experiment's curve beside the incumbent it beat (the last MAX_KEPT_PANELS)."""
    kept = [c for c in curves if c.status == "keep"][-MAX_KEPT_PANELS:]
    if not kept:
        return None
    columns = min(4, len(kept))
    rows = -(-len(kept) // columns)
    fig = _figure(11, 2.6 * rows, bottom=0.12 / rows, top=1 - 0.1 / rows, hspace=0.55)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, curve in zip(axes, kept):
        before = incumbent_of(curves, curve)
        if before is not None:
            ax.plot(before.steps, before.returns, color=COLORS["baseline"], lw=1.0, label=before.label)
        ax.plot(curve.steps, curve.returns, color=COLORS["keep"], lw=1.6, label=curve.label)
        ax.set_title(f"{curve.label} kept", loc="left", fontsize=9)
        ax.legend(fontsize=7, frameon=False, loc="lower right")
        ax.grid(alpha=0.25)
        ax.tick_params(labelsize=7)
    for ax in axes[len(kept):]:
        ax.set_visible(False)
    return _png(fig)
