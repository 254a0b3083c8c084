"""A code-writing agent translates only where a translation can pass: an env that steps a physics
engine with no port here (Box2D without a shipped port of its scene; MuJoCo without mujoco-mjx) is
train-only by default, and says why; BipedalWalker's shipped Rust port makes it translatable where
rustc is installed."""
from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from orchestrator.config import Options
from orchestrator.setup import plan_schedule
from tests.conftest import CODING_AGENT_WALLS, FAST, run_daemon

ALTERNATION = ["translate", "train", "train", "train", "train"]


@pytest.mark.parametrize("agent", ["anthropic", "command"])
def test_a_box2d_env_without_a_port_is_train_only_for_a_code_writing_agent(agent):
    for env_id in ("LunarLander-v3", "CarRacing-v3"):
        schedule, why = plan_schedule(Options(env_id=env_id), agent)
        assert schedule == ["train"]
        assert why.startswith("train only: ") and "Box2D" in why and "no JAX or Rust port" in why
        assert "--phases translate,train" in why


@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc is not installed: the port cannot be built")
def test_bipedalwalker_alternates_on_its_shipped_port_and_trains_only_without_rustc(monkeypatch, tmp_path):
    schedule, why = plan_schedule(Options(env_id="BipedalWalker-v3"), "anthropic")
    assert schedule == ALTERNATION
    assert "Box2D scene is ported in envs_fast/translations/bipedalwalker_v3.rs" in why
    assert plan_schedule(Options(env_id="BipedalWalker-v3"), "optuna")[0] == ["train"]
    # a machine without rustc: the port cannot be built, so nothing could verify
    python_only = tmp_path / "bin"
    python_only.mkdir()
    (python_only / "git").symlink_to(shutil.which("git"))
    monkeypatch.setenv("PATH", str(python_only))
    schedule, why = plan_schedule(Options(env_id="BipedalWalker-v3"), "anthropic")
    assert schedule == ["train"]
    assert "its port envs_fast/translations/bipedalwalker_v3.rs is Rust and rustc is not on PATH" in why


def test_phases_force_the_alternation_where_no_port_exists():
    schedule, why = plan_schedule(Options(env_id="LunarLander-v3", phases="translate,train"), "anthropic")
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
    proc = run_daemon(repo, "run", "--env", "LunarLander-v3", "--tag", "ll", "--agent", "command",
                      "--agent-cmd", "true {prompt_file}", "--budget", "2", "--max-experiments", "1", *FAST, *CODING_AGENT_WALLS,
                      "--no-setup-verify", timeout=120)
    assert proc.returncode == 1 and "failed its baseline run" in proc.stderr, proc.stdout + proc.stderr
    run_dir = repo / "results" / "ll"
    assert json.loads((run_dir / "run.json").read_text())["schedule"] == ["train"]
    log = (run_dir / "daemon.log").read_text()
    assert "schedule: train (train only: LunarLander-v3 steps the Box2D physics engine" in log
