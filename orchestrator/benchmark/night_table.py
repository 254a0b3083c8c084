"""The night benchmark's record (bench/nights.py): one NightRow per night, the JSON file a run
rewrites after every night (and a resumed run reads), and the summary table per (problem, searcher,
screen), with the drawn detunes also summed over all their draws."""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[2]


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    values = np.asarray(values, float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return mean, mean - half, mean + half


@dataclass
class NightRow:
    problem: str
    searcher: str
    screen: float | None    # --screen F, None: off
    night: int
    start_rescored: list
    best_rescored: list
    improvement: float
    p_better: float
    significant: bool
    kept: int
    screened: int
    candidates: int
    false_keep: bool
    full_budgets: float
    wall_s: float
    gap_recovered: float | None
    draw: dict | None = None     # a drawn detune: what was drawn and what it cost before the night
    code: str | None = None      # the commit of the code the night ran (a resumed file spans sessions)
    budgets_to_best: float | None = None   # full budgets spent when the final best was kept
    conditions: dict | None = None   # what else ran meanwhile (machine_load.MachineLoad); None before Nov 29
    kept_changes: list | None = None   # each keep: exp, score, change (nights.kept_changes); None in older rows


def load_nights(path: Path) -> tuple[list[NightRow], dict, list[dict], list[dict]]:
    """(night rows, the shipped train.py's rescored means, the draws, the nights that failed)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    return ([NightRow(**r) for r in data.get("nights", [])], data.get("shipped_rescored", {}),
            data.get("draws", []), data.get("failures", []))


def write_json(path: Path, rows: list[NightRow], shipped_scores: dict[str, float], draws: list[dict] = (),
               failures: list[dict] = ()) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    machine = {"cpus": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),   # e.g. under taskset
               "cpu": platform.processor() or platform.machine(), "node": platform.node()}
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    path.write_text(json.dumps({"commit": commit, "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                "machine": machine, "nights": [asdict(r) for r in rows],
                                "summary": summary, "paired": paired_curves(summary),
                                "shipped_rescored": shipped_scores,
                                "draws": list(draws), "failures": list(failures)}, indent=1, default=str))


TARGET_BUDGETS = 16   # the drawn-detune target: >= 80% of the gap within this many full budgets
CURVE_BUDGETS = (8, 12, 16, 24, 32)   # the searchers side by side at equal spending: the gap by each


def gap_by_budgets(group: list[NightRow], budgets: float) -> float | None:
    """The gap the nights had recovered by their `budgets`-th full budget, mean over the nights with a
    gap: a night's final best counts from the budget it was kept at (an earlier, smaller keep is not
    recorded, so this errs low), and a night that ended sooner keeps what it had."""
    recovered = [r for r in group if r.gap_recovered is not None]
    if not recovered:
        return None
    return float(np.mean([r.gap_recovered if r.budgets_to_best is not None and r.budgets_to_best <= budgets
                          else 0.0 for r in recovered]))


def summarize(rows: list[NightRow]) -> list[dict]:
    """One row per (problem, searcher, screen), and per (searcher, screen) over the drawn detunes of
    each env (when they span more than one) and over all of them."""
    out = []
    drawn = [r for r in rows if r.draw]
    env_family = lambda r: f"drawn {r.draw.get('env_id')}"
    families = list(dict.fromkeys(map(env_family, drawn)))
    families = (families if len(families) > 1 else []) + (["drawn (all draws)"] if drawn else [])
    keys = list(dict.fromkeys((r.problem, r.searcher, r.screen) for r in rows))
    keys += [(f, *searcher) for f in families for searcher in dict.fromkeys((r.searcher, r.screen) for r in drawn)]
    for key in keys:
        group = [r for r in rows if (r.problem, r.searcher, r.screen) == key
                 or (r.draw and key[0] in (env_family(r), "drawn (all draws)") and (r.searcher, r.screen) == key[1:])]
        if not group:   # a searcher that has no night on this env's draws (yet)
            continue
        mean, low, high = mean_ci([r.improvement for r in group])
        budgets = sum(r.full_budgets for r in group)
        recovered = [r.gap_recovered for r in group if r.gap_recovered is not None]
        out.append({"problem": key[0], "searcher": key[1], "screen": key[2], "nights": len(group), "improvement": mean,
                    "ci95": [low, high], "significant_nights": sum(r.significant for r in group),
                    "false_keeps": sum(r.false_keep for r in group),
                    "gap_recovered": float(np.mean(recovered)) if recovered else None,
                    "nights_recovering_80pct": sum(r >= 0.8 for r in recovered) if recovered else None,
                    f"nights_recovering_80pct_within_{TARGET_BUDGETS}": sum(
                        r.gap_recovered >= 0.8 and r.budgets_to_best is not None and r.budgets_to_best <= TARGET_BUDGETS
                        for r in group if r.gap_recovered is not None) if recovered else None,
                    # the searchers side by side at equal spending (see gap_by_budgets)
                    f"gap_recovered_by_{TARGET_BUDGETS}_budgets": gap_by_budgets(group, TARGET_BUDGETS),
                    "gap_recovered_by_budgets": {str(b): gap_by_budgets(group, b) for b in CURVE_BUDGETS},
                    # scale-free, so a family of envs adds up: the gap recovered per full budget spent
                    "gap_recovered_per_budget": sum(recovered) / budgets if recovered and budgets else None,
                    "full_budgets": budgets, "improvement_per_budget": sum(r.improvement for r in group) / budgets,
                    "candidates": sum(r.candidates for r in group), "wall_min": sum(r.wall_s for r in group) / 60,
                    "candidates_per_hour": sum(r.candidates for r in group) / max(sum(r.wall_s for r in group), 1) * 3600,
                    "improvement_per_hour": sum(r.improvement for r in group) / max(sum(r.wall_s for r in group), 1) * 3600})
    return out


def print_table(summary: list[dict]) -> None:
    print("\n| problem | searcher | screen | nights | improvement (95% CI) | significant | false keeps | gap recovered "
          f"| nights >= 80% (within {TARGET_BUDGETS} budgets) | gap by {TARGET_BUDGETS} budgets | budgets | per budget "
          "| gap per budget | candidates/h "
          "| per hour | wall min |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        low, high = s["ci95"]
        ci = f"{s['improvement']:+.1f}" + (f" ({low:+.1f}, {high:+.1f})" if low == low else "")
        gap = f"{100 * s['gap_recovered']:.0f}%" if s["gap_recovered"] is not None else "-"
        target = s.get(f"nights_recovering_80pct_within_{TARGET_BUDGETS}")
        within = f"{s['nights_recovering_80pct']} ({target if target is not None else '-'})" \
            if s["gap_recovered"] is not None else "-"
        per_budget = f"{100 * s['gap_recovered_per_budget']:.1f}%" if s.get("gap_recovered_per_budget") is not None else "-"
        by_target = s.get(f"gap_recovered_by_{TARGET_BUDGETS}_budgets")
        by_target = f"{100 * by_target:.0f}%" if by_target is not None else "-"
        print(f"| {s['problem']} | {s['searcher']} | {s['screen'] or 'off'} | {s['nights']} | {ci} | {s['significant_nights']} | "
              f"{s['false_keeps']} | {gap} | {within} | {by_target} | "
              f"{s['full_budgets']:.1f} | {s['improvement_per_budget']:+.2f} | {per_budget} | "
              f"{s['candidates_per_hour']:.0f} | {s['improvement_per_hour']:+.1f} | {s['wall_min']:.1f} |")


def print_budget_curve(summary: list[dict]) -> None:
    """The drawn families' gap recovered by each of CURVE_BUDGETS full budgets, searchers side by side."""
    rows = [s for s in summary if s["problem"].startswith("drawn ") and s.get("gap_recovered_by_budgets")]
    if not rows:
        return
    print("\n| draws | searcher | nights | " + " | ".join(f"gap by {b} budgets" for b in CURVE_BUDGETS) + " |")
    print("|---|---|---|" + "---|" * len(CURVE_BUDGETS))
    for s in rows:
        curve = s["gap_recovered_by_budgets"]
        cells = [f"{100 * curve[str(b)]:.0f}%" if curve.get(str(b)) is not None else "-" for b in CURVE_BUDGETS]
        print(f"| {s['problem'][len('drawn '):]} | {s['searcher']} | {s['nights']} | " + " | ".join(cells) + " |")


