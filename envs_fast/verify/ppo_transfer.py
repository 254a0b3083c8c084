"""L4 for a physics translation: PPO trained on the backend plays the reference env as well as PPO trained
on the reference for the same env steps (cross-backend transfer: no sim-to-sim gap).

A translation declares it in its sync companion or JAX file (declarations.py):

    TRANSFER_PPO = {"env_steps": 3_000_000,   # per training run, both sides
                    "seeds": 2,               # training seeds per side, paired (AUTORL_SEED 1..seeds)
                    "margin": 10.0,           # |mean score on the backend's side - the reference's| <= margin
                    "min_score": 200.0,       # the reference's policies must reach it: two policies that
                                              # learnt nothing agree and prove nothing
                    "train_py": {"NAME": value}}  # optional: train.py constants the env steps were chosen
                                              # for, set on both sides (whatever the checkout's say)

For each seed and side, the checkout's candidate/train.py trains in a scratch folder, a copy of it with
BACKEND set (the backend, or "reference") and END_TO_END = False, so that both sides train on the
jax-host path with the same constants (a JAX translation would otherwise train end to end, with
others), for exactly the declared env steps (AUTORL_MAX_ENV_STEPS, which
also anneals the learning rate over steps; the time budget is lifted). evaluate.py's harness scores
every artifact on the reference env (100 episodes from a seed no training run resets with). The
backend trains only with a passing L1-L3 verdict, as in a night.

Hours at the declared steps on 2 cores: with `--l4-dir DIR` every run's folder (train.log, policy.pt,
run.json) is kept there, and a run whose run.json matches (what its side trains on: the backend's content
or gymnasium's version; train.py text, env steps, seed, side) is not trained again, so a stopped check
resumes and a changed port retrains only its own side. Within a run, train.py's jax-host path (the one L4
trains on) saves a checkpoint every 5 minutes (AUTORL_CHECKPOINT_DIR), and a run stopped
midway goes on from it with new episodes: the JAX BipedalWalker port's runs take ~1.5-3 h each on a 2-core
CPU. `--l4-jobs N` trains N runs side by side, the backend's first (two of the JAX port's on 2 cores: 690
steps/s each against 880 for one alone, bench/bipedal_jax.py run twice at once); each run compiles into a
JAX cache of its own, in its folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from envs_fast import cache
from envs_fast.cache import backend_identity
from envs_fast.protocol import is_file_spec
from envs_fast.verify.report import LevelReport
from envs_fast.verify.context import Context

EVAL_EPISODES = 100
EVAL_SEED_OFFSET = 1_000_000  # the scoring episodes' seeds: far from every training run's resets
SLOWEST_SPS = 300.0  # a training run's time budget: 10 min + its env steps at this rate; the steps end it


STEPPED_FROM_THE_HOST = "END_TO_END"  # train.py's switch: False trains every backend on its jax-host path


def train_py_for(text: str, backend: str, constants: dict | None = None) -> str:
    """train.py's text with BACKEND, END_TO_END = False (both sides on the jax-host path, one set of
    constants) and `constants` set (whatever the checkout's lines say)."""
    for name, value in (("BACKEND", backend), (STEPPED_FROM_THE_HOST, False), *(constants or {}).items()):
        text, count = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", text, count=1, flags=re.M)
        if count != 1:
            raise ValueError(f"candidate/train.py has no line `{name} = ...` to set")
    return text


def repository(ctx: Context) -> Path:
    return Path(ctx.root) if ctx.root else Path(__file__).resolve().parents[2]


def run(ctx: Context, report: LevelReport, declared: dict) -> None:
    s = ctx.settings
    env_steps = int(s.extra.get("l4_env_steps") or declared["env_steps"])
    seeds = int(s.extra.get("l4_seeds") or declared.get("seeds", 2))
    margin = float(declared.get("margin", 10.0))
    min_score = float(declared.get("min_score", float("-inf")))
    report.tolerances = {"margin": margin, "min_score": min_score}
    verdict = cache.cached_verdict(ctx.spec, ctx.env_id)
    if not (verdict and verdict.get("passed")):
        report.add("trained on the backend (PPO)", False,
                   "L4 trains PPO on the backend, which trains only once it passes L1-L3: no passing verdict is "
                   "cached for it (run --levels 1,2,3,4)")
        return
    root = repository(ctx)
    train_py = root / "candidate" / "train.py"
    # a file spec as an absolute path: the training runs start in their own folders
    spec = str(Path(ctx.spec).resolve()) if is_file_spec(ctx.spec) else ctx.spec
    try:
        texts = {side: train_py_for(train_py.read_text(), backend, declared.get("train_py"))
                 for side, backend in (("backend", spec), ("reference", "reference"))}
    except (OSError, ValueError) as exc:
        report.add("trained on the backend (PPO)", False, f"{train_py}: {exc}")
        return
    eval_seed = EVAL_SEED_OFFSET + s.seed
    kept = s.extra.get("l4_dir")
    jobs = max(1, int(s.extra.get("l4_jobs") or 1))
    failed = threading.Event()  # set when a run fails: its siblings stop instead of training on for hours
    with tempfile.TemporaryDirectory(prefix="autorl-l4-") as scratch:
        work = Path(kept) if kept else Path(scratch)

        def one_run(side: str, seed: int) -> dict:
            folder = work / f"{side}-seed{seed}"
            # a side's runs are decided by what it trains on: the port's changes leave the reference's
            trains_on = ctx.spec if side == "backend" else "reference"
            identity = {"backend": backend_identity(trains_on, ctx.env_id), "env_id": ctx.env_id, "side": side,
                        "train_py": hashlib.sha256(texts[side].encode()).hexdigest(), "env_steps": env_steps,
                        "seed": seed, "eval_seed": eval_seed}
            trained = finished_run(folder, identity)
            if trained is not None:
                return trained
            trained = train(root, folder, texts[side], ctx.env_id, env_steps, seed, identity, stop=failed)
            if "error" in trained:
                return trained
            expected = spec if side == "backend" else "reference"
            if trained["backend"] != expected:
                return {"error": f"train.py trained on {trained['backend']!r}, not {expected!r}: {trained['why']}"}
            trained["score"] = score(root, folder / "policy.pt", ctx.env_id, eval_seed)
            (folder / "run.json").write_text(json.dumps({"identity": identity, "run": trained}, indent=1))
            return trained

        # the backend's runs first: on a JAX port they are the long ones, and `jobs` of them train side by side
        order = [(side, seed) for side in ("backend", "reference") for seed in range(1, seeds + 1)]
        results = {}
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(one_run, side, seed): (side, seed) for side, seed in order}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if "error" in results[futures[future]]:  # no more hours on a check that has failed
                    failed.set()  # the runs still training stop (their checkpoints stay for a rerun)
                    pool.shutdown(wait=True, cancel_futures=True)
                    break
    errors = [(side, results[(side, seed)]) for side, seed in order if "error" in results.get((side, seed), {})]
    for side, result in sorted(errors, key=lambda error: bool(error[1].get("stopped"))):  # the cause first
        report.add(f"PPO trains on the {side}", False, result["error"])
        return
    runs = {side: [results[(side, seed)] for seed in range(1, seeds + 1)] for side in ("backend", "reference")}
    judge(report, runs, env_steps, margin, min_score)


