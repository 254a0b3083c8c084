"""The mujoco_batch backend (envs_fast/mujoco/batch.py) against real gymnasium MuJoCo v5 envs on the real
mujoco.batch: the same engine, so every comparison here is bit for bit (np.array_equal, ==), not within a
tolerance. One step from synced states, reset noise per seed, the VectorEnv's NEXT_STEP autoreset and
time limit against gymnasium's own SyncVectorEnv, the spec's plumbing, and the one-line refusal."""
from __future__ import annotations


import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco.batch", reason="mujoco >= 4.0 (mujoco.batch) is not installed")

import envs_fast  # noqa: E402
from envs_fast import cache  # noqa: E402
from envs_fast.mujoco.batch import MujocoBatchBackend, make_mujoco_batch_vec_env  # noqa: E402
from envs_fast.mujoco.locomotion import RULES  # noqa: E402
from envs_fast.verify.probes import flat_values, numpy_tree  # noqa: E402
from envs_fast.protocol import BackendError  # noqa: E402

pytestmark = [pytest.mark.usefixtures("private_cache"), pytest.mark.filterwarnings("ignore::UserWarning")]

ENV_IDS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]


@pytest.fixture(scope="module")
def backends():
    made = {env_id: MujocoBatchBackend(env_id) for env_id in ENV_IDS}
    yield made
    for backend in made.values():
        backend.close()


def batched(state):
    return type(state)(*(np.asarray(value)[None] for value in state))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_one_step_from_a_synced_state_is_gymnasiums_bit_for_bit(backends, env_id):
    """Along a real episode (random actions, reset on termination), each step of the backend from the
    state read off the reference equals the reference's step: observation, reward, terminated and the
    next state, exactly. Humanoid and Ant exercise contacts and cfrc_ext; Hopper and Walker2d fall."""
    backend, reference = backends[env_id], gym.make(env_id)
    reference.action_space.seed(1)
    reference.reset(seed=1)
    terminations = 0
    for t in range(40):
        state = numpy_tree(backend.state_from_reference(reference))
        action = reference.action_space.sample() * 2  # half of them outside the ctrl range: MuJoCo clamps
        obs, reward, terminated, _, _ = reference.unwrapped.step(action)
        b_obs, b_state, b_reward, b_terminated = backend.step(np.zeros(1), batched(state), action[None])
        assert np.array_equal(b_obs[0], obs), (env_id, t, np.flatnonzero(b_obs[0] != obs))
        assert b_reward[0] == reward and b_reward.dtype == np.float64, (env_id, t, b_reward[0], reward)
        assert bool(b_terminated[0]) == terminated, (env_id, t)
        assert np.array_equal(flat_values(b_state), flat_values(backend.state_from_reference(reference))), (env_id, t)
        if terminated:
            terminations += 1
            reference.reset(seed=100 + t)
    if env_id in ("Hopper-v5", "Walker2d-v5"):
        assert terminations > 0  # termination itself was compared, not only healthy steps


