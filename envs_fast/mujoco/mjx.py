"""`mjx`: gymnasium's MuJoCo v5 locomotion envs as functional JAX envs on MJX (`mujoco.mjx`).

Where `mujoco_batch` steps the reference's own C engine on CPU threads, this backend steps MuJoCo's JAX
port, so a whole env step (frame_skip substeps, the observation, reward and termination) is one pure
function that `jit` and `vmap` compile for any device: the backend for GPUs (on a CPU the bench ranks
it below mujoco_batch). It is a functional backend in the protocol's sense (`reset(key)`,
`step(key, state, action)`, state sync with the reference), so the verifier drives it through
`jax_batched.JaxBatched` and train.py's jax-e2e path trains it under jit like a JAX translation.

What each env computes around the physics is gymnasium's `*_v5.py`, the same rules `batch.py`
translates bit for bit in numpy; the constants (weights, healthy ranges, reset noise, frame_skip,
init_qpos) come from that module's `Rules`, read off a gymnasium instance. Unlike mujoco_batch the
engine is not the reference's: MJX computes in float32 unless `jax_enable_x64` is set, so steps agree
within tolerance, not bit for bit. Where MJX's algorithm is not C MuJoCo 4.0's the backend replaces it
(mjx_c_engine.py): the constraint solve (`c_solve`: C's warm start choice, stopping rules and line search; MJX's own stops
elsewhere) and capsule contacts (`c_fwd_position`); measured in docs/concepts/backends.md.
And RK4 on free and ball joints (`c_step`: C 4.0's Runge-Kutta-Munthe-Kaas orientations, its quaternion
rule; docs/concepts/backends.md), with which Ant's float64 steps are C's to 1e-12.

State (synced with the reference's MjData): time, qpos, qvel, qacc_warmstart (mjSTATE_FULLPHYSICS
plus the warm start, for these models) and, for Ant and Humanoid, the derived position the next step's
x velocity starts from (the main body's xpos, the bodies' xipos), as in mujoco_batch.

`mujoco.mjx` is the separate `mujoco-mjx` package (mujoco 4 no longer ships it). An env whose model
uses what MJX does not implement is refused when it loads, naming the feature (`put_model` raises
NotImplementedError saying which); such an env trains on mujoco_batch or the reference.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import os
import warnings
from pathlib import Path

import numpy as np

from envs_fast.mujoco.mjx_c_engine import c_forward, c_solver_covers, c_step
from envs_fast.protocol import BackendError, FunctionalBackend, check_env_id, slug

SPEC = "mjx"
# in the source hash: this file, its steps' physics and the envs' rules
SOURCES = tuple(Path(__file__).with_name(name) for name in ("mjx.py", "mjx_c_engine.py", "c_solver.py", "locomotion.py"))
JAX_CACHE_ENV = "AUTORL_JAX_CACHE_DIR"  # where train.py's runs keep compiled programs (runners/local.py)


def _mjx():
    """`mujoco.mjx`, quietly: its optional Warp bridge prints a line when warp-lang is absent."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        from mujoco import mjx
    return mjx


def rules_class(env_id: str):
    """mujoco_batch's Rules class for `env_id`: by id, or for an id registered on the entry point of
    one of those envs (the same Python over another XML, `xml_file=...`). None when uncovered."""
    import gymnasium

    from envs_fast.mujoco.locomotion import RULES

    if env_id in RULES:
        return RULES[env_id]
    try:
        entry = gymnasium.spec(env_id).entry_point
    except Exception:  # gymnasium raises several error types for unknown ids
        return None
    by_entry = {gymnasium.spec(known).entry_point: rules for known, rules in RULES.items()}
    return by_entry.get(entry) if isinstance(entry, str) else None


def refusal(env_id: str) -> str | None:
    """Why the mjx backend cannot run `env_id` here (one line), or None. Cheap: builds no model."""
    from envs_fast.mujoco.locomotion import RULES

    if rules_class(env_id) is None:
        return (f"mjx does not cover {env_id!r}: it translates gymnasium's {', '.join(RULES)} "
                f"(their v5 Python around the physics)")
    try:
        _mjx()
    except ImportError as exc:
        return f"mjx needs the mujoco-mjx package (pip install mujoco-mjx) ({exc})"
    return None


