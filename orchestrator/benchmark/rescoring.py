"""Rescoring, outside a night: a commit's train.py retrained on fresh seeds and scored by the harness
on fresh evaluation seeds, and whether one set of scores beats another (the night benchmark's
judge, and the demo's)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = "candidate/train.py"
EVAL_EPISODES = 100
RESCORE_EVAL_SEED = 7_000_000   # far from any run's held-out seed (drawn below 2**31 - 1e6 per run)


def verify_cache_of(clone: Path) -> Path | None:
    """The verdict cache of the night run in `clone` (what its setup verified), if any."""
    caches = sorted((clone / "results").glob("*/verify-cache"))
    return caches[0] if caches else None


def rescore(clone: Path, commit: str, env_id: str, budget_s: float, seeds: list[int], root: Path,
            run_args: tuple, verify_cache: Path | None) -> list[float]:
    """Train `commit`'s train.py on each fresh seed and score it with the harness (fresh eval seeds),
    on the backends `verify_cache` holds verified (the night's: every rescoring of a problem then
    takes the path its night took; None with --no-setup-verify: the jax-host path)."""
    scores = []
    work = root / f"rescore-{commit[:8]}"
    shutil.rmtree(work, ignore_errors=True)
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(work), commit], cwd=clone, check=True)
    env = child_env()
    if verify_cache is not None and "--no-setup-verify" not in run_args:
        env["AUTORL_VERIFY_CACHE"] = str(verify_cache)
    try:
        for seed in seeds:
            out = work / f"out-{seed}"
            train = subprocess.run([sys.executable, TRAIN_PY], cwd=work, capture_output=True, text=True,
                                   timeout=budget_s + 300,
                                   env={**env, "AUTORL_OUTPUT_DIR": str(out), "AUTORL_TIME_BUDGET": f"{budget_s:g}",
                                        "AUTORL_SEED": str(seed), "AUTORL_ENV_ID": env_id})
            policy = next(iter(sorted(out.glob("policy.*"))), None)
            if train.returncode != 0 or policy is None:
                raise RuntimeError(f"rescoring {commit[:8]} seed {seed} failed: {train.stdout[-300:]}{train.stderr[-300:]}")
            result = out / "eval.json"
            subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--policy", str(policy), "--env", env_id,
                            "--episodes", str(EVAL_EPISODES), "--seed", str(RESCORE_EVAL_SEED + 1000 * seed),
                            "--out", str(result)], check=True, capture_output=True, timeout=1800, env=child_env())
            scores.append(float(json.loads(result.read_text())["mean"]))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work)], cwd=clone, capture_output=True)
    return scores


def child_env() -> dict:
    """This environment for a child run: no AUTORL_ variable of ours leaks in, and the child imports
    from its own checkout (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORL_")}
    env["PYTHONPATH"] = ""
    return env


def embedded_agent_env() -> dict:
    """child_env for a daemon run that must stay on the embedded agent: no API key this shell may
    hold reaches it, so no benchmark run can call (or pay) a remote model."""
    env = child_env()
    env.pop("ANTHROPIC_API_KEY", None)
    return env


def better(best: list[float], start: list[float]) -> tuple[float, bool]:
    """(the one-sided Welch p that best > start, significant at 0.05)."""
    if best == start:
        return 1.0, False
    if np.std(best) == 0 and np.std(start) == 0:
        return (0.0, True) if np.mean(best) > np.mean(start) else (1.0, False)
    p = float(stats.ttest_ind(best, start, equal_var=False, alternative="greater").pvalue)
    return p, p < 0.05
