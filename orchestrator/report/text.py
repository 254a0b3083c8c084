"""The terminal summary of a run (what `report` prints and report.html shows under "Summary")."""
from __future__ import annotations

import math
import time

from .night import FAILED, Night, parse_time

MAX_KEPT_LINES = 20                   # of the terminal summary


def num(value, spec: str = ".1f", signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, ("+" if signed else "") + spec)


def _status_counts(night: Night) -> str:
    experiments = night.rows[night.rows.exp > 0]
    last = experiments.drop_duplicates("exp", keep="last")
    counts = last.status.value_counts()
    order = ["keep", "discard", "screened", "baseline", *FAILED]
    parts = [f"{status} {counts[status]}" for status in order if status in counts]
    noun = "experiment" if len(last) == 1 else "experiments"
    return f"{len(last)} {noun} after the baseline" + (f": {', '.join(parts)}" if parts else "")


def hours(night: Night) -> float:
    start = parse_time(night.config.get("created"))
    if start is None:
        return math.nan
    end = time.time() if night.pid else (parse_time(night.rows.time.iloc[-1]) if len(night.rows) else start)
    return max(0.0, ((end or start) - start) / 3600)


def kept(night: Night):
    return night.rows[(night.rows.status == "keep") | ((night.rows.status == "baseline") & (night.rows.exp > 0))]


def state_line(night: Night) -> str:
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
             f"{c.get('eval_episodes', '?')} eval episodes; {state_line(night)}"]
    r = night.rescore
    if r is not None:  # the figure to read first: measured outside the runs that chose the best
        lines.append(f"  out of sample: best - start {r.line()}")
    if night.baseline_score == night.baseline_score:  # not nan
        base = night.baseline
        iqm_text = num(base.iqm if base else None, ".2f")
        lines.append(f"  baseline {num(night.baseline_score, '.2f'):>10}   IQM {iqm_text}"
                     f"   ({base.runs if base else 0} seeds x {c.get('eval_episodes', '?')} episodes; "
                     f"seed-to-seed noise sigma {num(night.noise, '.2f')}, {night.noise_and_source[1]})")
    else:
        lines.append("  baseline   not measured yet")
    if night.best_row is not None and night.best_row["exp"] > 0:
        b = night.best_row
        low, high = night.ci
        iqm_text = num(night.best.iqm if night.best else None, ".2f")
        lines.append(f"  best     {num(b['score'], '.2f'):>10}   IQM {iqm_text}   exp {b['exp']}, "
                     f"commit {b['commit']}")
        lines.append(f"  gain     {num(night.gain, '.2f', True):>10}   95% CI [{num(low, '.2f', True)}, "
                     f"{num(high, '.2f', True)}] (in-sample: on the runs that chose the best, biased up; "
                     "over training seeds, t interval)")
    elif night.best_row is not None:
        lines.append("  best       the baseline (no experiment has beaten it yet)")
    kept_rows = kept(night)
    if len(kept_rows):
        lines.append("  kept, in order:")
        previous = night.baseline_score
        for i, (_, row) in enumerate(kept_rows.iterrows()):
            delta = "" if row.score != row.score else f" ({num(row.score - previous, '.2f', True)})"
            score = "" if row.score != row.score else num(row.score, ".2f")
            if row.score == row.score:
                previous = row.score
            if i < len(kept_rows) - MAX_KEPT_LINES:
                if i == 0:
                    lines.append(f"    ... {len(kept_rows) - MAX_KEPT_LINES} earlier (all in report.html)")
                continue
            lines.append(f"    exp {row.exp:>3} {row.phase:<9} {score:>9}{delta:<11} {short(row.description, 90)}")
    lines.append("  " + _status_counts(night))
    lines.append(f"  env steps/s {_sps_line(night)}; {num(hours(night), '.2f')} h; "
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


def short(text: str, width: int) -> str:
    text = str(text)
    return text if len(text) <= width else text[:width - 1] + "…"