def use_compilation_cache() -> None:
    """Compile through JAX's persistent cache: the folder train.py's runs use ($AUTORL_JAX_CACHE_DIR)
    when set, else `jax-compilation/` in the verify cache. An MJX step of Hopper takes a minute or
    more to compile on a CPU; a second verification or benchmark of the same program reads it back."""
    import jax

    from envs_fast.cache import cache_dir

    if jax.config.jax_compilation_cache_dir:  # someone (train.py) chose already
        return
    folder = os.environ.get(JAX_CACHE_ENV) or str(cache_dir() / "jax-compilation")
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# ---------------------------------------------------------------- each env's Python, in JAX

def _x_position(rules, state, data):
    """The position x velocity is taken from, for `data` (after a step) or `state` (before it)."""
    import jax.numpy as jnp

    derived = getattr(rules, "derived", None)
    if derived == "xpos_main":
        return state.xpos_main[:2] if data is None else data.xpos[rules.main_body, :2]
    if derived == "xipos":
        xipos = state.xipos if data is None else data.xipos
        mass = jnp.asarray(rules.body_mass, xipos.dtype)[:, None]  # humanoid_v5.mass_center
        return (jnp.sum(mass * xipos, axis=0) / jnp.sum(mass))[:2]
    return state.qpos[0] if data is None else data.qpos[0]


def _observation(rules, data, cfrc_ext):
    import jax.numpy as jnp

    name = type(rules).__name__
    if name in ("Hopper", "Walker2d"):
        return jnp.concatenate((data.qpos[1:], jnp.clip(data.qvel, -10, 10)))
    if name == "HalfCheetah":
        return jnp.concatenate((data.qpos[1:], data.qvel))
    if name == "Ant":
        forces = jnp.clip(cfrc_ext, rules.min_force, rules.max_force)
        return jnp.concatenate((data.qpos[2:], data.qvel, forces[1:].reshape(-1)))
    # Humanoid
    return jnp.concatenate((data.qpos[2:], data.qvel, data._impl.cinert[1:].reshape(-1), data.cvel[1:].reshape(-1),
                            data.qfrc_actuator[6:], cfrc_ext[1:].reshape(-1)))


def _float32_squares(x):
    """np.square of a float32 array, rounded as numpy rounds it. XLA's CPU backend contracts a float32
    multiply into the add consuming it (one rounding where numpy makes two: 1 ulp apart for 13% of Ant's
    ctrl costs under jit); the square taken exactly in float64 and rounded to float32 by reduce_precision
    (integer bit operations, nothing to contract) is numpy's. Without float64 (jax_enable_x64 off) the
    plain square, 1 ulp being within float32 tolerance."""
    import jax
    import jax.numpy as jnp

    if jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
        return jnp.square(x)
    return jax.lax.reduce_precision(jnp.square(x.astype(jnp.float64)), 8, 23).astype(x.dtype)


def _numpy_sum(x):
    """np.sum of a 1-D array in numpy's order (pairwise_sum: below 8 elements one by one; up to 128 in 8
    interleaved partial sums joined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the rest one by one;
    beyond, the two halves at a multiple of 8), so a float32 sum is the reference's to the bit (XLA's
    reduce adds in another order: 1 ulp apart for 44% of Ant's actions)."""
    n = x.shape[0]
    if n < 8:
        total = x[0] if n else x.sum()
        for i in range(1, n):
            total = total + x[i]
        return total
    if n <= 128:
        r = [x[j] for j in range(8)]
        i = 8
        while i < n - n % 8:
            r = [r[j] + x[i + j] for j in range(8)]
            i += 8
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for k in range(i, n):
            total = total + x[k]
        return total
    half = n // 2
    half -= half % 8
    return _numpy_sum(x[:half]) + _numpy_sum(x[half:])


