"""The VectorEnv adapter over JAX backends, the verdict cache and the benchmark (backend choice: test_envs_fast_choose.py)."""
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

import envs_fast
from envs_fast import cache, protocol
from envs_fast.backends.load import BackendError
from envs_fast.bench import bench, main as bench_main

pytestmark = pytest.mark.usefixtures("private_cache")

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("env_id", ["CartPole-v1", "MountainCarContinuous-v0"])
def test_adapter_passes_vector_env_checks(env_id):
    reference = gym.make(env_id)
    venv = envs_fast.make_vec_env("jax", env_id, 6, seed=3)
    assert isinstance(venv, VectorEnv) and venv.num_envs == 6
    assert venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert venv.single_observation_space == reference.observation_space
    assert venv.single_action_space == reference.action_space
    assert venv.observation_space == batch_space(reference.observation_space, 6)
    assert venv.action_space == batch_space(reference.action_space, 6)

    obs, info = venv.reset(seed=11)
    assert isinstance(info, dict) and venv.observation_space.contains(obs)
    first = obs.copy()
    for _ in range(300):
        obs, reward, terminated, truncated, info = venv.step(venv.action_space.sample())
        assert venv.observation_space.contains(obs)
        assert reward.shape == (6,) and reward.dtype == np.float64
        assert terminated.shape == truncated.shape == (6,)
        assert terminated.dtype == truncated.dtype == bool
        assert isinstance(info, dict)
    assert np.array_equal(first, venv.reset(seed=11)[0])  # returned arrays are not reused in place

    def trajectory(seed):
        env = envs_fast.make_vec_env("jax", env_id, 6, seed=seed)
        env.action_space.seed(0)
        out = [env.reset(seed=seed)[0]]
        for _ in range(50):
            out.append(env.step(env.action_space.sample())[:4])
        return out

    assert data_equivalence(trajectory(5), trajectory(5), exact=True)
    assert not data_equivalence(trajectory(5), trajectory(6))
    with pytest.raises(RuntimeError, match="reset"):
        envs_fast.make_vec_env("jax", env_id, 2, seed=0).step(np.zeros((2,) + reference.action_space.shape))


def _run(venv, actions):
    venv.reset(seed=0)
    records = [venv.step(action) for action in actions]
    venv.close()
    return records


@pytest.mark.parametrize("env_id, action", [("Pendulum-v1", [0.0]), ("MountainCar-v0", 1)])
def test_truncation_and_autoreset_match_gymnasium_sync_vector_env(env_id, action):
    """Time-limited episodes end on the same steps as in gymnasium's SyncVectorEnv, and the step
    after each is an autoreset (reset observation, reward 0, no flags) in both."""
    n, steps = 3, 450
    actions = [np.array([action] * n, dtype=np.float32 if isinstance(action, list) else np.int64)] * steps
    ours = _run(envs_fast.make_vec_env("jax", env_id, n, seed=0), actions)
    theirs = _run(gym.make_vec(env_id, num_envs=n, vectorization_mode="sync"), actions)
    for name, index in (("terminated", 2), ("truncated", 3)):
        assert np.array_equal(np.stack([r[index] for r in ours]), np.stack([r[index] for r in theirs])), name
    truncation_steps = [t for t, r in enumerate(ours) if r[3].all()]
    assert truncation_steps == [199, 400]  # 200 steps, one autoreset step, 200 steps
    for records in (ours, theirs):
        for t in truncation_steps:
            obs, reward, terminated, truncated, _ = records[t + 1]
            assert np.all(reward == 0) and not terminated.any() and not truncated.any()


