"""The mjx backend (envs_fast/mujoco/mjx.py) against real gymnasium MuJoCo v5 envs, on the real MJX
(the mujoco-mjx package) and JAX. MJX is not the reference's engine and computes in float32, so steps
agree within a tolerance, not bit for bit (ABSOLUTE, RELATIVE below). Also: an XML MJX does not implement is refused naming the feature,
portability lists both engine backends, and choose_backend ranks mjx by its measured speed."""
from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco.mjx", reason="mujoco-mjx is not installed")
jax = pytest.importorskip("jax")

import envs_fast  # noqa: E402
from envs_fast import cache  # noqa: E402
from envs_fast.mujoco.mjx import MjxEnv  # noqa: E402
from envs_fast.portability import engine_backends, no_port_reason  # noqa: E402

pytestmark = [pytest.mark.usefixtures("private_cache"), pytest.mark.filterwarnings("ignore::UserWarning")]

# float32 against the reference's float64, per element: absolute plus relative to the reference's value
ABSOLUTE, RELATIVE = 1e-4, 1e-3


def within(mine, theirs) -> np.ndarray:
    mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
    return np.abs(mine - theirs) <= ABSOLUTE + RELATIVE * np.abs(theirs)


@pytest.fixture(scope="module")
def hopper():
    env = MjxEnv("Hopper-v5")
    yield env, jax.jit(env.reset), jax.jit(env.step)
    env.close()


@pytest.mark.slow
def test_hopper_steps_from_synced_states_match_gymnasium_within_float32_tolerance(hopper):
    """Along real episodes (random actions, half outside the ctrl range, reset on termination), each mjx
    step from the state read off gymnasium gives gymnasium's observation, reward, termination and next
    state (qpos, qvel) within ABSOLUTE + RELATIVE x |reference|; the hopper falls, so termination itself is compared, and it
    lands, so steps with contacts are too."""
    env, _, step = hopper
    reference = gym.make("Hopper-v5")
    reference.action_space.seed(2)
    reference.reset(seed=2)
    terminations = contacts = 0
    for t in range(150):
        state = env.state_from_reference(reference)
        action = reference.action_space.sample() * 2
        obs, reward, terminated, _, _ = reference.unwrapped.step(action)
        contacts += reference.unwrapped.data.ncon > 0
        b_obs, b_state, b_reward, b_terminated = step(jax.random.PRNGKey(0), state, action)
        after = env.state_from_reference(reference)
        assert within(b_obs, obs).all(), (t, np.asarray(b_obs) - obs)
        assert within(b_reward, reward), (t, float(b_reward), reward)
        assert bool(b_terminated) == terminated, t
        assert within(b_state.qpos, after.qpos).all() and within(b_state.qvel, after.qvel).all(), t
        if terminated:
            terminations += 1
            reference.reset(seed=100 + t)
    assert terminations > 0 and contacts > 0


def test_a_wrong_dynamics_is_caught_by_that_tolerance(hopper):
    """The tolerance is tight enough to matter: the same step with the hopper's state nudged by 0.01 in one
    joint velocity (a small physics error) differs from gymnasium's beyond it."""
    env, _, step = hopper
    reference = gym.make("Hopper-v5")
    reference.reset(seed=3)
    state = env.state_from_reference(reference)
    action = np.zeros(3, np.float32)
    obs, *_ = reference.unwrapped.step(action)
    nudged = state._replace(qvel=state.qvel + np.eye(len(state.qvel))[3] * 1e-2)
    b_obs, *_ = step(jax.random.PRNGKey(0), nudged, action)
    assert not within(b_obs, obs).all()