def _reward_terminated(rules, data, cfrc_ext, x_velocity, action):
    import jax.numpy as jnp

    name = type(rules).__name__
    ctrl_cost = rules.ctrl_weight * _numpy_sum(_float32_squares(action))  # Humanoid squares data.ctrl: the action
    if name == "HalfCheetah":
        return rules.forward_weight * x_velocity - ctrl_cost, jnp.bool_(False)
    qpos, qvel = data.qpos, data.qvel
    if name in ("Hopper", "Walker2d"):
        z, angle = qpos[1], qpos[2]
        healthy = (rules.min_z < z) & (z < rules.max_z) & (rules.min_angle < angle) & (angle < rules.max_angle)
        if name == "Hopper":
            state = jnp.concatenate((qpos, qvel))[2:]
            healthy = jnp.all((rules.min_state < state) & (state < rules.max_state)) & healthy
        reward = rules.forward_weight * x_velocity + healthy * rules.healthy_reward - ctrl_cost
        return reward, ~healthy & rules.terminate_when_unhealthy
    if name == "Ant":
        finite = jnp.all(jnp.isfinite(jnp.concatenate((qpos, qvel))))
        healthy = finite & (rules.min_z <= qpos[2]) & (qpos[2] <= rules.max_z)
        forces = jnp.clip(cfrc_ext, rules.min_force, rules.max_force)
        contact_cost = rules.contact_weight * jnp.sum(jnp.square(forces))
    else:  # Humanoid
        healthy = (rules.min_z < qpos[2]) & (qpos[2] < rules.max_z)
        contact_cost = jnp.clip(rules.contact_weight * jnp.sum(jnp.square(cfrc_ext)), rules.min_cost, rules.max_cost)
    reward = x_velocity * rules.forward_weight + healthy * rules.healthy_reward - (ctrl_cost + contact_cost)
    return reward, ~healthy & rules.terminate_when_unhealthy


# ---------------------------------------------------------------- one env as the functional protocol

@functools.cache
def _state_class(env_id: str, fields: tuple):
    """One State class per env: a state from one MjxEnv steps in another (a float64 twin's, a rollout's
    carry), which two namedtuple classes of the same name would refuse."""
    return collections.namedtuple(f"Mjx{slug(env_id).title().replace('_', '')}State", fields)


def put_model(model):
    """The MjModel on the device for MJX's JAX implementation, its inertia M factored by MJX's sparse LDL
    (C's mj_factorM) in JAX ops rather than by LAPACK: batched LAPACK calls deadlock XLA's CPU thread pool
    (see c_solver's chol_factor). Raises NotImplementedError for what MJX does not implement."""
    mjx = _mjx()
    mjx_model = mjx.put_model(model, impl="jax")
    return mjx_model.replace(opt=mjx_model.opt.replace(jacobian=mjx.JacobianType.SPARSE))


