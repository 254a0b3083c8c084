"""candidate/train.py's jax-host path: a vector env that is not functional JAX (a verified Rust
translation, envpool, gymnasium's) stepped from a Python loop, the rollout learnt from by the one JAX
learner the jax-e2e path uses, and exported as the same TorchScript artifact.

"Verified" means a cached passing verdict for the shipped translation in a verdict cache private to
each test, which is what `envs_fast.choose_backend` reads (verification itself is tested in
test_envs_fast_verify.py and test_envs_fast_rust.py)."""
from __future__ import annotations

import numpy as np
import pytest

import evaluate
from envs_fast import cache
from envs_fast.rust.build import rustc_available
from tests.train_helpers import REPO, TRANSLATIONS, load_train, run_train, summary

CARTPOLE_RS = REPO / "envs_fast" / "translations" / "cartpole_v1.rs"
needs_rustc = pytest.mark.skipif(not rustc_available(), reason="rustc not found on PATH")


@pytest.fixture
def rust_verified(tmp_path, monkeypatch):
    """A private verdict cache in which the shipped CartPole Rust translation passes, its library built
    there beforehand (as run setup leaves it: no training run compiles Rust in its budget)."""
    from envs_fast.rust.backend import load_rust

    cache_dir = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV_VAR, str(cache_dir))
    cache.store_verdict(str(CARTPOLE_RS), "CartPole-v1", [1, 2, 3], True, "test verdict")
    load_rust(CARTPOLE_RS, "CartPole-v1")
    return cache_dir