@pytest.mark.slow
def test_the_constraint_solve_stops_where_c_mujoco_stops(hopper):
    """From a reset state (warm start zero) with no action, a Hopper joint limit is active inside the RK4
    stages and C MuJoCo 4's Newton solver stops after one iteration (Newton decrement 3.3e-10 < tolerance
    1e-8), 4e-4 short of the exact minimum in qacc; the backend's solve (c_solve) stops there too, so the
    warm start it hands the next step is gymnasium's within the verifier's base tolerance, where MJX's own
    solver (which takes the second iteration) misses it by 10x that (bench/results/mjx-solver-2026-11-27.txt)."""
    env, _, step = hopper
    assert env.solver == "c"
    stock = MjxEnv("Hopper-v5", solver="mjx")
    stock_step = jax.jit(stock.step)
    worst = {"c": 0.0, "mjx": 0.0}
    for seed in (2, 3, 4):
        reference = gym.make("Hopper-v5")
        reference.reset(seed=seed)
        state = env.state_from_reference(reference)
        action = np.zeros(3, np.float32)
        reference.unwrapped.step(action)
        after = env.state_from_reference(reference).qacc_warmstart
        allowed = 1e-5 + 1e-4 * np.abs(after)
        for name, stepper in (("c", step), ("mjx", stock_step)):
            warm = np.asarray(stepper(jax.random.PRNGKey(0), state, action)[1].qacc_warmstart, np.float64)
            worst[name] = max(worst[name], float(np.max(np.abs(warm - after) / allowed)))
    stock.close()
    assert worst["c"] < 1 and worst["mjx"] > 3, worst


@pytest.mark.slow
def test_ant_steps_match_gymnasium_to_1e_9_in_float64():
    """Under float64 (jax.enable_x64, this test only) the backend is C MuJoCo 4.0's algorithm: Ant-v5 steps
    from states read off gymnasium along random actions (through contacts and resets) give gymnasium's next
    qpos, qvel, qacc_warmstart, observation and reward within 1e-9 x max(|reference|, 1). Ant's RK4 moves its
    free joint's quaternion by C's Runge-Kutta-Munthe-Kaas rule (MJX's plain RK4 was 1e-4 off in qpos,
    0.2 in qacc_warmstart), and its float32 ctrl cost is numpy's to the bit
    (bench/results/mjx-ant-rk4-2026-11-27.txt). JAX's in-memory caches are cleared at each mode switch:
    jax 0.10.2 reuses nested jits (jnp.tril's) compiled for float32 under float64 and fails to lower."""
    jax.clear_caches()
    try:
        with jax.enable_x64(True):
            env = MjxEnv("Ant-v5")
            step = jax.jit(env.step)
            reference = gym.make("Ant-v5")
            reference.action_space.seed(5)
            reference.reset(seed=5)
            worst, contacts = {}, 0
            for t in range(30):
                state = env.state_from_reference(reference)
                action = reference.action_space.sample()
                obs, reward, terminated, _, _ = reference.unwrapped.step(action)
                contacts += reference.unwrapped.data.ncon > 0
                after = env.state_from_reference(reference)
                b_obs, b_state, b_reward, _ = step(jax.random.PRNGKey(0), state, action)
                for name, mine, theirs in (("qpos", b_state.qpos, after.qpos), ("qvel", b_state.qvel, after.qvel),
                                           ("qacc_warmstart", b_state.qacc_warmstart, after.qacc_warmstart),
                                           ("obs", b_obs, obs), ("reward", b_reward, reward)):
                    mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
                    deviation = np.max(np.abs(mine - theirs) / np.maximum(np.abs(theirs), 1.0))
                    worst[name] = max(worst.get(name, 0.0), float(deviation))
                if terminated:
                    reference.reset(seed=100 + t)
            env.close()
    finally:
        jax.clear_caches()
    assert contacts > 0
    assert max(worst.values()) < 1e-9, worst


@pytest.mark.slow
def test_a_wrong_mjx_model_fails_l2_naming_the_field(monkeypatch):
    """The verifier's L2 on mjx is not blind: the same backend over a Hopper whose joint damping is 30%
    higher fails `step from rollout states`, and the report names the differing fields."""
    import copy

    from envs_fast.mujoco import mjx as mjx_backend
    from envs_fast.verify import verify
    from envs_fast.verify.context import Settings

    def wrong(env_id):
        env = MjxEnv(env_id)
        model = copy.deepcopy(env._reference.unwrapped.model)
        model.dof_damping[:] = model.dof_damping * 1.3
        env.mjx_model = mjx_backend.put_model(model)
        return env.functional()

    monkeypatch.setattr(mjx_backend, "load_mjx", wrong)
    settings = Settings(l2_target=200, rollout_steps=60, reset_samples=50, state_reset_samples=50)
    report = verify("Hopper-v5", "mjx", levels=(2,), settings=settings, use_cache=False)
    assert not report.passed
    text = report.to_text()
    assert "[FAIL] step from rollout states" in text
    assert "state.qvel[" in text or "obs[" in text, text