def test_termination_autoreset_pattern_matches_reference():
    n, steps = 4, 120
    actions = [np.ones(n, dtype=np.int64)] * steps  # always push right: short episodes
    for records in (_run(envs_fast.make_vec_env("jax", "CartPole-v1", n, seed=0), actions),
                    _run(gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync"), actions)):
        ended = 0
        for t in range(steps - 1):
            done = records[t][2] | records[t][3]
            obs, reward, terminated, truncated, _ = records[t + 1]
            ended += done.sum()
            assert np.all(reward[done] == 0) and not terminated[done].any() and not truncated[done].any()
            assert np.all(np.abs(obs[done]) <= 0.05)  # a fresh reset observation
            assert np.all(reward[~done] == 1.0)
        assert ended >= n * 5


def test_record_episode_statistics_over_the_adapter():
    venv = gym.wrappers.vector.RecordEpisodeStatistics(envs_fast.make_vec_env("jax", "CartPole-v1", 4, seed=0))
    venv.reset(seed=0)
    returns = []
    for _ in range(200):
        _, _, _, _, info = venv.step(venv.action_space.sample())
        if "episode" in info:
            mask = info["_episode"]
            returns.extend(info["episode"]["r"][mask])
            assert np.array_equal(info["episode"]["r"][mask], info["episode"]["l"][mask])  # reward 1 per step
    assert len(returns) > 10 and 8 <= np.mean(returns) <= 60


def test_make_vec_env_specs():
    path = str(REPO / "envs_fast" / "translations" / "cartpole_v1.py")
    for spec in ("jax", "translation", path, "gymnax", "envpool", "reference"):
        venv = envs_fast.make_vec_env(spec, "CartPole-v1", 3, seed=0)
        assert isinstance(venv, VectorEnv) and venv.num_envs == 3, spec
        assert venv.single_observation_space.shape == (4,)
        obs, _ = venv.reset(seed=0)
        assert obs.shape == (3, 4) and obs.dtype == np.float32
        venv.close()
    with pytest.raises(BackendError, match="does not exist"):
        envs_fast.make_vec_env("jax", "LunarLander-v3", 2, seed=0)  # no translation shipped
    with pytest.raises(BackendError, match="envpool does not support"):
        envs_fast.make_vec_env("envpool", "Taxi-v4", 2, seed=0)
    with pytest.raises(BackendError, match="unknown environment id"):
        envs_fast.make_vec_env("jax", "Nope-v0", 2, seed=0)
    with pytest.raises(ValueError, match="outside"):
        venv = envs_fast.make_vec_env("jax", "CartPole-v1", 2, seed=0)
        venv.reset()
        venv.step(np.array([0, 2]))
    assert envs_fast.slug("CartPole-v1") == "cartpole_v1" and envs_fast.slug("ALE/Pong-v5") == "ale_pong_v5"


def test_bench_reports_backend_reference_and_adapter_throughput(tmp_path):
    result = bench("CartPole-v1", "jax", num_envs=1024, seconds=0.3, adapter_num_envs=8)
    for key in ("backend_sps", "reference_sps", "reference_vec_sps", "adapter_sps", "ratio"):
        assert result[key] > 0, key
    assert result["ratio"] == pytest.approx(result["backend_sps"] / result["reference_sps"])
    assert result["backend_sps"] > 10 * result["reference_sps"]  # the point of a fast backend
    # What `auto` compares is how fast training goes: the end-to-end path where train.py has one.
    assert cache.cached_throughput(result["backend"], "CartPole-v1", 8) == result["train_sps"]
    assert result["train_sps"] == (result["e2e_sps"] if result["e2e_sps"] is not None else result["host_sps"])

    out = tmp_path / "bench.json"
    assert bench_main(["--env", "Pendulum-v1", "--backend", "jax", "--num-envs", "256", "--seconds", "0.2",
                       "--adapter-num-envs", "4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["num_envs"] == 256 and data["adapter_num_envs"] == 4 and data["ratio"] > 1
    assert bench_main(["--env", "Nope-v0", "--backend", "jax"]) == 2
    assert bench_main(["--env", "CartPole-v1", "--backend", "jax", "--num-envs", "0"]) == 2


def test_worktrees_share_the_main_checkouts_verdict_cache(tmp_path, monkeypatch):
    import git

    main = tmp_path / "main"
    repo = git.Repo.init(main)
    (main / "README").write_text("x")
    repo.index.add(["README"])
    repo.index.commit("init")
    repo.git.worktree("add", "--detach", str(main / "runs" / "tag"))
    assert protocol.main_checkout(main / "runs" / "tag") == main
    assert protocol.main_checkout(main) == main
    monkeypatch.delenv("AUTORL_VERIFY_CACHE")
    assert cache.cache_dir() == REPO / ".envs_fast_cache"
