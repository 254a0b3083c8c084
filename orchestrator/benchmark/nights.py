"""Does a night make train.py better? Real nights of the daemon on small search problems, rescored.

    python -m bench.nights [--quick] [--repeats R] [--problems a,b] [--searchers a,b] [--json FILE]

A problem is (env, budget, start): the shipped candidate/train.py, or a *detuned* one (a documented
change that costs score, below). For each problem and searcher, R nights run the real daemon
(`python -m orchestrator run`, real training, the real harness) in a temporary clone of this
checkout's HEAD (committed code only) with the detuned train.py committed on top, each for
--experiments experiments. Searchers:

  optuna   the default agent (local-first search around the best)
  tpe      Optuna's plain TPE over the same constants (--optuna-sampler tpe)
  random   random search over the same constants (--optuna-sampler random)
  none     no search: the unchanged train.py retrained (a comment changes so that each experiment is
           a commit); what a night keeps when nothing can be gained

Then the start and the night's best (the branch tip) are rescored the same way, outside the night:
trained on --rescore-seeds fresh training seeds and each scored by the harness on 100 episodes with
fresh evaluation seeds. Per night: improvement (best - start, rescored), whether it is significant
(one-sided Welch t-test over the rescoring seeds, p < 0.05), a false keep (the night kept something
whose rescoring is not significantly better than the start), full-budget equivalents spent
(every train run of the night, a screen run counting its fraction), wall time. Per (problem,
searcher): the mean improvement with its 95% CI over nights, and the fraction of the detuned gap
recovered (the shipped train.py is rescored once per problem for that).

`--quick`: one problem (pendulum-gamma, 15 s on the jax-e2e path), two searchers (optuna, none),
one night of 4 experiments, 2 rescoring seeds: about 15 minutes on 2 cores. Each night's line shows
the gap to the shipped train.py (rescored alike): a problem whose gap is not clearly positive on
this machine measures nothing. `--baselines N` passes `--baselines N` to every night.

Drawn detunes (`--drawn N --envs Pendulum-v1,MountainCar-v0`): see drawn_detunes.py beside this module.

Screening: `--screen off,0.25` runs each night both without and with `--screen 0.25`, side by
side, and the table has a row for each. Compare them at equal wall time (`--minutes M`: each night
runs M minutes, `--max-hours`, instead of --experiments) and at a budget long against the fixed
cost of a run (`--budget S` overrides the problems'): start-up, the JAX compile and the 100-episode
evaluation take seconds whatever the budget, so a screen at 0.25 of 15 s saves little.
"""
from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from orchestrator.benchmark.drawn_detunes import CHECK_RUNS, COST_SIGMAS, cost_figures, draw_detune
from orchestrator.benchmark.machine_load import MachineLoad
from orchestrator.benchmark.night_table import (NightRow, load_nights, print_budget_curve, print_paired_curves,
                                                print_table, summarize, write_json)
from orchestrator.benchmark.rescoring import REPO, TRAIN_PY, better, embedded_agent_env, rescore, verify_cache_of



@dataclass
class Problem:
    name: str
    env_id: str
    budget_s: float
    detune: dict = field(default_factory=dict)   # constant -> value in the start's train.py
    why: str = ""
    run_args: tuple = ()                          # e.g. ("--no-setup-verify",): the jax-host path