def test_hopper_reset_is_gymnasiums_reset_rule(hopper):
    """reset draws qpos and qvel uniform in +-reset_noise_scale around init (as hopper_v5.reset_model does),
    different for different keys, and observes the reset state as gymnasium does (the same state written
    into gymnasium observes the same)."""
    env, reset, _ = hopper
    reference = gym.make("Hopper-v5")
    reference.reset(seed=0)
    rules = env.rules
    observations = []
    for seed in range(4):
        obs, state = reset(jax.random.PRNGKey(seed))
        assert np.all(np.abs(np.asarray(state.qpos) - rules.init_qpos) <= rules.noise + 1e-7)
        assert np.all(np.abs(np.asarray(state.qvel) - rules.init_qvel) <= rules.noise + 1e-7)
        reference.unwrapped.set_state(np.asarray(state.qpos, np.float64), np.asarray(state.qvel, np.float64))
        assert within(obs, reference.unwrapped._get_obs()).all()
        observations.append(np.asarray(obs).tobytes())
    assert len(set(observations)) == 4


def register_hopper_with_implicit_integrator(tmp_path: Path) -> str:
    """Hopper-v5's Python over its XML with the implicit integrator, which MJX does not implement."""
    from gymnasium.envs.mujoco import hopper_v5

    xml = Path(hopper_v5.__file__).parent / "assets" / "hopper.xml"
    text = xml.read_text()
    assert 'integrator="RK4"' in text
    variant = tmp_path / "hopper_implicit.xml"
    variant.write_text(text.replace('integrator="RK4"', 'integrator="implicit"'))
    env_id = "HopperImplicitTest-v5"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="gymnasium.envs.mujoco.hopper_v5:HopperEnv", max_episode_steps=1000,
                     kwargs={"xml_file": str(variant)})
    return env_id


def test_verify_refuses_an_xml_mjx_does_not_implement_naming_the_feature(tmp_path, capsys):
    """Bad input: verification exits 2 and names what MJX lacks (put_model's NotImplementedError); training
    takes no mjx for that env."""
    from envs_fast.verify import main

    env_id = register_hopper_with_implicit_integrator(tmp_path)
    assert main(["--env", env_id, "--backend", "mjx", "--levels", "1"]) == 2
    error = capsys.readouterr().err
    assert "MJX does not implement" in error and "mjINT_IMPLICIT" in error and env_id in error
    assert envs_fast.choose_backend(env_id, 8) != "mjx"
    assert envs_fast.training_refusal("mjx", env_id) is not None


def test_humanoid_is_refused_naming_the_pgs_solver_its_xml_asks_for(capsys):
    """gymnasium's humanoid.xml sets solver="PGS", which MJX does not implement: refused at load, before
    anything compiles, so Humanoid trains on mujoco_batch or the reference."""
    from envs_fast.verify import main

    assert main(["--env", "Humanoid-v5", "--backend", "mjx", "--levels", "1"]) == 2
    assert "mjSOL_PGS" in capsys.readouterr().err


def test_an_env_mjx_does_not_cover_is_refused_in_one_line(capsys):
    from envs_fast.verify import main

    assert main(["--env", "Swimmer-v5", "--backend", "mjx", "--levels", "1"]) == 2
    error = capsys.readouterr().err
    assert "mjx does not cover 'Swimmer-v5'" in error


def test_portability_knows_both_engine_backends():
    """MuJoCo envs mujoco_batch translates run on both engines here; other envs on neither. With MJX
    installed a MuJoCo env is translatable (no reason against porting it)."""
    for env_id in ("Hopper-v5", "HalfCheetah-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"):
        assert engine_backends(env_id) == ["mujoco_batch", "mjx"]
        assert no_port_reason(env_id) is None
    assert engine_backends("CartPole-v1") == [] and engine_backends("Swimmer-v5") == []


def test_setup_verifies_mjx_only_where_training_has_a_gpu(autorl_repo):
    from orchestrator.shipped import shipped_specs
    from orchestrator.workspace import Workspace

    workspace = Workspace(autorl_repo(), "specs")
    commit = workspace.start_commit()
    cpu = {"machine": {"cpu": "x", "cpus": 2, "arch": "x86_64", "gpus": ""}}
    h100 = {"machine": {"cpu": "x", "cpus": 8, "arch": "x86_64", "gpus": "NVIDIA H100 80GB HBM3"}}
    assert shipped_specs("Hopper-v5", workspace, commit, cpu) == ["mujoco_batch"]
    assert shipped_specs("Hopper-v5", workspace, commit, h100) == ["mujoco_batch", "mjx"]


