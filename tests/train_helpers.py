"""Running candidate/train.py, or an edited copy of it, as the daemon runs it (a real subprocess with the
run's variables), for the tests of train.py."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "candidate" / "train.py"
FIXED_FILES = ("evaluate.py", "train_plumbing.py", "policy_export.py")  # what train.py imports beside envs_fast
TRANSLATIONS = {env_id: REPO / "envs_fast" / "translations" / f"{name}.py" for env_id, name in (
    ("CartPole-v1", "cartpole_v1"), ("Pendulum-v1", "pendulum_v1"), ("Acrobot-v1", "acrobot_v1"),
    ("MountainCar-v0", "mountaincar_v0"))}


def store_passing_verdicts(cache_dir: Path, env_ids=("CartPole-v1", "Pendulum-v1")) -> Path:
    """A verdict cache in which the shipped translations of `env_ids` pass (what run setup's verification
    leaves; verification itself is tested in test_envs_fast_verify.py)."""
    from envs_fast import cache

    previous = os.environ.get(cache.CACHE_ENV_VAR)
    os.environ[cache.CACHE_ENV_VAR] = str(cache_dir)
    try:
        for env_id in env_ids:
            cache.store_verdict(str(TRANSLATIONS[env_id]), env_id, [1, 2, 3], True, "test verdict")
    finally:
        if previous is None:
            del os.environ[cache.CACHE_ENV_VAR]
        else:
            os.environ[cache.CACHE_ENV_VAR] = previous
    return cache_dir


def run_train(env_id: str, budget: float, out_dir: Path, cache_dir: Path, root: Path = REPO, seed: int = 1,
              extra_env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """root/candidate/train.py run as the daemon runs it; returns the process and its wall time measured
    from outside (from just before the process starts until it has exited)."""
    env = {key: value for key, value in os.environ.items() if key != "AUTORL_JAX_CACHE_DIR"}
    env.update(AUTORL_ENV_ID=env_id, AUTORL_TIME_BUDGET=str(budget), AUTORL_OUTPUT_DIR=str(out_dir),
               AUTORL_SEED=str(seed), AUTORL_VERIFY_CACHE=str(cache_dir), **(extra_env or {}))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(root / "candidate" / "train.py")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=budget + 180)
    return proc, time.monotonic() - started


def summary(stdout: str) -> dict:
    """train.py's `key: value` lines after its last `---`."""
    tail = stdout.rsplit("\n---\n", 1)[1]
    return dict(line.split(": ", 1) for line in tail.strip().splitlines() if ": " in line)


def edited_copy(root: Path, replacements: dict[str, str]) -> Path:
    """A checkout at `root` (FIXED_FILES, envs_fast/, candidate/train.py) whose train.py has each `old`
    text replaced by its `new` one (each must occur in the shipped train.py)."""
    (root / "candidate").mkdir(parents=True)
    for name in FIXED_FILES:
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "envs_fast", root / "envs_fast", ignore=shutil.ignore_patterns("__pycache__", "target"))
    text = TRAIN.read_text()
    for old, new in replacements.items():
        assert old in text, f"train.py no longer contains {old!r}"
        text = text.replace(old, new)
    (root / "candidate" / "train.py").write_text(text)
    return root


def load_train(env_id: str, budget: float, out_dir: Path, path: Path = TRAIN):
    """train.py as a fresh module, its run constants set as the daemon's variables would."""
    spec = importlib.util.spec_from_file_location(f"train_{uuid.uuid4().hex[:8]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ENV_ID, module.TIME_BUDGET, module.SEED, module.OUTPUT_DIR = env_id, budget, 1, Path(out_dir)
    return module