def finished_run(folder: Path, identity: dict) -> dict | None:
    """A kept run's figures when it trained and was scored under the same identity, else None."""
    try:
        record = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return record["run"] if record.get("identity") == identity else None


def train(root: Path, folder: Path, text: str, env_id: str, env_steps: int, seed: int, identity: dict,
          stop: threading.Event | None = None) -> dict:
    """One training run of `text` (a train.py) for `env_steps`; its summary, or {"error": why}. A run
    stopped midway under the same identity goes on from its checkpoint (train.py's jax-host path saves one
    every few minutes); an outdated one trains again from scratch. When `stop` is set the run is ended
    (its process group terminated) and returns {"error": ..., "stopped": True}."""
    started_as = folder / "identity.json"
    try:
        same = json.loads(started_as.read_text()) == identity
    except (OSError, ValueError):
        same = False
    if folder.exists() and not same:
        shutil.rmtree(folder)
    (folder / "candidate").mkdir(parents=True, exist_ok=True)
    started_as.write_text(json.dumps(identity))
    script = folder / "candidate" / "train.py"
    script.write_text(text)
    # the copy imports evaluate and envs_fast from the checkout (PYTHONPATH), as the original would
    time_budget = 600 + env_steps / SLOWEST_SPS
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               AUTORL_ENV_ID=env_id, AUTORL_TIME_BUDGET=str(time_budget), AUTORL_MAX_ENV_STEPS=str(env_steps),
               AUTORL_SEED=str(seed), AUTORL_OUTPUT_DIR=str(folder), AUTORL_JAX_CACHE_DIR=str(folder / "jax-cache"),
               AUTORL_CHECKPOINT_DIR=str(folder / "checkpoint"))
    started, started_at = time.monotonic(), time.time()
    deadline = started + time_budget + 600
    proc = subprocess.Popen([sys.executable, str(script)], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=1.0)  # retried on timeout without losing output
            break
        except subprocess.TimeoutExpired:
            if (stop is not None and stop.is_set()) or time.monotonic() > deadline:
                _end(proc)
                if time.monotonic() > deadline:
                    return {"error": f"train.py (seed {seed}) did not finish {env_steps:,} env steps in "
                                     f"{time_budget + 600:.0f} s"}
                return {"error": f"train.py (seed {seed}) stopped: another L4 run failed", "stopped": True}
    with open(folder / "train.log", "a") as log:  # a resumed run's log follows the stopped one's
        log.write(stdout + stderr)
    tail = stdout.rsplit("\n---\n", 1)
    if proc.returncode != 0 or len(tail) < 2:
        return {"error": f"train.py (seed {seed}) exited {proc.returncode}: "
                         f"{(stdout + stderr).strip()[-1500:]}"}
    summary = dict(line.split(": ", 1) for line in tail[1].strip().splitlines() if ": " in line)
    if int(summary.get("env_steps", 0)) > env_steps:  # a train.py edited so that it ignores the step budget
        return {"error": f"train.py (seed {seed}) trained {summary.get('env_steps')} env steps of a budget of "
                         f"{env_steps:,}: it does not honour AUTORL_MAX_ENV_STEPS"}
    return {"seed": seed, "backend": summary.get("backend", ""), "why": summary.get("backend_reason", ""),
            "path": summary.get("path", ""), "env_steps": int(summary.get("env_steps", 0)),
            "seconds": time.monotonic() - started, "started_at": started_at, "ended_at": time.time()}