# A detune must cost score however fast the machine is (they differ 2x from day to day): a learning
# rate 8x too low no longer does on the jax-e2e path, which trains CartPole 10 s / Pendulum 15 s for
# 2-6M steps on a 2-core machine (Nov 25: CartPole at 3e-5 still 500.0, Pendulum at 2.5e-4 -149
# against the shipped -132/-145). Nor does a mildly cut horizon: Pendulum with GAMMA 0.9 scored
# -395 at 3M steps one day and -171/-190 at 6M steps the next. A horizon of 5 steps does: the
# discounted optimum no longer swings up, however many steps (GAMMA 0.8: -577 vs the shipped -171).
PROBLEMS = {p.name: p for p in (
    Problem("pendulum-gamma", "Pendulum-v1", 15, {"GAMMA": 0.8},
            "jax-e2e, a short discount (0.99 -> 0.8): the swing-up's horizon is cut to 5 steps (-577 vs -171)"),
    Problem("acrobot-gamma", "Acrobot-v1", 10, {"GAMMA": 0.9},
            "jax-e2e, a short discount (0.99 -> 0.9): the sparse -1 reward's horizon is cut"),
    # (Nov 25, 2 cores: its 4 baselines and 6 candidates all scored 500.0; the host path then needed
    # a stronger detune to measure anything)
    Problem("cartpole-host-epochs", "CartPole-v1", 30, {"UPDATE_EPOCHS": 1, "LEARNING_RATE": 1e-4},
            "jax-host path (--no-setup-verify), one epoch and a 3x lower learning rate", ("--no-setup-verify",)),
    Problem("cartpole-shipped", "CartPole-v1", 10, {}, "jax-e2e, the shipped train.py: nothing to gain"),
    # The headline env on its Rust port (jax-host, verified L1-L3 at each night's setup). Its drawn
    # detunes: `--drawn 3 --envs BipedalWalker-v3 --drawn-budget 120 --drawn-path jax-host`.
    Problem("bipedal-shipped", "BipedalWalker-v3", 240, {},
            "Rust port (jax-host), the shipped train.py: what a night adds to the start"),
    Problem("bipedal-null", "BipedalWalker-v3", 120, {},
            "Rust port (jax-host), the shipped train.py at 120 s: the null night (--searchers none)"),
)}
SEARCHERS = ("optuna", "tpe", "random", "none")


def screens(text: str) -> list[float | None]:
    """--screen: "0.25" or "off,0.25" -> [None, 0.25] (off: no screening)."""
    fractions = [None if f in ("off", "0") else float(f) for f in text.split(",")]
    if any(f is not None and not 0 < f < 1 for f in fractions):
        raise argparse.ArgumentTypeError(f"--screen takes fractions in (0, 1) or off: {text}")
    return fractions


