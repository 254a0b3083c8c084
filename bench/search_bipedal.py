"""The offline search from the shipped baseline: a real night in miniature on BipedalWalker-v3.

    python -m bench.search_bipedal [--env BipedalWalker-v3] [--budget 60] [--experiments 8]
                                   [--tag TAG] [--here] [--keep]

Runs `python -m orchestrator run --env ENV --budget B --max-experiments N --agent optuna` in a
temporary clone of this checkout's HEAD (committed code only; `--here` runs in this checkout's
results/ instead), then reads results.tsv and prints: the baseline (mean of its two runs), each
experiment's score and what it changed, how many experiments score within 20% of the baseline
(and how many not more than 20% below it), and the best experiment against the baseline (and
against the better of its two runs); then one JSON line with the figures. It takes about
(2 + N * 1.5) budgets plus evaluation (~15-25 minutes at the defaults on 2 cores).
`--summarize RUN_DIR` prints the figures of a finished run folder.

`--null-runs K` then retrains the unchanged baseline K more times (seeds 3, 4, ...; scored by the
harness with the run's held-out seed) and counts them against the same 20% band, side by side:
how often the baseline itself lands there is the ceiling of the first target at this budget on
this machine (each adds one budget plus evaluation).

Targets (issue 14): at least half of the experiments within 20% of the baseline; the best
beats the baseline.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from orchestrator.benchmark.rescoring import embedded_agent_env

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="BipedalWalker-v3")
    parser.add_argument("--budget", type=float, default=60)
    parser.add_argument("--experiments", type=int, default=8)
    parser.add_argument("--tag", default=None)
    parser.add_argument("--here", action="store_true", help="run in this checkout (results/<tag>/) instead of a clone")
    parser.add_argument("--keep", action="store_true", help="keep the temporary clone")
    parser.add_argument("--extra", default="", help="more `run` options, e.g. '--eval-workers 1'")
    parser.add_argument("--summarize", metavar="RUN_DIR", help="only print the figures of a finished run folder")
    parser.add_argument("--null-runs", type=int, default=0, help="retrain the unchanged baseline K more times")
    args = parser.parse_args()
    if args.summarize:
        rows = pd.read_csv(Path(args.summarize) / "results.tsv", sep="\t", dtype={"commit": str})
        figures = summarize(rows)
        figures.update(tag=Path(args.summarize).name, wall_s="-")
        print_table(rows, figures)
        print(json.dumps(figures))
        return 0

    tag = args.tag or f"search-{args.env.split('-')[0].lower()}-{time.strftime('%m%d-%H%M%S')}"
    if args.here:
        root, scratch = REPO, None
    else:
        scratch = Path(tempfile.mkdtemp(prefix="autorl-search-"))
        root = scratch / "autorl"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(root)], check=True)
    env = embedded_agent_env()
    command = [sys.executable, "-m", "orchestrator", "run", "--env", args.env, "--budget", f"{args.budget:g}",
               "--max-experiments", str(args.experiments), "--tag", tag, "--agent", "optuna", *args.extra.split()]
    print("$", " ".join(command[1:]), f"  (in {root})", flush=True)
    started = time.time()
    run = subprocess.run(command, cwd=root, env=env)
    wall = time.time() - started
    results = root / "results" / tag / "results.tsv"
    if not results.exists():
        print(f"no results.tsv (exit {run.returncode})", file=sys.stderr)
        return 1
    rows = pd.read_csv(results, sep="\t", dtype={"commit": str})
    figures = summarize(rows)
    figures.update(env=args.env, budget_s=args.budget, tag=tag, wall_s=round(wall), exit=run.returncode)
    print_table(rows, figures)
    if args.null_runs:
        figures.update(null_runs(root, root / "results" / tag, args, figures["baseline"]))
    print(json.dumps(figures))
    if scratch is not None and not args.keep:
        kept = REPO / "results" / tag  # the run folder is worth keeping; the clone is not
        if not kept.exists():
            shutil.copytree(root / "results" / tag, kept, ignore=shutil.ignore_patterns("out", "*.pt"))
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"run folder copied to {kept}")
    return 0 if run.returncode == 0 else 1


def null_runs(root: Path, run_dir: Path, args, baseline: float) -> dict:
    """The shipped train.py retrained with seeds 3, 4, ... (bench/baseline.py in the run's clone,
    evaluated with the run's held-out seed): the same band as the experiments, for the baseline."""
    eval_seed = json.loads((run_dir / "run.json").read_text())["eval_seed"]
    scores = []
    for seed in range(3, 3 + args.null_runs):
        done = subprocess.run([sys.executable, "-m", "bench.baseline", args.env, f"{args.budget:g}", "--seed", str(seed),
                               "--eval-seed", str(eval_seed)], cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"null run seed {seed} failed: {done.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        scores.append(round(result["mean"], 3))
        print(f"baseline again, seed {seed}: {result['mean']:.1f} ({result['env_steps']} steps, {result['sps']:.0f} sps)",
              flush=True)
    within, not_worse = in_band(pd.Series(scores, dtype=float), baseline)
    print(f"the unchanged baseline: within 20% {within} of {len(scores)}; not more than 20% below {not_worse}")
    return {"null_scores": scores, "null_within_20pct": within, "null_not_below_80pct": not_worse}


def in_band(scores: pd.Series, baseline: float) -> tuple[int, int]:
    """How many scores are within 20% of the baseline, and how many not more than 20% below it."""
    band = 0.2 * abs(baseline)
    return int(((scores - baseline).abs() <= band).sum()), int((scores >= baseline - band).sum())


def summarize(rows: pd.DataFrame) -> dict:
    baseline_rows = rows[(rows["exp"] == 0) & (rows["status"] == "baseline")]
    baseline = float(baseline_rows["score"].mean())
    experiments = rows[rows["exp"] > 0]
    scores = experiments["score"].dropna()
    within, not_worse = in_band(scores, baseline)
    best = float(scores.max()) if len(scores) else None
    return {"baseline": round(baseline, 3), "baseline_runs": [round(float(s), 3) for s in baseline_rows["score"]],
            "experiments": int(len(experiments)), "scored": int(len(scores)), "within_20pct": within,
            "not_below_80pct": not_worse, "best_baseline_run": round(float(baseline_rows["score"].max()), 3),
            "best": None if best is None else round(best, 3),
            "best_beats_baseline": bool(best is not None and best > baseline),
            "kept": int((experiments["status"] == "keep").sum()),
            "statuses": experiments["status"].value_counts().to_dict()}


def print_table(rows: pd.DataFrame, f: dict) -> None:
    print()
    print(f"baseline        {f['baseline']:.1f}  (runs {', '.join(f'{s:.1f}' for s in f['baseline_runs'])})")
    for _, row in rows[rows["exp"] > 0].iterrows():
        score = "-" if pd.isna(row["score"]) else f"{row['score']:.1f}"
        print(f"exp {row['exp']:<3d} {row['status']:<9s} {score:>7s}  {str(row['description'])[:150]}")
    print(f"within 20% of the baseline: {f['within_20pct']} of {f['experiments']}; "
          f"not more than 20% below it: {f['not_below_80pct']}")
    best = "-" if f["best"] is None else f"{f['best']:.1f}"
    print(f"best {best} vs baseline {f['baseline']:.1f}: {'beats' if f['best_beats_baseline'] else 'does not beat'} it")
    beats_both = f["best"] is not None and f["best"] > f["best_baseline_run"]
    print(f"best vs the better baseline run {f['best_baseline_run']:.1f}: {'beats' if beats_both else 'does not beat'} it")
    print(f"kept {f['kept']}; wall {f['wall_s']} s")


if __name__ == "__main__":
    sys.exit(main())
