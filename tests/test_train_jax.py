"""candidate/train.py's jax-e2e path: a verified JAX backend is trained end to end under jit and
exported as the same TorchScript artifact as the host path.

The verdict cache is private to each test; "verified" means a cached passing verdict for the shipped
translation, which is exactly what `envs_fast.choose_backend` reads (verification itself is tested in
test_envs_fast_verify.py)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import evaluate
from envs_fast import cache

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "candidate" / "train.py"
TRANSLATIONS = {"CartPole-v1": REPO / "envs_fast" / "cartpole_v1.py",
                "Pendulum-v1": REPO / "envs_fast" / "pendulum_v1.py"}


@pytest.fixture
def verified(tmp_path, monkeypatch):
    """A private verdict cache in which the shipped CartPole and Pendulum translations pass."""
    monkeypatch.setenv("AUTORL_VERIFY_CACHE", str(tmp_path / "cache"))
    for env_id, path in TRANSLATIONS.items():
        cache.store_verdict(str(path), env_id, [1, 2, 3], True, "test verdict")
    return tmp_path / "cache"


def load_train(env_id, budget, out_dir):
    """candidate/train.py as a fresh module, its run constants set as the daemon's variables would."""
    spec = importlib.util.spec_from_file_location(f"train_{uuid.uuid4().hex[:8]}", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ENV_ID, module.TIME_BUDGET, module.SEED, module.OUTPUT_DIR = env_id, budget, 1, Path(out_dir)
    return module


def train_process(env_id, budget, out_dir, cache_dir):
    env = dict(os.environ, AUTORL_ENV_ID=env_id, AUTORL_TIME_BUDGET=str(budget), AUTORL_OUTPUT_DIR=str(out_dir),
               AUTORL_SEED="1", AUTORL_VERIFY_CACHE=str(cache_dir))
    proc = subprocess.run([sys.executable, str(TRAIN)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=budget + 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(line.split(": ", 1) for line in proc.stdout.split("\n---\n", 1)[1].strip().splitlines())


def reference_observations(env_id, count=512, seed=0):
    """Observations the policy really meets: random-action rollouts of the reference env."""
    env = evaluate.make_env(env_id, seed=seed)
    obs, _ = env.reset(seed=seed)
    batch = []
    while len(batch) < count:
        batch.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    return np.stack(batch).astype(np.float32)


def play(act, env_id, seeds):
    """Episode returns of a policy (observation batch -> actions) on the reference env, as the harness plays."""
    returns = []
    for seed in seeds:
        env = evaluate.make_env(env_id)
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action = np.asarray(act(np.asarray(obs, np.float32)[None]))[0]
            if hasattr(env.action_space, "low"):
                action = np.clip(action, env.action_space.low, env.action_space.high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])  # Discrete and Box actions
def test_the_export_acts_and_scores_as_the_policy_trained_in_jax(tmp_path, verified, env_id):
    import jax

    train = load_train(env_id, 60, tmp_path)
    spec, _ = train.choose_backend()
    assert spec == str(TRANSLATIONS[env_id]) and train.is_jax_functional(spec)
    problem = train.Problem(env_id)
    agent = train.Agent(problem.obs_dim, problem.act_dim, problem.discrete)
    training = train.make_jax_training(spec, problem, agent)
    update = jax.jit(training.update)
    state = training.state
    for _ in range(15):  # enough to move the weights and the observation statistics
        state, metrics = update(state, np.float32(train.JAX_LEARNING_RATE), np.float32(0.0))
    assert int(metrics["env_steps"]) > 0
    obs_mean, obs_var = training.to_torch(state, agent)
    assert np.abs(obs_mean).max() > 1e-3 and np.abs(obs_var - 1).max() > 1e-3  # statistics really baked in
    train.export(problem, agent, obs_mean, obs_var, tmp_path / "policy.pt")

    policy = evaluate.load_policy(tmp_path / "policy.pt")
    act_jax = jax.jit(training.act)
    obs = reference_observations(env_id)
    exported, in_jax = policy(obs), np.asarray(act_jax(state, obs))
    assert exported.shape == in_jax.shape
    if problem.discrete:
        assert np.mean(exported == in_jax) >= 0.99  # argmax may flip only on an exact float tie
    else:
        np.testing.assert_allclose(exported, in_jax, atol=1e-4)

    seeds = list(range(100, 110))
    harness = evaluate.evaluate_policy(tmp_path / "policy.pt", env_id, episodes=10, seeds=seeds, workers=1)
    np.testing.assert_allclose(harness["returns"], play(lambda o: act_jax(state, o), env_id, seeds), rtol=1e-3)


def test_the_jax_path_keeps_the_budget_with_compilation_counted(tmp_path, verified):
    budget = 10
    stats = train_process("CartPole-v1", budget, tmp_path, verified)
    assert stats["path"] == "jax-e2e" and stats["backend"] == str(TRANSLATIONS["CartPole-v1"])
    assert stats["device"] == "cpu"
    compile_seconds, seconds = float(stats["compile_seconds"]), float(stats["training_seconds"])
    assert 0 < compile_seconds <= seconds  # the clock runs from before compilation
    if compile_seconds < budget - 1:  # on a loaded machine compilation alone may take the budget
        assert int(stats["updates"]) > 0 and int(stats["env_steps"]) > 0
        assert seconds <= budget + 0.5  # no update was launched that would overrun
    else:
        assert int(stats["updates"]) == 0
    assert float(stats["sps"]) == pytest.approx(int(stats["env_steps"]) / seconds, rel=0.02, abs=1)
    result = evaluate.evaluate_policy(tmp_path / "policy.pt", "CartPole-v1", episodes=3, seeds=0, workers=1)
    assert result["episodes"] == 3


def test_without_a_verified_jax_backend_training_takes_the_host_path(tmp_path):
    stats = train_process("CartPole-v1", 2, tmp_path / "out", tmp_path / "empty-cache")
    assert stats["path"] == "host" and stats["backend"] == "envpool" and stats["device"] == "cpu"
    assert "compile_seconds" not in stats and int(stats["env_steps"]) > 0
    assert (tmp_path / "out" / "policy.pt").is_file()


def test_bench_reports_what_training_will_see(tmp_path, verified):
    """envs_fast.bench's train_sps: the end-to-end rollout at train.py's JAX_NUM_ENVS for a JAX backend
    (train.py trains it end to end), the host loop (adapter plus a torch policy) for a host backend."""
    from envs_fast.bench import bench

    train = load_train("CartPole-v1", 10, tmp_path)
    jax_result = bench("CartPole-v1", "jax", num_envs=256, seconds=0.3, adapter_num_envs=8)
    assert jax_result["train_path"] == "jax-e2e" and jax_result["e2e_num_envs"] == train.JAX_NUM_ENVS
    assert jax_result["train_sps"] == jax_result["e2e_sps"] > jax_result["adapter_sps"] > 0
    host_result = bench("CartPole-v1", "envpool", num_envs=16, seconds=0.3, adapter_num_envs=8)
    assert host_result["train_path"] == "host" and host_result["e2e_sps"] is None
    # the host loop samples each step's actions from a torch policy: slower than the bare adapter
    assert host_result["train_sps"] == host_result["host_sps"] and 0 < host_result["host_sps"] < host_result["adapter_sps"]