def test_a_state_written_to_gymnasium_steps_the_same_as_the_backend(backends):
    """The sync goes both ways: a backend state (mid-episode, warm start and the derived mass centre
    included) written into a fresh gymnasium env with state_to_reference steps like the backend."""
    backend = backends["Humanoid-v5"]
    obs, state = backend.reset(np.array([3], np.uint32))
    actions = np.full((1, 17), 0.3, np.float32)
    for _ in range(5):
        obs, state, reward, terminated = backend.step(np.zeros(1), state, actions)
    reference = gym.make("Humanoid-v5")
    reference.reset(seed=0)
    backend.state_to_reference(type(state)(*(np.asarray(v)[0] for v in state)), reference)
    ref_obs, ref_reward, ref_terminated, _, _ = reference.unwrapped.step(actions[0])
    b_obs, _, b_reward, b_terminated = backend.step(np.zeros(1), state, actions)
    assert np.array_equal(b_obs[0], ref_obs) and b_reward[0] == ref_reward and b_terminated[0] == ref_terminated


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_noise_is_gymnasiums_for_every_seed(backends, env_id):
    """reset(seeds)[i] is gymnasium's reset(seed=seeds[i]): the same draws of the same distribution (uniform
    qpos noise; uniform or scaled normal qvel noise, as each env's reset_model draws it), bit for bit."""
    seeds = np.array([0, 1, 2, 12345, 2**32 - 1], np.uint32)
    obs, state = backends[env_id].reset(seeds)
    reference = gym.make(env_id)
    for i, seed in enumerate(seeds):
        assert np.array_equal(obs[i], reference.reset(seed=int(seed))[0]), (env_id, seed)
    assert len({row.tobytes() for row in obs}) == len(seeds)  # the seed matters
    rules = backends[env_id].rules
    assert np.all(np.abs(state.qpos - rules.init_qpos) <= rules.noise)  # uniform in +-scale around init_qpos


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5", "HalfCheetah-v5", "Humanoid-v5"])
def test_vector_env_is_gymnasiums_sync_vector_env_across_autoresets(env_id):
    """The VectorEnv against gym.make_vec (SyncVectorEnv, NEXT_STEP autoreset) under the same seed and
    actions: every observation, reward and flag equal, through episodes ending and resetting (the reset
    noise drawn from each env's continuing generator, as gymnasium's env.reset() draws it)."""
    n = 3
    mine = make_mujoco_batch_vec_env(env_id, n, seed=0)
    theirs = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync")
    assert mine.metadata["autoreset_mode"] == theirs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    assert mine.single_observation_space == theirs.single_observation_space
    assert mine.single_action_space == theirs.single_action_space
    obs_a, _ = mine.reset(seed=5)
    obs_b, _ = theirs.reset(seed=5)
    assert np.array_equal(obs_a, obs_b)
    theirs.action_space.seed(5)
    ended = 0
    for t in range(120):
        action = theirs.action_space.sample()
        a, b = mine.step(action), theirs.step(action)
        for name, x, y in zip(("obs", "reward", "terminated", "truncated"), a[:4], b[:4]):
            assert np.array_equal(x, y), (env_id, t, name, x, y)
        ended += int(np.sum(b[2]))
    if env_id == "Hopper-v5":
        assert ended >= 2  # random actions topple the hopper: autoresets were compared


def test_time_limit_truncates_then_the_next_step_resets():
    """HalfCheetah never terminates: step 1000 is truncated (the registered limit), step 1001 returns the
    reset observation with reward 0 and both flags False, as gymnasium's vector env does."""
    mine = make_mujoco_batch_vec_env("HalfCheetah-v5", 2, seed=0)
    theirs = gym.make_vec("HalfCheetah-v5", num_envs=2, vectorization_mode="sync")
    mine.reset(seed=9)
    theirs.reset(seed=9)
    action = np.zeros((2, 6), np.float32)
    for t in range(1, 1002):
        a, b = mine.step(action), theirs.step(action)
        assert all(np.array_equal(x, y) for x, y in zip(a[:4], b[:4])), t
        if t < 1000:
            assert not a[3].any()
    # the last step was the reset step: reward 0, flags False, a fresh observation
    assert not a[2].any() and not a[3].any() and np.all(a[1] == 0)


def test_an_env_it_does_not_cover_is_refused_in_one_line():
    for env_id in ("CartPole-v1", "Swimmer-v5"):
        with pytest.raises(BackendError) as caught:
            envs_fast.make_vec_env("mujoco_batch", env_id, 2, seed=0)
        message = str(caught.value)
        assert "\n" not in message and "mujoco_batch does not cover" in message and env_id in message
    assert set(RULES) == set(ENV_IDS)


def test_verify_refuses_an_uncovered_env_with_exit_2(capsys):
    from envs_fast.verify import main

    assert main(["--env", "Swimmer-v5", "--backend", "mujoco_batch", "--levels", "1"]) == 2
    assert "mujoco_batch does not cover 'Swimmer-v5'" in capsys.readouterr().err


def test_choose_backend_trains_on_it_once_verified_and_benchmarked():
    env_id = "Hopper-v5"
    assert envs_fast.choose_backend(env_id, 16) != "mujoco_batch"  # no verdict yet: never chosen
    cache.store_verdict("mujoco_batch", env_id, [1, 2, 3], True, "passed (test)")
    cache.store_throughput("mujoco_batch", env_id, 16, 1e9)
    assert envs_fast.choose_backend(env_id, 16) == "mujoco_batch"
    assert envs_fast.training_refusal("mujoco_batch", env_id) is None
    cache.store_verdict("mujoco_batch", env_id, [1, 2, 3], False, "failed (test)")
    assert envs_fast.choose_backend(env_id, 16) != "mujoco_batch"
    assert "failed verification" in envs_fast.training_refusal("mujoco_batch", env_id)
