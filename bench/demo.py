"""`make demo`: a short night from a weakened start, then the start and the night's best rescored.

    python -m bench.demo [--problem pendulum-gamma] [--experiments 2] [--rescore-seeds 2] [--budget S] [--tag TAG]

The start is weakened on purpose, so that a few minutes of night have something to find: it is one
of the night benchmark's detuned problems (bench/nights.py; by default `pendulum-gamma`, Pendulum-v1
at a 15 s budget with candidate/train.py's GAMMA cut from 0.99 to 0.8). That start is committed on
top of this checkout's HEAD without touching the checkout (a commit object only, kept reachable by
the run's branch), and the real daemon runs a night from it in this checkout (`run --from COMMIT`,
the offline optuna agent), so `status`, `report` and `results/<tag>/` are the user's own. Then, as
the night benchmark does, the start and the night's best are each trained again on fresh training
seeds and scored by the harness on fresh evaluation seeds: the gain printed last is not the night's
luckiest run. The verdict goes to results/<tag>/demo.json; the report to results/<tag>/report.html.

A night from the shipped train.py: python -m orchestrator run --env Pendulum-v1 --budget 15
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np

from orchestrator.benchmark.nights import PROBLEMS, TRAIN_PY, better, detuned, git, rescore

REPO = Path(__file__).resolve().parent.parent
DEMO_IDENTITY = ("-c", "user.name=autorl demo", "-c", "user.email=demo@localhost")
# The allowance past the budget (--grace; a night's default is max(10 s, 5%)). On a busy machine
# (measured at load 5-7 on 2 cores) start-up and JAX's compile alone took 15-20 s of a 15 s budget, and
# a baseline that overruns its allowance ends the night before it begins; every run of the demo gets
# the same larger allowance, so the comparison stays fair (train.py still stops updating at its budget).
DEMO_GRACE_S = 15


def weakened_start(repo: Path, problem_name: str) -> str:
    """A commit on top of HEAD whose train.py carries the problem's detune; HEAD, the index and the
    files of the checkout are left as they are (the commit is built through a scratch index)."""
    problem = PROBLEMS[problem_name]
    text = detuned(git(repo, "show", f"HEAD:{TRAIN_PY}") + "\n", problem.detune)
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input=text, text=True,
                          capture_output=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        index = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        for args in (["read-tree", "HEAD"], ["update-index", "--cacheinfo", f"100644,{blob},{TRAIN_PY}"]):
            subprocess.run(["git", *args], cwd=repo, env=index, check=True, capture_output=True)
        tree = subprocess.run(["git", "write-tree"], cwd=repo, env=index, check=True, capture_output=True,
                              text=True).stdout.strip()
    changed = ", ".join(f"{name} = {value!r}" for name, value in problem.detune.items())
    message = f"demo start, weakened on purpose ({problem.name}): {changed}; {problem.why}"
    return git(repo, *DEMO_IDENTITY, "commit-tree", tree, "-p", "HEAD", "-m", message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="pendulum-gamma", choices=[n for n, p in PROBLEMS.items() if p.detune],
                        help="the night benchmark's detuned problem to start from (default pendulum-gamma)")
    parser.add_argument("--experiments", type=int, default=2, help="experiments after the baselines (default 2)")
    parser.add_argument("--rescore-seeds", type=int, default=2, help="fresh training seeds per rescoring (default 2)")
    parser.add_argument("--tag", help="the run's tag (default demo-<problem>-<mmdd-HHMMSS>)")
    parser.add_argument("--budget", type=float, metavar="S",
                        help="seconds per experiment (default: the problem's, 15 for pendulum-gamma); a busy machine "
                             "needs more: start-up and JAX's compile come out of it")
    args = parser.parse_args(argv)
    problem = PROBLEMS[args.problem]
    if args.budget:
        problem = replace(problem, budget_s=args.budget)
    tag = args.tag or f"demo-{problem.name}-{datetime.now():%m%d-%H%M%S}"
    changed = ", ".join(f"{name} {value!r}" for name, value in problem.detune.items())
    print(f"demo: a {args.experiments}-experiment night on {problem.env_id} ({problem.budget_s:g} s per experiment) "
          f"from a start WEAKENED ON PURPOSE: the night benchmark's `{problem.name}` ({changed}; {problem.why}).\n"
          f"      A night from the shipped train.py instead: "
          f"python -m orchestrator run --env {problem.env_id} --budget {problem.budget_s:g}\n", flush=True)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        print(f"demo: note: this machine is busy (load {load:.1f} on {cores} cores): each run trains fewer steps "
              "in its budget than on a quiet machine, so the night may find less and take longer\n", flush=True)
    started = time.monotonic()
    start = weakened_start(REPO, problem.name)
    night = subprocess.run([sys.executable, "-m", "orchestrator", "run", "--env", problem.env_id,
                            "--budget", f"{problem.budget_s:g}", "--tag", tag, "--from", start,
                            "--agent", "optuna", "--phases", "train", "--max-experiments", str(args.experiments),
                            "--rescore", "0",  # rescored below, on 100 fresh evaluation episodes
                            "--grace", str(DEMO_GRACE_S),
                            *problem.run_args], cwd=REPO)
    if night.returncode != 0:
        print(f"demo: the night failed (exit {night.returncode}); see results/{tag}/daemon.log", file=sys.stderr)
        return night.returncode
    run_dir = REPO / "results" / tag
    best = git(REPO, "rev-parse", f"autorl/{tag}")
    seeds = [101 + i for i in range(args.rescore_seeds)]
    print(f"\ndemo: rescoring the start and the night's best on fresh training seeds {seeds} "
          f"(each scored on 100 fresh evaluation episodes) ...", flush=True)
    cache = run_dir / "verify-cache"
    with tempfile.TemporaryDirectory(prefix="autorl-demo-") as scratch:
        same_way = (problem.env_id, problem.budget_s, seeds, Path(scratch), problem.run_args,
                    cache if cache.is_dir() else None)   # the path the night trained on
        start_scores = rescore(REPO, start, *same_way)
        best_scores = start_scores if best == start else rescore(REPO, best, *same_way)
    import pandas as pd

    rows = pd.read_csv(run_dir / "results.tsv", sep="\t")
    untrained = int((rows.env_steps.fillna(-1) == 0).sum())   # start-up and compile outlasted the budget
    p, significant = better(best_scores, start_scores)
    gain = float(np.mean(best_scores) - np.mean(start_scores))
    verdict = {"tag": tag, "problem": problem.name, "start": start, "best": best, "kept": best != start,
               "start_rescored": start_scores, "best_rescored": best_scores, "gain": gain, "p_better": p,
               "confirmed": best != start and significant, "runs_without_training": untrained,
               "wall_s": round(time.monotonic() - started, 1)}
    (run_dir / "demo.json").write_text(json.dumps(verdict, indent=1) + "\n")
    print(f"demo: start {np.mean(start_scores):.1f} {[round(s, 1) for s in start_scores]}, "
          f"best {np.mean(best_scores):.1f} {[round(s, 1) for s in best_scores]}")
    if untrained:
        print(f"demo: {untrained} of the night's {len(rows)} runs trained 0 env steps: start-up and JAX's compile "
              f"outlasted the {problem.budget_s:g} s budget, as on a busy machine (on a quiet 2-core machine the "
              "compile takes 1-2 s); their scores are an untrained policy's")
    if best == start:
        print("demo: the night kept nothing (the start is still the best); nothing to confirm")
    else:
        print(f"demo: the night's best is {gain:+.1f} over the start on fresh seeds "
              f"(one-sided Welch p {p:.3f}: {'a confirmed gain' if significant else 'NOT significant on these seeds'})")
    print(f"demo: {verdict['wall_s'] / 60:.1f} min; the night's commits: git log --oneline {start[:7]}~1..autorl/{tag}")
    report = subprocess.run([sys.executable, "-m", "orchestrator", "report", "--tag", tag], cwd=REPO)
    return report.returncode


if __name__ == "__main__":
    sys.exit(main())
