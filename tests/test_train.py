"""candidate/train.py's host path: a short real training run produces an artifact the harness scores,
within a budget counted from the process's start (measured from outside)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import evaluate
from tests.train_helpers import REPO, edited_copy, expected_torch_device, load_train, run_train, summary

HOST_BUDGET = 12  # seconds: torch, envpool and torch.optim's first use alone take ~5 s of it (the clock counts them)


def train(env_id, budget, out_dir, cwd=REPO, seed=1):
    # A private, empty verdict cache: no JAX backend is verified, so this is the host path
    # (the jax-e2e path is tested in test_train_jax.py).
    return run_train(env_id, budget, out_dir, out_dir / "verdicts", root=cwd, seed=seed)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1"])
def test_short_training_run_exports_a_loadable_policy(tmp_path, env_id):
    proc, wall_seconds = train(env_id, HOST_BUDGET, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = summary(proc.stdout)
    assert int(stats["env_steps"]) > 1000 and int(stats["updates"]) > 0
    assert float(stats["sps"]) == pytest.approx(int(stats["env_steps"]) / float(stats["training_seconds"]), rel=0.05)
    # the clock starts with the process: no iteration is begun that would end past the budget, and
    # exporting, checking the export and exiting follow within seconds
    assert float(stats["training_seconds"]) < float(stats["wall_seconds"]) <= HOST_BUDGET + 0.2
    assert wall_seconds <= HOST_BUDGET + 3
    assert "episode_return" in stats and stats["export_check"].startswith("ok")
    assert stats["path"] == "host" and stats["device"].startswith(expected_torch_device(load_train(env_id, 1, tmp_path)))
    result = evaluate.evaluate_policy(tmp_path / "policy.pt", env_id, episodes=3, seeds=0, workers=1)
    assert result["episodes"] == 3


def test_artifact_evaluates_with_candidate_deleted(tmp_path):
    # The reviewers' check: train in a copy of the repo, delete candidate/, evaluate.
    copy = tmp_path / "repo"
    (copy / "candidate").mkdir(parents=True)
    shutil.copy(REPO / "evaluate.py", copy / "evaluate.py")
    shutil.copytree(REPO / "envs_fast", copy / "envs_fast", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "candidate" / "train.py", copy / "candidate" / "train.py")
    proc, _ = train("CartPole-v1", 16, copy / "out", cwd=copy)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shutil.rmtree(copy / "candidate")
    shutil.rmtree(copy / "envs_fast")
    ev = subprocess.run([sys.executable, "evaluate.py", "--policy", "out/policy.pt", "--env", "CartPole-v1",
                         "--episodes", "10"], cwd=copy, capture_output=True, text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr
    # some ten seconds of PPO already balance far better than chance (about 22).
    assert json.loads(ev.stdout.strip().splitlines()[-1])["mean"] > 100


def test_broken_env_id_fails_clearly(tmp_path):
    proc, _ = train("NoSuchEnv-v9", 2, tmp_path)
    assert proc.returncode != 0
    assert "unknown env id 'NoSuchEnv-v9'" in proc.stderr


def test_the_host_paths_adam_steps_exactly_as_torch_optim_adam(tmp_path):
    import torch

    train = load_train("Pendulum-v1", 1, tmp_path)
    torch.manual_seed(0)
    ours, theirs = (train.Agent(3, 1, discrete=False) for _ in range(2))
    theirs.load_state_dict(ours.state_dict())
    optimizers = [train.Adam(ours.parameters(), lr=3e-4, eps=1e-5),
                  torch.optim.Adam(theirs.parameters(), lr=3e-4, eps=1e-5)]
    x = torch.randn(64, 3)
    for step in range(30):
        for agent, optimizer in zip((ours, theirs), optimizers):
            optimizer.param_groups[0]["lr"] = 3e-4 * (1 - step / 30)  # annealed as train.py anneals it
            optimizer.zero_grad()
            (agent.value(x).square().mean() + agent.distribution(x).log_prob(torch.ones(64, 1)).mean()).backward()
            optimizer.step()
    for mine, reference in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(mine, reference)


def test_a_killed_host_run_goes_on_from_its_checkpoint(tmp_path):
    """Verification's L4 trains for hours on a slow port (the JAX BipedalWalker's: ~3 h a run). With
    AUTORL_CHECKPOINT_DIR the host path saves its training; a run killed midway (SIGKILL, no warning) goes
    on from its last checkpoint, with the same counters, to the same step budget, and exports a policy."""
    import os
    import signal
    import time

    import torch

    per_update = 32 * 256  # NUM_ENVS x NUM_STEPS: at most this many env steps per update
    budget_steps = 8 * per_update
    checkpoint_dir = tmp_path / "checkpoint"
    # the torch learner, as L4 sets it for a JAX translation (a 600 s budget would pick jax-host)
    checkout = edited_copy(tmp_path / "checkout", {'\nLEARNER = "auto"': '\nLEARNER = "torch"'})
    env = {key: value for key, value in os.environ.items() if key != "AUTORL_JAX_CACHE_DIR"}
    env.update(AUTORL_ENV_ID="CartPole-v1", AUTORL_TIME_BUDGET="600", AUTORL_OUTPUT_DIR=str(tmp_path),
               AUTORL_SEED="1", AUTORL_VERIFY_CACHE=str(tmp_path / "verdicts"), AUTORL_MAX_ENV_STEPS=str(budget_steps),
               AUTORL_CHECKPOINT_DIR=str(checkpoint_dir), AUTORL_CHECKPOINT_SECONDS="0")
    command = [sys.executable, str(checkout / "candidate" / "train.py")]
    first = subprocess.Popen(command, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    checkpoint = checkpoint_dir / "host.pt"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and first.poll() is None:
        if checkpoint.exists() and torch.load(checkpoint, weights_only=False)["counters"][1] >= 2:
            break
        time.sleep(0.2)
    assert first.poll() is None, "the run ended before it was killed: " + first.stdout.read()[-2000:]
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    first.stdout.close()
    saved_steps, saved_updates, _ = torch.load(checkpoint, weights_only=False)["counters"]
    assert 2 <= saved_updates < 8 and 0 < saved_steps < budget_steps

    second = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"resumed from {checkpoint}: {saved_steps} env steps, {saved_updates} updates" in second.stdout
    first_update = next(line for line in second.stdout.splitlines() if line.startswith("update "))
    assert first_update.startswith(f"update {saved_updates + 1} ")
    stats = summary(second.stdout)
    assert int(stats["resumed_at"]) == saved_steps and stats["path"] == "host"
    assert budget_steps - per_update < int(stats["env_steps"]) <= budget_steps
    assert int(stats["updates"]) > saved_updates and stats["export_check"].startswith("ok")
    assert evaluate.evaluate_policy(tmp_path / "policy.pt", "CartPole-v1", episodes=2, seeds=0, workers=1)["episodes"] == 2


def test_a_host_checkpoint_brings_back_the_networks_adam_and_the_normalisers(tmp_path):
    import torch

    train = load_train("Pendulum-v1", 1, tmp_path)
    torch.manual_seed(0)
    agent = train.Agent(3, 1, discrete=False)
    optimizer = train.Adam(agent.parameters(), lr=3e-4)
    obs_rms, return_rms = train.RunningMeanStd((3,)), train.RunningMeanStd(())
    x = torch.randn(64, 3)
    for _ in range(3):
        optimizer.zero_grad()
        agent.value(x).square().mean().backward()
        optimizer.step()
    obs_rms.update(x.numpy())
    return_rms.update(np.arange(5.0))
    saver = train.HostCheckpoint(tmp_path)
    saver.save(agent, optimizer, obs_rms, return_rms, np.ones(4), (1234, 3, [1.0, 2.0]))

    torch.manual_seed(1)
    fresh = train.Agent(3, 1, discrete=False)
    fresh_optimizer = train.Adam(fresh.parameters(), lr=3e-4)
    fresh_obs, fresh_return = train.RunningMeanStd((3,)), train.RunningMeanStd(())
    counters, discounted = train.HostCheckpoint(tmp_path).restore(fresh, fresh_optimizer, fresh_obs, fresh_return, "cpu")
    assert counters == (1234, 3, [1.0, 2.0]) and np.array_equal(discounted, np.ones(4))
    for mine, saved in zip(fresh.parameters(), agent.parameters()):
        assert torch.equal(mine, saved)
    assert fresh_optimizer.steps == 3
    for mine, saved in zip(fresh_optimizer.exp_avg + fresh_optimizer.exp_avg_sq, optimizer.exp_avg + optimizer.exp_avg_sq):
        assert torch.equal(mine, saved)
    assert np.array_equal(fresh_obs.mean, obs_rms.mean) and fresh_return.count == return_rms.count
    assert train.HostCheckpoint(tmp_path / "none").restore(fresh, fresh_optimizer, fresh_obs, fresh_return, "cpu") is None