def paired_curves(summary: list[dict], first: str = "optuna", second: str = "random") -> dict | None:
    """`first` against `second` on the same draws, at equal spending: per draw, the mean of the gap
    recovered by each of CURVE_BUDGETS full budgets (the area under the curve, scale-free), first's
    minus second's; the mean difference over the draws both searched, its 95% CI (paired t), and the
    draws each one led. None when no draw has both."""
    def area(s):
        curve = s.get("gap_recovered_by_budgets") or {}
        values = [curve.get(str(b)) for b in CURVE_BUDGETS]
        return None if any(v is None for v in values) else float(np.mean(values))
    draws = {}
    for s in summary:
        if s["problem"].startswith("drawn-") and s["searcher"] in (first, second) and not s["screen"]:
            draws.setdefault(s["problem"], {})[s["searcher"]] = area(s)
    differences = [d[first] - d[second] for d in draws.values()
                   if d.get(first) is not None and d.get(second) is not None]
    if not differences:
        return None
    mean, low, high = mean_ci(differences)
    return {"searchers": [first, second], "draws": len(differences), "mean_difference": mean, "ci95": [low, high],
            "led": [sum(d > 0 for d in differences), sum(d < 0 for d in differences)],
            "p_first_ahead": float(stats.ttest_1samp(differences, 0.0, alternative="greater").pvalue)
            if len(differences) > 1 and np.std(differences) > 0 else None}


def print_paired_curves(summary: list[dict]) -> None:
    paired = paired_curves(summary)
    if paired is None:
        return
    first, second = paired["searchers"]
    low, high = paired["ci95"]
    p = paired["p_first_ahead"]
    print(f"\n{first} against {second} on the same {paired['draws']} draws, the gap by "
          f"{', '.join(map(str, CURVE_BUDGETS))} budgets averaged: {100 * paired['mean_difference']:+.1f} points "
          f"(95% CI {100 * low:+.1f} to {100 * high:+.1f}; one-sided paired t p {p if p is None else round(p, 3)}); "
          f"{first} ahead on {paired['led'][0]} draws, {second} on {paired['led'][1]}")