def _end(proc: subprocess.Popen) -> None:
    """Terminates a training run's process group (train.py and what it started), killing it after 10 s."""
    for signal_, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, signal_)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def score(root: Path, policy: Path, env_id: str, eval_seed: int) -> dict:
    """The harness's score of the artifact on the reference env (evaluate.py, as the daemon runs it)."""
    proc = subprocess.run([sys.executable, str(root / "evaluate.py"), "--policy", str(policy), "--env", env_id,
                           "--episodes", str(EVAL_EPISODES), "--seed", str(eval_seed)],
                          cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"evaluate.py failed on {policy}: {proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def judge(report: LevelReport, runs: dict, env_steps: int, margin: float, min_score: float) -> None:
    means = {side: statistics.fmean(r["score"]["mean"] for r in rs) for side, rs in runs.items()}
    difference = means["backend"] - means["reference"]
    per_seed = "; ".join(
        f"seed {b['seed']}: {b['score']['mean']:.1f} vs {r['score']['mean']:.1f}"
        for b, r in zip(runs["backend"], runs["reference"]))
    steps = {side: [r["env_steps"] for r in rs] for side, rs in runs.items()}
    report.largest_deviation = {"mean score difference": difference, "margin": margin}
    learned = means["reference"] >= min_score
    report.add("the reference's PPO learnt", learned,
               f"mean score {means['reference']:.1f} on the reference env after {env_steps:,} env steps "
               f"(at least {min_score:g} needed to judge transfer)")
    detail = (f"PPO (train.py's jax-host path) for {env_steps:,} env steps per run (trained: backend "
              f"{steps['backend']}, reference {steps['reference']}), {len(runs['backend'])} seed(s) per side, each "
              f"artifact scored by evaluate.py over {EVAL_EPISODES} episodes on the reference env: trained on the "
              f"backend {means['backend']:.1f}, on the reference {means['reference']:.1f}, difference "
              f"{difference:+.1f} (margin +-{margin:g}); per seed, backend vs reference: {per_seed}")
    report.add("PPO trained on the backend transfers (score within the margin)", abs(difference) <= margin, detail)
