"""A code-writing agent translates only where a translation can pass: an env that steps a physics
engine with no port here (Box2D; MuJoCo without mujoco-mjx) is train-only by default, and says why."""
from __future__ import annotations

import importlib.util
import json

import pytest

from orchestrator.config import Options
from orchestrator.setup import plan_schedule
from tests.conftest import FAST, run_daemon

ALTERNATION = ["translate", "train", "train", "train", "train"]


@pytest.mark.parametrize("agent", ["anthropic", "command"])
def test_a_box2d_env_is_train_only_for_a_code_writing_agent(agent):
    for env_id in ("BipedalWalker-v3", "LunarLander-v3"):
        schedule, why = plan_schedule(Options(env_id=env_id), agent)
        assert schedule == ["train"]
        assert why.startswith("train only: ") and "Box2D" in why and "no JAX or Rust port" in why
        assert "--phases translate,train" in why


def test_phases_force_the_alternation_where_no_port_exists():
    schedule, why = plan_schedule(Options(env_id="BipedalWalker-v3", phases="translate,train"), "anthropic")
    assert schedule == ALTERNATION and why == "chosen with --phases/--schedule"


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="mujoco is not installed")
def test_a_mujoco_env_translates_only_where_mjx_is_installed():
    schedule, why = plan_schedule(Options(env_id="HalfCheetah-v5"), "anthropic")
    if importlib.util.find_spec("mujoco.mjx") is None:
        assert schedule == ["train"] and "MuJoCo" in why and "mujoco-mjx" in why
    else:
        assert schedule == ALTERNATION


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "CliffWalking-v1", "tests.endless_env:Endless-v0"])
def test_pure_python_envs_keep_the_alternation(env_id):
    schedule, why = plan_schedule(Options(env_id=env_id), "anthropic")
    assert schedule == ALTERNATION and "alternates" in why
    assert plan_schedule(Options(env_id=env_id), "optuna")[0] == ["train"]


def test_the_daemon_log_says_why_a_box2d_run_only_trains(autorl_repo):
    # The schedule is decided (and logged) at setup; a train.py that fails ends the run right after.
    repo = autorl_repo(train_py="import sys\nsys.exit('no training here')\n")
    # (--no-setup-verify: setup would verify the shipped Rust port of BipedalWalker first, minutes)
    proc = run_daemon(repo, "run", "--env", "BipedalWalker-v3", "--tag", "bw", "--agent", "command",
                      "--agent-cmd", "true {prompt_file}", "--budget", "2", "--max-experiments", "1", *FAST,
                      "--no-setup-verify", timeout=120)
    assert proc.returncode == 1 and "failed its baseline run" in proc.stderr, proc.stdout + proc.stderr
    run_dir = repo / "results" / "bw"
    assert json.loads((run_dir / "run.json").read_text())["schedule"] == ["train"]
    log = (run_dir / "daemon.log").read_text()
    assert "schedule: train (train only: BipedalWalker-v3 steps the Box2D physics engine" in log
