"""`python -m orchestrator status`: per run, whether it is running, what is in flight, the best so far."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from .daemon import lock_holder, read_state
from .disk import MIN_FREE_MB, free_mb
from .inflight import recorded
from .results import ResultsFile, RunFolder, summarize
from .shipped import choice_line, saved_choice


def run_status(run_dir: Path) -> list[str]:
    folder = RunFolder(run_dir)
    config = json.loads(folder.config.read_text())
    rows = ResultsFile(folder.results).read()
    summary = summarize(rows)
    pid = lock_holder(run_dir)
    state = read_state(run_dir)
    parallel = config.get("parallel", 1)
    lines = [f"{run_dir.name}: {'running (pid %d)' % pid if pid else 'not running'}; env {config['env_id']}, "
             f"budget {config['budget_s']:g}s, runner {config.get('runner', 'local')}"
             + (f" x{parallel}" if parallel > 1 else "") + f", branch {config['branch']}"]
    records = recorded(run_dir)
    if pid and state.get("waiting"):
        lines.append(f"  {state['waiting']}")
    elif pid and free_mb(run_dir) < MIN_FREE_MB:  # too full for the daemon to have said so in state.json
        lines.append(f"  waiting for disk space on {run_dir} ({free_mb(run_dir):.0f} MB free, {MIN_FREE_MB} MB needed)")
    for record in records if pid else []:
        elapsed = time.time() - record.get("started", time.time())
        lines.append(f"  in flight: exp {record['exp']} ({record.get('phase')}, {record.get('stage')}) "
                     f"for {elapsed:.0f}s" + "".join(modal_call_lines(record)))
    if not pid and records:
        lines.append(f"  exp {', '.join(str(r['exp']) for r in records)} in flight when the daemon died: "
                     "`run --resume` records it and goes on")
    choice = saved_choice(folder)
    if choice:
        lines.append(f"  {choice_line(choice)} (chosen at setup)")
    baseline = ", ".join(f"{s:.3f}" for s in summary["baseline_scores"]) or "-"
    best = "-" if summary["best"] is None else f"{summary['best']:.3f}"
    lines.append(f"  baseline {baseline}; best {best} at commit {summary['best_commit'] or '-'} "
                 f"(exp {summary['best_exp'] if summary['best_exp'] is not None else '-'})")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary["counts"].items())) or "no rows yet"
    lines.append(f"  {summary['experiments']} experiments after the baseline: {counts}; "
                 f"cost ${summary['cost_usd']:.2f}")
    if folder.report_html.exists():
        lines.append(f"  report: {folder.report_html}")
    return lines


def modal_call_lines(record: dict) -> list[str]:
    """'; Modal call fc-... waiting for a GPU for 95s (try 2 of 3)' for each live Modal call of a record."""
    out = []
    for handle in record.get("handles", []):
        if handle.get("kind") != "modal" or handle.get("state") in (None, "ended"):
            continue
        since = f" for {time.time() - handle['since']:.0f}s" if handle.get("since") else ""
        tries = f" (try {handle['try']} of {handle['tries']})" if handle.get("try", 1) > 1 else ""
        out.append(f"; Modal call {handle.get('call_id')} {handle['state']}{since}{tries}")
    return out


def render_status(results_root: Path, tag: Optional[str] = None) -> tuple[str, int]:
    if tag:
        run_dir = results_root / tag
        if not (run_dir / "run.json").exists():
            return f"no run {tag!r} under {results_root}", 1
        run_dirs = [run_dir]
    else:
        run_dirs = sorted((p.parent for p in results_root.glob("*/run.json")),
                          key=lambda d: d.stat().st_mtime)
        if not run_dirs:
            return "\n".join(schedule_lines(results_root) + [f"no runs under {results_root}"]), 0
    lines: list[str] = [] if tag else schedule_lines(results_root)
    for run_dir in run_dirs:
        lines += run_status(run_dir)
    return "\n".join(lines), 0


def schedule_lines(results_root: Path) -> list[str]:
    from .schedule import status_lines

    return status_lines(results_root)