def draw_cost(root: Path, problem: Problem, timeout_s: float) -> dict:
    """What the draw costs on the night's path: the detuned and the shipped train.py, CHECK_RUNS
    baselines each (the daemon's setup verification and baselines), sigma pooled over both groups."""
    scores = {}
    for which, start in (("detuned", problem), ("shipped", replace(problem, detune={}))):
        clone, _ = clone_with_start(root / which, start)
        args = [sys.executable, "-m", "orchestrator", "run", "--env", problem.env_id, "--budget",
                f"{problem.budget_s:g}", "--tag", "cost", "--max-experiments", "0", "--baselines", str(CHECK_RUNS),
                "--agent", "optuna", *problem.run_args]
        done = subprocess.run(args, cwd=clone, capture_output=True, text=True, timeout=timeout_s,
                              env=embedded_agent_env())
        if done.returncode != 0:
            raise RuntimeError(f"the {which} start failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
        import pandas as pd

        rows = pd.read_csv(clone / "results" / "cost" / "results.tsv", sep="\t")
        scores[which] = [float(x) for x in rows.score.dropna()]
    return cost_figures(scores["detuned"], scores["shipped"])


def drawn_problem(draw: dict, budget_s: float) -> Problem:
    name = f"drawn-{draw['env_id'].split('-')[0].lower()}-{draw['index']}"
    return Problem(name, draw["env_id"], budget_s, {draw["constant"]: draw["value"]}, f"drawn: {draw['why']}")


# ---------------------------------------------------------------- a night
def detuned(text: str, detune: dict) -> str:
    for name, value in detune.items():
        text, n = re.subn(rf"^{name} = [^#\n]*", f"{name} = {value!r}  ", text, count=1, flags=re.MULTILINE)
        if not n:
            raise SystemExit(f"{name} is not in {TRAIN_PY}'s hyperparameter block")
    return text


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def clone_with_start(root: Path, problem: Problem) -> tuple[Path, str]:
    """A clone of this checkout's HEAD with the problem's start committed; returns it and the commit."""
    clone = root / "checkout"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    if problem.detune:
        path = clone / TRAIN_PY
        path.write_text(detuned(path.read_text(), problem.detune))
        git(clone, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qam",
            f"detune: {problem.why}")
    return clone, git(clone, "rev-parse", "HEAD")


def no_search_replay(root: Path, experiments: int, train_py: str) -> Path:
    """Replay folders that each retrain the unchanged train.py (a comment changes: a commit each)."""
    folder = root / "replay-none"
    for i in range(1, experiments + 1):
        step = folder / f"{i:03d}"
        (step / "candidate").mkdir(parents=True)
        (step / TRAIN_PY).write_text(f"{train_py}\n# retrained unchanged ({i})\n")
        (step / "DESCRIPTION").write_text(f"no search: the same train.py again ({i})")
    return folder


def run_night(root: Path, problem: Problem, searcher: str, experiments: int, screen: float | None,
              timeout_s: float, baselines: int | None = None, minutes: float | None = None) -> dict:
    clone, start = clone_with_start(root, problem)
    tag = f"night-{searcher}"
    args = [sys.executable, "-m", "orchestrator", "run", "--env", problem.env_id, "--budget", f"{problem.budget_s:g}",
            "--tag", tag, "--phases", "train", "--rescore", "0", *problem.run_args]  # rescored below, alike
    args += ["--max-hours", f"{minutes / 60:g}"] if minutes else ["--max-experiments", str(experiments)]
    if searcher == "none":   # a timed night must not run out of retrains: each takes at least a budget
        retrains = int(minutes * 60 / problem.budget_s) + 1 if minutes else experiments
        args += ["--agent", "replay", "--replay-dir", str(no_search_replay(root, retrains, (clone / TRAIN_PY).read_text()))]
    else:
        args += ["--agent", "optuna"] + ([] if searcher == "optuna" else ["--optuna-sampler", searcher])
    if screen:
        args += ["--screen", f"{screen:g}"]
    if baselines:
        args += ["--baselines", str(baselines)]
    started = time.monotonic()
    done = subprocess.run(args, cwd=clone, capture_output=True, text=True, timeout=timeout_s,
                          env=embedded_agent_env())
    wall = time.monotonic() - started
    run_dir = clone / "results" / tag
    if done.returncode != 0:
        raise RuntimeError(f"the night failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    import pandas as pd

    rows = pd.read_csv(run_dir / "results.tsv", sep="\t", dtype={"commit": str})
    best = git(clone, "rev-parse", f"autorl/{tag}")
    code = git(clone, "rev-parse", "--short", f"{start}~1" if problem.detune else start)   # what the night ran
    return {"clone": clone, "start": start, "best": best, "wall_s": wall, "rows": rows, "code": code,
            "kept": int((rows.status == "keep").sum()), "screened": int((rows.status == "screened").sum()),
            "candidates": int((rows.exp > 0).sum()), "full_budgets": full_budget_equivalents(run_dir, screen),
            "budgets_to_best": budgets_to_best(run_dir, rows, screen), "kept_changes": kept_changes(rows)}


def kept_changes(rows) -> list[dict]:
    """What the night kept, in order: each keep's experiment, confirmed score and change (its
    description without the keep rule's bracketed reasoning), so a record outlives the clone."""
    return [{"exp": int(r.exp), "score": float(r.score), "change": str(r.description).split(" [")[0]}
            for r in train_keeps(rows).itertuples()]


def train_keeps(rows):
    """The rows of the train experiments a night kept (a translate keep changes no score)."""
    return rows[(rows.status == "keep") & (rows.phase == "train")]


def full_budget_equivalents(run_dir: Path, screen: float | None, through_exp: int | None = None) -> float:
    """Every train run of the night (baselines, candidates, confirmations, the screens at their
    fraction), in full budgets: each run leaves one train.log. `through_exp`: only the runs of
    experiments up to that one (a night of --parallel 1 runs them in that order)."""
    runs = [log for log in run_dir.rglob("train.log") if "transfer" not in log.parts
            and (through_exp is None or _exp_of(log, run_dir) <= through_exp)]
    screens = sum(1 for log in runs if "screen" in log.parts)
    return round(len(runs) - screens + screens * (screen or 0.0), 2)


def _exp_of(log: Path, run_dir: Path) -> int:
    """The experiment a run belongs to (the best's screen runs, in screen/ beside the exp folders,
    count as the start's: a night that screens is read a little early)."""
    folder = log.relative_to(run_dir).parts[0]   # exp-NNNN
    return int(folder.split("-")[1]) if folder.startswith("exp-") else 0


def budgets_to_best(run_dir: Path, rows, screen: float | None) -> float:
    """The full budgets the night had spent when it kept its final best (the baselines' when it
    kept nothing): what "recovered within B budgets" is read from."""
    kept = train_keeps(rows)
    return full_budget_equivalents(run_dir, screen, int(kept.exp.max()) if len(kept) else 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one problem, optuna and none, one night of 4 experiments")
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--searchers", default=",".join(SEARCHERS))
    parser.add_argument("--repeats", type=int, default=3, help="nights per (problem, searcher)")
    parser.add_argument("--experiments", type=int, default=12, help="experiments per night")
    parser.add_argument("--rescore-seeds", type=int, default=3)
    parser.add_argument("--screen", type=screens, default=[None], metavar="F,F",
                        help="--screen F for every night; a list (e.g. off,0.25) runs each night with each")
    parser.add_argument("--budget", type=float, metavar="S", help="every problem's budget (default: its own)")
    parser.add_argument("--minutes", type=float, metavar="M",
                        help="each night runs M minutes (--max-hours) instead of --experiments experiments")
    parser.add_argument("--baselines", type=int, default=None, help="--baselines N for every night (default: the run's)")
    parser.add_argument("--json", metavar="FILE", help="write the night rows and the summary as JSON")
    parser.add_argument("--resume", metavar="FILE", help="add to the nights of this JSON (and write it)")
    parser.add_argument("--drawn", type=int, default=0, metavar="N", help="N drawn detunes per env (see above)")
    parser.add_argument("--envs", default="Pendulum-v1,MountainCar-v0",
                        help="the envs of --drawn (Acrobot and CartPole at 10 s shrug every draw off)")
    parser.add_argument("--draw-seed", type=int, default=0)
    parser.add_argument("--drawn-budget", type=float, default=10.0, metavar="S", help="budget of the drawn problems")
    parser.add_argument("--drawn-path", choices=("jax-e2e", "jax-host"), default="jax-e2e",
                        help="the path the drawn envs train on: a constant is drawn from those it reads "
                             "(jax-host for an env on a host backend, e.g. BipedalWalker-v3 on its Rust port)")
    parser.add_argument("--draws-only", action="store_true",
                        help="with --drawn: check what the draws cost (and record them), run no night")
    parser.add_argument("--keep", action="store_true", help="keep the temporary clones")
    args = parser.parse_args()
    if args.quick:
        args.problems, args.searchers, args.repeats, args.experiments, args.rescore_seeds = \
            "pendulum-gamma", "optuna,none", 1, 4, 2
    args.json = args.resume or args.json
    searchers = [s for s in args.searchers.split(",") if s in SEARCHERS]
    rows, shipped_scores, draws, failures = load_nights(Path(args.resume)) if args.resume else ([], {}, [], [])
    done = {(r.problem, r.searcher, r.screen, r.night) for r in rows}
    base = Path(tempfile.mkdtemp(prefix="autorl-nights-"))
    seeds = [101 + i for i in range(args.rescore_seeds)]
    if args.drawn and args.draws_only:   # an hour's slot: the draws' cost checks, recorded for the nights later
        for _ in drawn_problems(args, base, draws, rows, shipped_scores, failures):
            pass
        tasks = []
    elif args.drawn:
        # (lazily: each draw is checked just before its nights, so a cut-short run has nights to show)
        tasks = ((problem, 1, draw)
                 for problem, draw in drawn_problems(args, base, draws, rows, shipped_scores, failures))
    else:
        problems = [replace(PROBLEMS[name], budget_s=args.budget or PROBLEMS[name].budget_s)
                    for name in args.problems.split(",")]
        tasks = [(problem, night, None) for problem in problems for night in range(1, args.repeats + 1)]
    try:
        for problem, night, draw in tasks:   # night-major: a cut-short run still compares searchers
            if night == 1:
                print(f"# {problem.name}: {problem.env_id} {problem.budget_s:g}s; {problem.why}", flush=True)
            for searcher, screen in [(s, f) for s in searchers for f in args.screen]:
                if (problem.name, searcher, screen, night) in done:
                    continue
                root = base / f"{problem.name}-{searcher}-{screen or 'full'}-{night}"
                root.mkdir(parents=True)
                try:
                    row = measure_night(root, base, problem, searcher, screen, night, draw, args, seeds,
                                        shipped_scores)
                except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
                    # one night's failure (the daemon's, or a rescoring's: a best that crashes on a fresh
                    # seed) is recorded with its folder, and the benchmark goes on to the next night
                    kept = Path(tempfile.gettempdir()) / f"autorl-night-failed-{root.name}-{int(time.time())}"
                    shutil.move(str(root), kept)
                    what = failure_text(error)
                    failures.append({"problem": problem.name, "searcher": searcher, "screen": screen,
                                     "night": night, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                     "error": what, "folder": str(kept)})
                    print(f"  {searcher:7s} night {night}: FAILED, not counted ({what[-300:]}); "
                          f"its folder: {kept}; --resume runs it again", flush=True)
                    if args.json:
                        write_json(Path(args.json), rows, shipped_scores, draws, failures)
                    continue
                rows.append(row)
                if args.json:  # after every night: hours of measurement survive an interruption
                    write_json(Path(args.json), rows, shipped_scores, draws, failures)
                if not args.keep:
                    shutil.rmtree(root, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    summary = summarize(rows)
    print_table(summary)
    print_budget_curve(summary)
    print_paired_curves(summary)
    if args.json:
        write_json(Path(args.json), rows, shipped_scores, draws, failures)
    return 0


def measure_night(root: Path, base: Path, problem: Problem, searcher: str, screen: float | None, night: int,
                  draw: dict | None, args, seeds: list[int], shipped_scores: dict) -> NightRow:
    """One night of `searcher` on `problem` in `root`, its start and best rescored: its row (and the
    shipped train.py rescored into `shipped_scores` the first time a problem needs its gap)."""
    load = MachineLoad()
    try:
        n = run_night(root, problem, searcher, args.experiments, screen,
                      timeout_s=(args.minutes * 60 + problem.budget_s * 4 if args.minutes else
                                 args.experiments * (problem.budget_s * 6 + 240)) + 900,
                      baselines=args.baselines, minutes=args.minutes)
        cache = verify_cache_of(n["clone"])
        shipped_key = f"shipped {problem.env_id} {problem.budget_s:g}s" if draw else problem.name
        if problem.detune and shipped_key not in shipped_scores:
            # the gap a night can close: the shipped train.py, rescored alike (same path)
            clone, shipped = clone_with_start(base / f"{problem.name}-shipped", Problem(
                problem.name, problem.env_id, problem.budget_s, {}, run_args=problem.run_args))
            shipped_scores[shipped_key] = float(np.mean(rescore(
                clone, shipped, problem.env_id, problem.budget_s, seeds, base, problem.run_args, cache)))
        start = rescore(n["clone"], n["start"], problem.env_id, problem.budget_s, seeds, root,
                        problem.run_args, cache)
        best = start if n["best"] == n["start"] else rescore(
            n["clone"], n["best"], problem.env_id, problem.budget_s, seeds, root, problem.run_args,
            cache)
    finally:   # (a failed night's sampler stops too)
        conditions = load.stop()
    p, significant = better(best, start)
    improvement = float(np.mean(best) - np.mean(start))
    gap = shipped_scores.get(shipped_key, math.nan) - float(np.mean(start))
    row = NightRow(problem.name, searcher, screen, night, start, best, improvement, p, significant,
                   n["kept"], n["screened"], n["candidates"], n["kept"] > 0 and not significant, n["full_budgets"],
                   round(n["wall_s"], 1), improvement / gap if gap and gap > 0 else None, draw,
                   code=n["code"], budgets_to_best=n["budgets_to_best"], conditions=conditions,
                   kept_changes=n["kept_changes"])
    print(f"  {searcher:7s} {f'screen {screen:g}' if screen else 'no screen'} night {night}: start {np.mean(start):8.2f} best {np.mean(best):8.2f} "
          f"({improvement:+.2f}, p {p:.3f}; gap to shipped {gap:+.2f}) kept {n['kept']} "
          f"screened {n['screened']} "
          f"{'FALSE KEEP ' if row.false_keep else ''}{n['full_budgets']:g} budgets "
          f"{n['wall_s'] / 60:.1f} min; other processes {row.conditions['other_cpu_s']:g} CPU s",
          flush=True)
    return row


def failure_text(error: BaseException) -> str:
    """What failed, with the failing process's last words where there are any."""
    stderr = getattr(error, "stderr", None) or ""
    stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    return f"{error}{(': ' + stderr.strip()[-400:]) if stderr.strip() else ''}"[-800:]


def drawn_problems(args, base: Path, draws: list[dict], rows: list[NightRow], shipped_scores: dict,
                   failures: list[dict] = ()):
    """(problem, draw) for --drawn N per env: the draws of a resumed file first, then new ones, each
    checked to cost >= COST_SIGMAS sigma before its nights (a rejected draw is recorded too)."""
    for env_id in args.envs.split(","):
        accepted, index = 0, 0
        while accepted < args.drawn and index < 4 * args.drawn:
            known = next((d for d in draws if d["env_id"] == env_id and d["index"] == index
                          and d["seed"] == args.draw_seed), None)
            draw = known or draw_detune(env_id, index, args.draw_seed, args.drawn_path)
            problem = drawn_problem(draw, args.drawn_budget)
            if known is None:
                print(f"# draw {env_id} {index}: {draw['why']}: checking what it costs", flush=True)
                try:
                    draw.update(draw_cost(base / f"cost-{problem.name}", problem, timeout_s=1800))
                    draw["accepted"] = draw["cost_sigmas"] >= COST_SIGMAS
                    print(f"  costs {draw['cost']:+.1f} ({draw['cost_sigmas']:.1f} sigma): "
                          f"{'a problem' if draw['accepted'] else 'rejected, drawn again'}", flush=True)
                except RuntimeError as error:
                    # a start the daemon refuses (its baselines crash) is no night: recorded, redrawn
                    draw.update(accepted=False, refused=str(error)[-400:])
                    print(f"  the daemon refuses the start, rejected: {str(error)[-200:]}", flush=True)
                draws.append(draw)
                if args.json:
                    write_json(Path(args.json), rows, shipped_scores, draws, failures)
            index += 1
            if draw["accepted"]:
                accepted += 1
                yield problem, draw


if __name__ == "__main__":
    sys.exit(main())