def test_choose_backend_trains_mjx_only_verified_and_where_it_is_fastest():
    """Both verified: the measured train_sps decides, as on this CPU (mujoco_batch faster) and on a GPU
    (mjx faster); a failed mjx verdict never trains."""
    env_id = "Hopper-v5"
    assert envs_fast.choose_backend(env_id, 16) != "mjx"  # no verdict yet
    for spec in ("mujoco_batch", "mjx"):
        cache.store_verdict(spec, env_id, [1, 2, 3], True, "passed (test)")
    cache.store_throughput("mujoco_batch", env_id, 16, 4e4)
    cache.store_throughput("mjx", env_id, 16, 1e4)
    assert envs_fast.choose_backend(env_id, 16) == "mujoco_batch"
    cache.store_throughput("mjx", env_id, 16, 1e6)
    assert envs_fast.choose_backend(env_id, 16) == "mjx"
    assert envs_fast.training_refusal("mjx", env_id) is None
    cache.store_verdict("mjx", env_id, [1, 2, 3], False, "failed (test)")
    assert envs_fast.choose_backend(env_id, 16) == "mujoco_batch"


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Ant-v5"])
def test_the_batched_mjx_step_calls_no_lapack(env_id):
    """Batched LAPACK calls (jax.scipy's Cholesky lowers to lapack_spotrf_ffi on CPU) split their batch over
    XLA's CPU thread pool from inside it; two at once on 2 cores wait for each other forever, which hung
    HalfCheetah's and Ant's 1000-env steps. The vector env's whole step lowers to no LAPACK custom call."""
    import jax.numpy as jnp

    env = envs_fast.make_vec_env("mjx", env_id, 4, seed=0, verified_only=False)
    env.reset(seed=0)
    actions = jnp.zeros((4,) + env.single_action_space.shape, jnp.float32)
    text = env._step_fn.lower(env._key, env._state, env._elapsed, env._needs_reset, actions).as_text()
    assert "custom_call" in text or "stablehlo" in text  # a real lowering of the step
    assert "lapack" not in text.lower(), sorted(set(line.strip()[:120] for line in text.splitlines() if "lapack" in line))


def test_c_cholesky_solves_like_numpy_and_floors_a_singular_diagonal_as_c_does():
    """chol_factor / chol_solve (mju_cholFactor / mju_cholSolve in JAX ops): on a symmetric positive definite
    matrix they solve as numpy does; a zero pivot is raised to mjMINVAL (C's rule) instead of NaN."""
    from envs_fast.mujoco.c_solver import MJ_MINVAL, chol_factor, chol_solve

    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        a = rng.normal(size=(9, 9))
        spd, b = a @ a.T + 9 * np.eye(9), rng.normal(size=9)
        lower = np.asarray(jax.jit(chol_factor)(spd))
        np.testing.assert_allclose(lower, np.linalg.cholesky(spd), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(jax.jit(chol_solve)(lower, b)), np.linalg.solve(spd, b), rtol=1e-10)
        singular = np.zeros((3, 3))
        singular[0, 0] = 4.0
        assert np.asarray(chol_factor(singular))[1, 1] == np.sqrt(MJ_MINVAL)
    jax.clear_caches()  # jax 0.10 reuses nested jits across x64 switches (see jax_batched.Float64Twin)


def test_an_ant_reset_keeps_its_noised_quaternion_unnormalised_as_gymnasium_does():
    """gymnasium's Ant reset adds uniform noise to qpos, the torso's quaternion included, and mj_forward
    leaves qpos as given: the observed quaternion's norm spreads around 1 (sd ~0.058 at noise 0.1). MJX's
    kinematics writes normalised quaternions back; the backend's reset must not pass that on."""
    env = MjxEnv("Ant-v5")
    obs, state = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 200))
    norms = np.linalg.norm(np.asarray(state.qpos)[:, 3:7], axis=1)
    reference = gym.make("Ant-v5")
    reference_norms = [np.linalg.norm(reference.reset(seed=s)[0][1:5]) for s in range(200)]
    reference.close()
    assert np.std(reference_norms) > 0.04  # what gymnasium does
    assert np.std(norms) > 0.04, np.std(norms)
    np.testing.assert_array_equal(np.asarray(obs)[:, 1:5], np.asarray(state.qpos)[:, 3:7])
