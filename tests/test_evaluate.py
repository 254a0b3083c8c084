"""The fixed harness: scoring hand-made TorchScript policies, refusing bad artifacts."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate
from tests import handmade_policies as hp

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args, cwd=REPO, harness=REPO / "evaluate.py"):
    return subprocess.run(
        [sys.executable, str(harness), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_known_cartpole_controller_scores_500(tmp_path):
    policy = hp.save(hp.CartPoleController(), tmp_path / "policy.pt")
    out = tmp_path / "e.json"
    proc = run_cli("--policy", policy, "--env", "CartPole-v1", "--episodes", 20, "--seed", 3, "--out", out)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads(out.read_text())
    assert result["mean"] == 500.0 and result["min"] == 500.0
    assert result["episodes"] == 20 and len(result["returns"]) == 20
    for key in ("mean", "std", "se", "iqm", "min", "max", "episodes", "returns"):
        assert key in result


def test_always_left_scores_badly(tmp_path):
    policy = hp.save(hp.AlwaysZero(), tmp_path / "policy.pt")
    result = evaluate.evaluate_policy(policy, "CartPole-v1", episodes=10, seeds=0, workers=1)
    assert result["max"] < 20


def test_statistics_match_the_returns(tmp_path):
    policy = hp.save(hp.PendulumEnergy(), tmp_path / "policy.pt")
    result = evaluate.evaluate_policy(policy, "Pendulum-v1", episodes=12, seeds=5, workers=1)
    returns = np.array(result["returns"])
    assert result["mean"] == pytest.approx(returns.mean())
    assert result["std"] == pytest.approx(returns.std(ddof=1))
    assert result["se"] == pytest.approx(returns.std(ddof=1) / np.sqrt(12))
    middle = np.sort(returns)[3:9]  # interquartile mean of 12 values: the middle six
    assert result["iqm"] == pytest.approx(middle.mean())
    assert result["min"] == returns.min() and result["max"] == returns.max()


def test_deterministic_given_seed_and_independent_of_worker_count(tmp_path):
    policy = hp.save(hp.PendulumEnergy(), tmp_path / "policy.pt")
    a = evaluate.evaluate_policy(policy, "Pendulum-v1", episodes=6, seeds=11, workers=1)
    b = evaluate.evaluate_policy(policy, "Pendulum-v1", episodes=6, seeds=11, workers=2)
    c = evaluate.evaluate_policy(policy, "Pendulum-v1", episodes=6, seeds=12, workers=1)
    assert a["returns"] == b["returns"]
    assert len(set(a["returns"])) > 1  # the returns do depend on the start state
    assert a["returns"] != c["returns"]
    assert a["returns"][1:] == c["returns"][:-1]  # episode i is seeded seed + i


@pytest.mark.parametrize("action, step_reward", [(100.0, 1.0), (-7.5, -1.0), (0.5, 0.5)])
def test_box_actions_are_clipped_to_the_bounds(tmp_path, action, step_reward):
    # An env that refuses out-of-bounds actions and pays the action as reward (Pendulum clips its
    # torque itself, so it could not tell): the harness clips to [-1, 1], and only out-of-bounds actions.
    from tests.action_echo_env import EPISODE_STEPS

    policy = hp.save(hp.ConstantAction([action]), tmp_path / "constant.pt")
    result = evaluate.evaluate_policy(policy, "tests.action_echo_env:ActionEchoEnv", episodes=3, seeds=0, workers=1)
    assert result["returns"] == [step_reward * EPISODE_STEPS] * 3


def test_discrete_observation_env(tmp_path):
    # FrozenLake's observation is Discrete(16): the policy receives [B] float indices.
    policy = hp.save(hp.DiscreteIndexPolicy(), tmp_path / "policy.pt")
    proc = run_cli("--policy", policy, "--env", "FrozenLake-v1", "--episodes", 10)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(r in (0.0, 1.0) for r in result["returns"])


def test_env_without_time_limit_is_capped(tmp_path):
    policy = hp.save(hp.AlwaysZero(), tmp_path / "policy.pt")
    proc = run_cli("--policy", policy, "--env", "tests.endless_env:Endless-v0", "--episodes", 2, "--workers", 1)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["lengths"] == [evaluate.MAX_EPISODE_STEPS] * 2
    assert result["mean"] == evaluate.MAX_EPISODE_STEPS


def test_torch_export_artifact_is_accepted(tmp_path):
    exported = torch.export.export(hp.CartPoleController(), (torch.zeros(2, 4),),
                                   dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = tmp_path / "policy.pt2"
    torch.export.save(exported, str(path))
    result = evaluate.evaluate_policy(path, "CartPole-v1", episodes=4, seeds=0, workers=1)
    assert result["mean"] == 500.0


@pytest.mark.parametrize(
    "make_artifact, reason",
    [
        (lambda d: d / "missing.pt", "not found"),
        (lambda d: (d / "garbage.pt").write_bytes(b"not a torch archive") and d / "garbage.pt", "unreadable"),
        # A pickled module would run candidate code on load: only TorchScript/export are accepted.
        (lambda d: torch.save(torch.nn.Linear(4, 2), d / "pickle.pt") or d / "pickle.pt", "unreadable"),
        (lambda d: hp.save(hp.WrongShape(), d / "shape.pt"), "output shape"),
        (lambda d: hp.save(hp.NaNActions(), d / "nan.pt"), "NaN"),
    ],
    ids=["missing", "garbage", "pickle", "wrong-shape", "nan"],
)
def test_bad_artifacts_are_refused_with_one_line_reason(tmp_path, make_artifact, reason):
    path = make_artifact(tmp_path)
    proc = run_cli("--policy", path, "--env", "Pendulum-v1", "--episodes", 2, "--out", tmp_path / "e.json")
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert reason in message and message.startswith("evaluate.py: error:")
    assert not (tmp_path / "e.json").exists()


def test_unknown_env_id_is_refused(tmp_path):
    policy = hp.save(hp.CartPoleController(), tmp_path / "policy.pt")
    proc = run_cli("--policy", policy, "--env", "NoSuchEnv-v9", "--episodes", 2)
    assert proc.returncode != 0
    assert "unknown env id 'NoSuchEnv-v9'" in proc.stderr


def test_loading_needs_no_candidate_code(tmp_path):
    # The harness copy alone in an empty folder (as the daemon runs it): no candidate/, no envs_fast/.
    shutil.copy(REPO / "evaluate.py", tmp_path / "evaluate.py")
    policy = hp.save(hp.CartPoleController(), tmp_path / "policy.pt")
    proc = run_cli("--policy", policy, "--env", "CartPole-v1", "--episodes", 4,
                   cwd=tmp_path, harness=tmp_path / "evaluate.py")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["mean"] == 500.0


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_make_vec_env_backends_share_spaces_and_autoreset(backend):
    envs = evaluate.make_vec_env("CartPole-v1", 4, seed=0, backend=backend)
    reference = evaluate.make_env("CartPole-v1")
    assert envs.single_observation_space == reference.observation_space
    assert envs.single_action_space == reference.action_space
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (4, 4)
    saw_done, just_done = False, None
    for _ in range(200):  # always-left episodes end within ~10 steps
        obs, reward, terminated, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
        if saw_done:
            # NEXT_STEP autoreset: the step after a done returns a fresh start state.
            assert np.all(np.abs(obs[just_done]) <= 0.05)
            break
        if terminated.any():
            saw_done, just_done = True, terminated.copy()
    assert saw_done
    envs.close()


def test_time_budget_and_env_id_follow_the_environment():
    code = "import evaluate; print(evaluate.TIME_BUDGET, evaluate.ENV_ID, evaluate.NUM_EVAL_EPISODES)"
    default = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"})
    assert default.stdout.split() == ["720", "BipedalWalker-v3", "100"]
    override = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "AUTORL_TIME_BUDGET": "30", "AUTORL_ENV_ID": "CartPole-v1"})
    assert override.stdout.split() == ["30", "CartPole-v1", "100"]