def train_process(budget, out_dir, cache_dir, root=REPO):
    proc, wall_seconds = run_train("CartPole-v1", budget, out_dir, cache_dir, root=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return summary(proc.stdout), wall_seconds, proc.stdout


@needs_rustc
def test_jax_host_learns_cartpole_on_its_rust_translation_within_its_budget(tmp_path, rust_verified):
    """The verified Rust translation is trained by the JAX learner. The clock counts imports and the
    compile (6-10 s on 2 busy cores; 30 s reached 500 on envpool there); the artifact balances the pole;
    the process ends soon after the budget."""
    budget = 30
    stats, wall_seconds, _ = train_process(budget, tmp_path / "out", rust_verified)
    assert stats["path"] == "jax-host" and stats["backend"] == str(CARTPOLE_RS)
    assert int(stats["updates"]) > 0 and stats["export_check"].startswith("ok")
    assert 0 < float(stats["compile_seconds"]) < float(stats["wall_seconds"])
    # no iteration was launched that would overrun; then the export, its check and the exit
    assert float(stats["wall_seconds"]) <= budget + 0.2
    assert wall_seconds <= budget + 5
    assert float(stats["sps"]) == pytest.approx(int(stats["env_steps"]) / float(stats["training_seconds"]), rel=0.05)
    result = evaluate.evaluate_policy(tmp_path / "out" / "policy.pt", "CartPole-v1", episodes=10, seeds=100, workers=1)
    assert result["mean"] >= 400, result["returns"]


def test_the_path_follows_the_backend_and_end_to_end(tmp_path):
    """jax-e2e for a functional JAX backend, jax-host for Rust, envpool and gymnasium; END_TO_END = False
    steps a JAX backend from the host too; the jax-host envs grow by JAX_HOST_ENVS_FACTOR from a budget of
    JAX_HOST_BIG_BATCH_BUDGET."""
    train = load_train("CartPole-v1", 60, tmp_path)
    specs = (str(TRANSLATIONS["CartPole-v1"]), "gymnax", str(CARTPOLE_RS), "envpool", "reference")
    assert [train.choose_path(spec) for spec in specs] == ["jax-e2e", "jax-e2e", "jax-host", "jax-host", "jax-host"]
    train.END_TO_END = False
    assert {train.choose_path(spec) for spec in specs} == {"jax-host"}
    assert train.host_num_envs() == train.NUM_ENVS
    train.TIME_BUDGET = train.JAX_HOST_BIG_BATCH_BUDGET
    assert train.host_num_envs() == train.NUM_ENVS * train.JAX_HOST_ENVS_FACTOR


def replayed(spec, env_id, num_envs, seed, env_actions):
    """What a fresh vector env of `spec` returns, step after step, for the given actions."""
    envs = evaluate.make_vec_env(env_id, num_envs, seed, backend=spec)
    first, _ = envs.reset(seed=seed)
    steps = [envs.step(actions)[:4] for actions in env_actions]
    envs.close()
    return first, steps


@pytest.mark.parametrize("env_id, spec", [
    pytest.param("CartPole-v1", str(CARTPOLE_RS), marks=needs_rustc),  # Discrete actions, terminations
    ("Pendulum-v1", "envpool"),  # Box actions (clipped for the env), time-limit truncations
])
def test_the_rollout_sees_the_vector_envs_transitions_and_the_learner_counts_them(tmp_path, monkeypatch, env_id, spec):
    """The jax-host rollout against a fresh vector env of the same backend and seed replayed with the env
    actions it sent: the same observations, rewards and flags, step for step; its log-probabilities are
    those of the actions under the policy that acted; and `learn` counts the rollout as the vector env's
    flags say (the NEXT_STEP reset steps left out, finished episodes and their returns)."""
    import jax

    monkeypatch.setenv(cache.CACHE_ENV_VAR, str(tmp_path / "cache"))
    train = load_train(env_id, 60, tmp_path)
    train.NUM_ENVS, train.NUM_STEPS = 4, 256  # CartPole ends episodes, Pendulum truncates at 200 steps
    problem = train.Problem(env_id)
    params = train.init_params(problem, np.random.default_rng(1))
    training = train.train_from_host(spec, problem, params)
    T, N = train.NUM_STEPS, train.NUM_ENVS
    buffers = training.rollout(training.state, lambda t: False)
    training.envs.close()
    obs, actions, logp, reward = buffers["raw_obs"], buffers["actions"], buffers["logp"], buffers["reward"]
    terminated, truncated = buffers["terminated"], buffers["truncated"]

    if problem.discrete:
        env_actions = actions[..., 0].astype(np.int64)
    else:
        env_actions = np.clip(actions, problem.act_space.low, problem.act_space.high)
        assert (env_actions != actions).any()  # some actions were clipped for the env, the raw ones learnt from
    first, steps = replayed(spec, env_id, N, train.SEED, env_actions)
    np.testing.assert_array_equal(obs[0], first)
    for t, (next_obs, step_reward, step_terminated, step_truncated) in enumerate(steps):
        np.testing.assert_array_equal(obs[t + 1], next_obs, err_msg=f"step {t}")
        np.testing.assert_array_equal(reward[t], step_reward.astype(np.float32), err_msg=f"step {t}")
        np.testing.assert_array_equal(terminated[t], step_terminated, err_msg=f"step {t}")
        np.testing.assert_array_equal(truncated[t], step_truncated, err_msg=f"step {t}")
    done = terminated | truncated
    assert done.sum() >= N and (truncated if spec == "envpool" else terminated).any()

    # the policy that acted: the initial weights, on observations the fresh statistics leave unscaled
    x = np.asarray(train.features(problem, obs[:-1].reshape((T * N,) + obs.shape[2:]), training.state["obs_rms"]))
    taken = actions.reshape(T * N, -1)[:, 0].astype(np.int32) if problem.discrete else actions.reshape(T * N, -1)
    expected, _ = train.log_prob_entropy(problem, params, train.mlp(params["actor"], x), taken)
    np.testing.assert_allclose(logp.reshape(-1), np.asarray(expected), rtol=1e-4, atol=1e-4)

    _, metrics = training.learn(jax.tree_util.tree_map(np.array, training.state), buffers, np.float32(0.0),
                                np.float32(0.0))
    valid = ~np.concatenate([np.zeros((1, N), bool), done[:-1]])  # a step after an episode's end is a reset
    returns, episode_return = [], np.zeros(N)
    for t in range(T):
        episode_return += reward[t]
        returns += list(episode_return[done[t]])
        episode_return[done[t]] = 0.0
    assert int(metrics["env_steps"]) == valid.sum() < T * N
    assert int(metrics["episodes"]) == done.sum() == len(returns)
    assert float(metrics["return_sum"]) == pytest.approx(sum(returns), rel=1e-5)


def test_the_bench_measures_the_path_and_envs_train_py_takes(tmp_path, monkeypatch):
    """envs_fast.bench reads train.py as text (it imports no candidate code) to measure the rollout of
    the path train.py's choose_path takes: the two must agree for END_TO_END, every budget and backend."""
    import re

    from envs_fast.bench import train_path

    shipped = (REPO / "candidate" / "train.py").read_text()
    specs = ["envpool", "reference", "mujoco_batch", "envs_fast/translations/cartpole_v1.rs", "envs_fast/translations/cartpole_v1.py", "gymnax"]
    for end_to_end in (True, False):
        root = tmp_path / str(end_to_end)
        (root / "candidate").mkdir(parents=True)
        text, count = re.subn(r"^END_TO_END = .*$", f"END_TO_END = {end_to_end}", shipped, count=1, flags=re.M)
        assert count == 1
        (root / "candidate" / "train.py").write_text(text)
        for budget in (10, 30, 120, 480, 720):
            monkeypatch.setenv("AUTORL_TIME_BUDGET", str(budget))
            train = load_train("CartPole-v1", budget, tmp_path / "out", path=root / "candidate" / "train.py")
            for spec in specs:
                path = train.choose_path(spec)
                envs = train.host_num_envs() if path == "jax-host" else train.NUM_ENVS
                assert train_path(spec, root) == (path, envs), (end_to_end, budget, spec)
