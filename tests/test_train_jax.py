"""candidate/train.py's jax-e2e path: a verified JAX backend is trained end to end under jit and
exported as the same TorchScript artifact as the jax-host path.

The verdict cache is private to each test; "verified" means a cached passing verdict for the shipped
translation, which is exactly what `envs_fast.choose_backend` reads (verification itself is tested in
test_envs_fast_verify.py)."""
from __future__ import annotations


import re

import numpy as np
import pytest

import evaluate
from envs_fast.backends.load import load_functional
from envs_fast.backends.jax_vector import JaxVectorEnv
from policy_export import export_policy
from tests.train_helpers import TRANSLATIONS, load_train, run_train, store_passing_verdicts, summary


@pytest.fixture
def verified(tmp_path, monkeypatch):
    """A private verdict cache in which the shipped CartPole and Pendulum translations pass."""
    monkeypatch.setenv("AUTORL_VERIFY_CACHE", str(tmp_path / "cache"))
    return store_passing_verdicts(tmp_path / "cache")


def train_process(env_id, budget, out_dir, cache_dir, extra_env=None):
    """The summary of a train.py run (a real process, as the daemon runs it) and its wall time from outside."""
    proc, wall_seconds = run_train(env_id, budget, out_dir, cache_dir, extra_env=extra_env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return summary(proc.stdout), wall_seconds


def end_to_end(train, env_id):
    """train.py's jax-e2e training of `env_id`'s shipped translation, its weights drawn as main draws them."""
    problem = train.Problem(env_id)
    params = train.init_params(problem, np.random.default_rng(1))
    return problem, train.train_end_to_end(str(TRANSLATIONS[env_id]), problem, params)


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
    spec, _ = train.plumbing.choose_backend(train.BACKEND, env_id, train.NUM_ENVS)
    assert spec == str(TRANSLATIONS[env_id]) and train.plumbing.is_jax_functional(spec)
    problem, training = end_to_end(train, env_id)
    state = training.state
    for _ in range(15):  # enough to move the weights and the observation statistics
        state, metrics = training.iterate(state, 0.0)
    assert int(metrics["env_steps"]) > 0
    obs_mean, obs_var = np.asarray(state["obs_rms"][0]), np.asarray(state["obs_rms"][1])
    assert np.abs(obs_mean).max() > 1e-3 and np.abs(obs_var - 1).max() > 1e-3  # statistics really baked in
    act, _ = train.trained_policy(problem, training.learner, state)
    export_policy(act, np.stack([problem.obs_space.sample() for _ in range(2)]), tmp_path / "policy.pt")

    policy = evaluate.load_policy(tmp_path / "policy.pt")
    act_jax = jax.jit(act)
    obs = reference_observations(env_id)
    exported, in_jax = policy(obs), np.asarray(act_jax(obs))
    assert exported.shape == in_jax.shape
    if problem.discrete:
        assert np.mean(exported == in_jax) >= 0.99  # argmax may flip only on an exact float tie
    else:
        np.testing.assert_allclose(exported, in_jax, atol=1e-4)

    seeds = list(range(100, 110))
    harness = evaluate.evaluate_policy(tmp_path / "policy.pt", env_id, episodes=10, seeds=seeds, workers=1)
    np.testing.assert_allclose(harness["returns"], play(act_jax, env_id, seeds), rtol=1e-3)


def test_the_jax_path_learns_cartpole_within_its_budget_and_reuses_its_compilation(tmp_path, verified):
    """CartPole in 12 s, the clock from the process's start (imports and compiling count, ~6 s on a quiet
    2-core machine; 10 s already reach 500 there, 12 leave room for a loaded one): the artifact balances
    the pole; the process ends soon after the budget, measured from outside; a second run of the same
    code with the same $AUTORL_JAX_CACHE_DIR reads every compiled program back instead of compiling it."""
    import jax

    budget, jax_cache = 12, tmp_path / "jax-cache"
    stats, wall_seconds = train_process("CartPole-v1", budget, tmp_path / "first", verified,
                                        {"AUTORL_JAX_CACHE_DIR": str(jax_cache)})
    assert stats["path"] == "jax-e2e" and stats["backend"] == str(TRANSLATIONS["CartPole-v1"])
    assert stats["device"] == jax.devices()[0].platform
    # no update was launched that would overrun (on a machine so loaded that compiling alone overran, none was)
    assert float(stats["wall_seconds"]) <= budget + 0.2 or int(stats["updates"]) == 0
    assert wall_seconds <= budget + 3  # then the export, its check and the exit
    assert 0 < float(stats["compile_seconds"]) < float(stats["wall_seconds"])
    assert int(stats["updates"]) > 0 and stats["export_check"].startswith("ok")
    assert float(stats["sps"]) == pytest.approx(int(stats["env_steps"]) / float(stats["training_seconds"]), rel=0.05)
    result = evaluate.evaluate_policy(tmp_path / "first" / "policy.pt", "CartPole-v1", episodes=10, seeds=100,
                                      workers=1)
    assert result["mean"] >= 400, result["returns"]

    compiled = sorted(p.name for p in jax_cache.glob("*-cache"))
    read, written = map(int, re.fullmatch(r"(\d+) read, (\d+) compiled", stats["compile_cache"]).groups())
    assert read == 0 and written == len(compiled) > 0
    # the same budget: a shorter one, on a loaded machine, ended before the update's first call and so
    # never needed the update's programs (2 of 12 read)
    again, _ = train_process("CartPole-v1", budget, tmp_path / "second", verified,
                             {"AUTORL_JAX_CACHE_DIR": str(jax_cache)})
    # every program the second run needed was read back, none compiled (how much time that saves is
    # bench/compile_cost.py's figure, not a unit test's)
    assert int(again["updates"]) > 0, again
    assert again["compile_cache"] == f"{len(compiled)} read, 0 compiled"
    assert sorted(p.name for p in jax_cache.glob("*-cache")) == compiled


@pytest.mark.parametrize("env_id, action, ends_by, steps", [
    ("CartPole-v1", 0, "terminated", 60),  # always left: every episode falls within ~10 steps
    ("MountainCar-v0", 0, "truncated", 402),  # always left never reaches the flag: the 200-step limit
])
def test_env_step_matches_the_vector_adapter_step_for_step(tmp_path, env_id, action, ends_by, steps):
    """train.py's own env_step (NEXT_STEP autoreset, time limit) against envs_fast's JaxVectorEnv over
    episodes that end by termination and by truncation. Each step starts both from the adapter's states,
    so that the fresh starts (drawn differently) agree too."""
    import jax

    train = load_train(env_id, 60, tmp_path)
    _, training = end_to_end(train, env_id)
    n = train.JAX_NUM_ENVS
    adapter = JaxVectorEnv(load_functional(str(TRANSLATIONS[env_id]), env_id), n, seed=0)
    adapter.reset(seed=0)
    env_step = jax.jit(training.env_step)
    actions = np.full(n, action, np.int32)
    elapsed, needs_reset, ended = np.zeros(n, np.int32), np.zeros(n, bool), np.zeros(n, int)
    for t in range(steps):
        obs, _, reward, terminated, elapsed, done = map(np.asarray, env_step(
            np.array([t, 7], np.uint32), adapter._state, elapsed, needs_reset, actions))
        truncated = done & ~terminated
        expected = adapter.step(actions)
        stepped = ~needs_reset  # the others were reset instead: another random start than the adapter's
        np.testing.assert_allclose(obs[stepped], expected[0][stepped], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(reward, expected[1])
        np.testing.assert_array_equal(terminated, expected[2])
        np.testing.assert_array_equal(truncated, expected[3])
        np.testing.assert_array_equal(elapsed, np.asarray(adapter._elapsed))
        np.testing.assert_array_equal(done, np.asarray(adapter._needs_reset))
        assert not (terminated if ends_by == "truncated" else truncated).any()
        ended += truncated if ends_by == "truncated" else terminated
        needs_reset = done
    assert ended.min() >= 2  # every env ended (and was reset) at least twice, the expected way


def test_without_a_verified_jax_backend_training_steps_envpool_from_the_host(tmp_path):
    import jax

    stats, _ = train_process("CartPole-v1", 15, tmp_path / "out", tmp_path / "empty-cache")  # imports count
    assert stats["path"] == "jax-host" and stats["backend"] == "envpool"
    assert stats["device"] == jax.devices()[0].platform and int(stats["env_steps"]) > 0
    assert (tmp_path / "out" / "policy.pt").is_file()


def test_bench_reports_what_training_will_see(tmp_path, verified, monkeypatch):
    """envs_fast.bench's train_sps: the end-to-end rollout at train.py's JAX_NUM_ENVS for a JAX backend
    (train.py trains it end to end); for a host backend the jax-host loop (a compiled JAX policy over
    NUM_ENVS envs, x JAX_HOST_ENVS_FACTOR from a budget of JAX_HOST_BIG_BATCH_BUDGET)."""
    from envs_fast.bench import bench

    train = load_train("CartPole-v1", 10, tmp_path)
    jax_result = bench("CartPole-v1", "jax", num_envs=256, seconds=0.3, adapter_num_envs=8)
    assert jax_result["train_path"] == "jax-e2e" and jax_result["e2e_num_envs"] == train.JAX_NUM_ENVS
    assert jax_result["train_sps"] == jax_result["e2e_sps"] > jax_result["adapter_sps"] > 0
    for budget, envs in ((train.JAX_HOST_BIG_BATCH_BUDGET / 2, train.NUM_ENVS),
                         (train.JAX_HOST_BIG_BATCH_BUDGET, train.NUM_ENVS * train.JAX_HOST_ENVS_FACTOR)):
        monkeypatch.setenv("AUTORL_TIME_BUDGET", str(budget))
        jax_host = bench("CartPole-v1", "envpool", num_envs=16, seconds=0.3, figures="train")
        assert jax_host["train_path"] == "jax-host" and jax_host["host_num_envs"] == envs and jax_host["train_sps"] > 0
        assert jax_host["e2e_sps"] is None and jax_host["host_sps"] == jax_host["train_sps"]


def test_running_statistics_keep_counting_past_a_billion_samples(tmp_path, verified):
    """The JAX path's running statistics keep their sample count as a float32 pair: past ~1e8 samples a
    single float32 rounds each rollout's increment (2016 steps, 1937, ...); the pair keeps it exact.
    Here the return statistics, whose increments are the rollout's valid steps."""
    import jax

    train = load_train("CartPole-v1", 60, tmp_path)
    _, training = end_to_end(train, "CartPole-v1")
    state = dict(training.state, ret_rms=(*training.state["ret_rms"][:2], np.float32(1e9), np.float32(0.0)))
    increments = []
    for _ in range(20):
        state, metrics = training.iterate(state, 1.0)
        increments.append(int(metrics["env_steps"]))
    _, var, count_hi, count_lo = jax.device_get(state["ret_rms"])
    assert float(count_hi) + float(count_lo) == 1e9 + sum(increments)
    single = np.float32(1e9)
    for increment in increments:
        single = np.float32(single + np.float32(increment))
    assert float(single) != 1e9 + sum(increments)  # what one float32 would have counted
    assert np.isfinite(var) and var > 0