class MjxEnv:
    """One gymnasium MuJoCo v5 env on MJX: the protocol's reset/step (pure, jittable, vmappable) and
    state sync with a gymnasium instance of it."""

    def __init__(self, env_id: str, solver: str = "c"):
        """`solver`: "c" solves constraints as C MuJoCo 4.0 does (`c_solve`) where it covers the model,
        "mjx" with MJX's own solver (its other stopping rule; kept to measure the difference)."""
        problem = refusal(env_id)
        if problem:
            raise BackendError(problem)
        check_env_id(env_id)
        import gymnasium as gym
        import mujoco

        mjx = _mjx()
        self.env_id = env_id
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._reference = gym.make(env_id)
        unwrapped = self._reference.unwrapped
        self.rules = rules_class(env_id)(unwrapped)  # gymnasium's constants, as mujoco_batch reads them
        try:  # put_model refuses, naming it, what MJX's JAX implementation lacks (a solver, integrator, collision pair)
            self.mjx_model = put_model(unwrapped.model)
        except NotImplementedError as exc:
            raise BackendError(f"mjx cannot run {env_id}: its model uses what MJX does not implement: "
                               f"{exc or type(exc).__name__}") from None
        use_compilation_cache()
        self.solver = "c" if solver == "c" and c_solver_covers(unwrapped.model) is None else "mjx"
        self.template = mjx.make_data(self.mjx_model, impl="jax")  # mj_resetData's values, on the device
        self.float = self.template.qpos.dtype  # float32, or float64 under jax_enable_x64
        self.frame_skip = self.rules.frame_skip
        self.dt = self.rules.dt
        self.needs_cfrc_ext = self.rules.needs_cfrc_ext
        self.derived = self.rules.derived
        fields = ["time", "qpos", "qvel", "qacc_warmstart"] + ([self.derived] if self.derived else [])
        self.State = _state_class(env_id, tuple(fields))
        self.source_hash = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + mujoco.__version__.encode()
                                          + _mjx_version().encode()).hexdigest()

    # -- the protocol
    def _data(self, state, ctrl=None):
        import jax.numpy as jnp

        f = self.float
        data = self.template.replace(time=jnp.asarray(state.time, f), qpos=jnp.asarray(state.qpos, f),
                                     qvel=jnp.asarray(state.qvel, f),
                                     qacc_warmstart=jnp.asarray(state.qacc_warmstart, f))
        return data if ctrl is None else data.replace(ctrl=ctrl)

    def _state(self, data):
        derived = []
        if self.derived == "xpos_main":
            derived = [data.xpos[self.rules.main_body]]
        elif self.derived == "xipos":
            derived = [data.xipos]
        return self.State(data.time, data.qpos, data.qvel, data.qacc_warmstart, *derived)

    def reset(self, key):
        """mj_resetData, reset_model's noise (uniform qpos; uniform or scaled normal qvel), mj_forward."""
        import jax
        import jax.numpy as jnp

        mjx, rules, f = _mjx(), self.rules, self.float
        qpos_key, qvel_key = jax.random.split(key)
        qpos = jnp.asarray(rules.init_qpos, f) + jax.random.uniform(
            qpos_key, (rules.model.nq,), f, -rules.noise, rules.noise)
        if rules.normal_velocity_noise:
            qvel = jnp.asarray(rules.init_qvel, f) + rules.noise * jax.random.normal(qvel_key, (rules.model.nv,), f)
        else:
            qvel = jnp.asarray(rules.init_qvel, f) + jax.random.uniform(
                qvel_key, (rules.model.nv,), f, -rules.noise, rules.noise)
        forward = c_forward if self.solver == "c" else mjx.forward
        data = forward(self.mjx_model, self.template.replace(qpos=qpos, qvel=qvel))
        data = data.replace(qpos=qpos)  # C's mj_forward leaves qpos as given; MJX's writes quaternions normalised
        cfrc_ext = jnp.zeros((rules.model.nbody, 6), f)  # mj_resetData zeroed it and mj_forward does not compute it
        return _observation(rules, data, cfrc_ext), self._state(data)

    def step(self, key, state, action):
        import jax
        import jax.numpy as jnp

        mjx, rules = _mjx(), self.rules
        action = jnp.asarray(action, jnp.float32)  # the action space's dtype, as the reference's ctrl cost sees it
        data = self._data(state, action.astype(self.float))  # MJX clamps ctrl to ctrlrange, as mj_step does
        before = _x_position(rules, state, None)
        physics = c_step if self.solver == "c" else mjx.step
        data = jax.lax.fori_loop(0, self.frame_skip, lambda _, d: physics(self.mjx_model, d), data)
        if self.needs_cfrc_ext:  # gymnasium's mj_rnePostConstraint after mj_step
            data = mjx.rne_postconstraint(self.mjx_model, data)
            cfrc_ext = data._impl.cfrc_ext
        else:
            cfrc_ext = None
        x_velocity = (_x_position(rules, None, data) - before) / self.dt
        if self.derived:
            x_velocity = x_velocity[0]
        reward, terminated = _reward_terminated(rules, data, cfrc_ext, x_velocity, action)
        return _observation(rules, data, cfrc_ext), self._state(data), reward, jnp.asarray(terminated, bool)

    # -- state sync with a gymnasium instance (numpy leaves, float64 as the reference keeps them)
    def state_from_reference(self, env):
        data = env.unwrapped.data
        derived = []
        if self.derived == "xpos_main":
            derived = [data.xpos[self.rules.main_body].copy()]
        elif self.derived == "xipos":
            derived = [data.xipos.copy()]
        return self.State(np.float64(data.time), data.qpos.copy(), data.qvel.copy(), data.qacc_warmstart.copy(),
                          *derived)

    def state_to_reference(self, state, env) -> None:
        data = env.unwrapped.data
        data.time = float(state.time)
        data.qpos[:] = np.asarray(state.qpos, np.float64)
        data.qvel[:] = np.asarray(state.qvel, np.float64)
        data.qacc_warmstart[:] = np.asarray(state.qacc_warmstart, np.float64)
        if self.derived == "xpos_main":  # what the reference's next "position before" reads
            data.xpos[self.rules.main_body] = np.asarray(state.xpos_main, np.float64)
        elif self.derived == "xipos":
            data.xipos[:] = np.asarray(state.xipos, np.float64)

    def functional(self) -> FunctionalBackend:
        return FunctionalBackend(name=SPEC, env_id=self.env_id, reset=self.reset, step=self.step,
                                 state_from_reference=self.state_from_reference,
                                 state_to_reference=self.state_to_reference, source_hash=self.source_hash)

    def close(self) -> None:
        self._reference.close()


def _mjx_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mujoco-mjx")
    except metadata.PackageNotFoundError:
        return "missing"


def load_mjx(env_id: str) -> FunctionalBackend:
    """The functional backend `mjx` of `env_id` (BackendError naming why when it cannot run here)."""
    return MjxEnv(env_id).functional()
