"""`mujoco_batch`: gymnasium's MuJoCo v5 locomotion envs stepped many at a time on `mujoco.batch`.

The engine is the reference's own (mujoco.batch runs mj_step on a thread pool, bit-identical to a loop
over one MjData per simulation), so this backend is a translation of each env's *Python* only: the
observation, reward, termination and reset noise, bit for bit the reference's (locomotion.py holds
each env's; this module holds the batch of simulations they read, and the backends around it).

What gymnasium does around mj_step that matters here:
- `do_simulation` = ctrl <- action, mj_step x frame_skip, then mj_rnePostConstraint (for cfrc_ext,
  which Ant and Humanoid observe and pay a contact cost on). mj_step does not compute cfrc_ext, nor
  does the batch: Ant/Humanoid batches are persistent (one MjData per simulation) and each stepped
  simulation is copied into one scratch MjData (Batch.get_data) to run mj_rnePostConstraint there.
- Derived fields after mj_step describe the state before its last substep; Ant's x velocity reads
  the main body's xpos and Humanoid's the mass centre (xipos) before and after a step, so the value
  the *next* step starts from is part of the state here (`xpos_main`, `xipos`), synced like the rest.
- Reset: mj_resetData, qpos/qvel = init + noise from the env's np_random, mj_forward. Noise is drawn
  with numpy's Generator seeded as gymnasium seeds it, so reset(seed=s) is gymnasium's reset(seed=s).

State (synced with the reference through mj_getState/mj_setState): mjSTATE_FULLPHYSICS and the
solver's warm start (the physics a step depends on beside ctrl, which every step writes), plus the
derived position above. `MujocoBatchBackend` is the verifier's `protocol.BatchedBackend`;
`MujocoBatchVectorEnv` the training adapter (gymnasium's NEXT_STEP autoreset, the registered time
limit, per-env reset streams exactly those of gymnasium's SyncVectorEnv).
"""
from __future__ import annotations

import collections
import hashlib
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs_fast.vector_env import TranslationVectorEnv
from envs_fast.mujoco.locomotion import RULES, Rules
from envs_fast.protocol import SIGNATURE_PROBLEM, BackendError, check_env_id, slug

SPEC = "mujoco_batch"
SOURCES = tuple(Path(__file__).with_name(name) for name in ("batch.py", "locomotion.py"))  # in the source hash
# Largest batch the verifier steps at once: Ant/Humanoid keep one MjData (14 MB arena) per simulation.
MAX_CHUNK = 64


def _mujoco():
    import mujoco
    import mujoco.batch  # noqa: F401  (mujoco >= 4.0)

    return mujoco


def state_components() -> list[tuple[str, int]]:
    """(MjData field, mjtState bit) of the synced state, in mj_getState's order (by bit)."""
    mujoco = _mujoco()
    spec = int(mujoco.mjtState.mjSTATE_FULLPHYSICS) | int(mujoco.mjtState.mjSTATE_WARMSTART)
    names = {"mjSTATE_TIME": "time", "mjSTATE_QPOS": "qpos", "mjSTATE_QVEL": "qvel", "mjSTATE_ACT": "act",
             "mjSTATE_HISTORY": "history", "mjSTATE_WARMSTART": "qacc_warmstart", "mjSTATE_PLUGIN": "plugin_state",
             "mjSTATE_PLASTIC": "plastic"}
    bits = [(int(getattr(mujoco.mjtState, bit)), field) for bit, field in names.items() if hasattr(mujoco.mjtState, bit)]
    chosen = sorted((bit, field) for bit, field in bits if bit & spec)
    covered = sum(bit for bit, _ in chosen)
    if covered != spec:  # a component this mujoco added to FULLPHYSICS that this module does not know
        raise BackendError(f"mujoco_batch: mjSTATE_FULLPHYSICS has components this backend does not sync "
                           f"(bits {spec & ~covered:#x}); update envs_fast/mujoco/batch.py for mujoco {mujoco.__version__}")
    return [(field, bit) for bit, field in chosen]



def refusal(env_id: str) -> str | None:
    """Why mujoco_batch cannot run `env_id` here (one line), or None."""
    if env_id not in RULES:
        return (f"mujoco_batch does not cover {env_id!r}: it translates gymnasium's "
                f"{', '.join(RULES)} (their v5 Python around mj_step)")
    try:
        _mujoco()
    except ImportError as exc:
        return f"mujoco_batch needs mujoco >= 4.0 with mujoco.batch ({exc})"
    return None


# ---------------------------------------------------------------- a batch of simulations

ALL_ROWS = slice(None)  # BatchSim.step's rows: every simulation, indexed by views rather than copies


class BatchSim:
    """n simulations of one env on a `mujoco.batch.Batch`, with the env's Python on top: reset with
    its noise, step with its reward and termination. Rows are selected by sorted int ids (or ALL_ROWS)."""

    def __init__(self, rules: Rules, n: int, nthread: int = 0):
        mujoco = _mujoco()
        self.mujoco, self.rules, self.n = mujoco, rules, n
        self.model = rules.model
        self.batch = mujoco.batch.Batch(self.model, n, nthread, persistent=rules.needs_cfrc_ext)
        self.qpos, self.qvel, self.ctrl = (self.batch.bind(name) for name in ("qpos", "qvel", "ctrl"))
        for name in rules.outputs:
            setattr(self, name, self.batch.bind(name))
        nbody = self.model.nbody
        self.cfrc_ext = np.zeros((n, nbody, 6))
        self._scratch = mujoco.MjData(self.model) if rules.needs_cfrc_ext else None
        self.derived = np.zeros((n,) + ((3,) if rules.derived == "xpos_main" else (nbody, 3))) if rules.derived else None
        self._none = mujoco.mjtStage.mjSTAGE_NONE.value

    # -- state
    def write_state(self, ids, state) -> None:
        """Rows `ids` take `state` (a batched state NamedTuple, leading axis len(ids))."""
        for name in state._fields:
            if name != self.rules.derived:
                self.batch.bind(name)[ids] = np.asarray(getattr(state, name), np.float64)
        if self.derived is not None:
            self.derived[ids] = getattr(state, self.rules.derived)
        self.cfrc_ext[ids] = 0.0  # not state: every step recomputes it

    def read_state(self, ids, State) -> Any:
        fields = [self.batch.bind(name)[ids].copy() for name in State._fields if name != self.rules.derived]
        if self.derived is not None:
            fields.append(self.derived[ids].copy())
        return State(*fields)

    # -- reset and step
    def reset(self, ids, rngs) -> np.ndarray:
        """mj_resetData, reset_model's noise from each row's generator, mj_forward: the observations."""
        self.batch.reset(ids, stage=self._none)
        for row, rng in zip(ids, rngs):
            self.qpos[row], self.qvel[row] = self.rules.reset_noise(rng)
        self.batch.forward(ids)
        self.cfrc_ext[ids] = 0.0  # mj_resetData zeroed it and mj_forward does not compute it
        if self.derived is not None:
            self.derived[ids] = self.rules.derived_value(self, ids)
        return self.rules.observation(self, ids)

    def step(self, ids, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One env step of rows `ids`: (observation, reward, terminated)."""
        rules = self.rules
        before = rules.position(self, ids).copy()
        self.ctrl[ids] = actions
        self.batch.step(None if ids is ALL_ROWS else ids, nstep=rules.frame_skip)
        if rules.needs_cfrc_ext:
            self._post_constraint(ids)
        if self.derived is not None:
            self.derived[ids] = rules.derived_value(self, ids)
        x_velocity = rules.velocity(before, rules.position(self, ids))
        reward, terminated = rules.reward_terminated(self, ids, x_velocity, actions)
        return rules.observation(self, ids), np.asarray(reward, np.float64), np.asarray(terminated, bool)

    def _post_constraint(self, ids) -> None:
        """cfrc_ext as gymnasium's mj_rnePostConstraint after mj_step computes it, row by row."""
        scratch, model, rne = self._scratch, self.model, self.mujoco.mj_rnePostConstraint
        for row in np.arange(self.n)[ids]:
            self.batch.get_data(int(row), scratch)
            rne(model, scratch)
            self.cfrc_ext[row] = scratch.cfrc_ext


# ---------------------------------------------------------------- the verifier's BatchedBackend

def _reference_env(env_id: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gym.make(env_id)


class MujocoBatchBackend:
    """A `protocol.BatchedBackend` over `mujoco.batch`: states are NamedTuples of float64 arrays named
    after their MjData fields (`time`, `qpos`, `qvel`, `qacc_warmstart`, ... and `xpos_main`/`xipos`)."""

    def __init__(self, env_id: str, nthread: int = 0):
        problem = refusal(env_id)
        if problem:
            raise BackendError(problem)
        check_env_id(env_id)
        self.name = SPEC
        self.env_id = env_id
        self.nthread = nthread
        reference = _reference_env(env_id)
        self.observation_space, self.action_space = reference.observation_space, reference.action_space
        self.rules = RULES[env_id](reference.unwrapped)
        self._reference = reference  # the rules read its constants; kept open with them
        mujoco = _mujoco()
        self.source_hash = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + mujoco.__version__.encode()).hexdigest()
        model = self.rules.model
        self.components = [(name, bit) for name, bit in state_components() if mujoco.mj_stateSize(model, bit) > 0]
        self.state_spec = sum(bit for _, bit in self.components)
        self.sizes = [mujoco.mj_stateSize(model, bit) for _, bit in self.components]
        fields = [name for name, _ in self.components] + ([self.rules.derived] if self.rules.derived else [])
        self.State = collections.namedtuple(f"{slug(env_id).title().replace('_', '')}State", fields)
        self.read_only_fields = ()
        self.unreadable_fields = ()
        self.state_from_reference = self._state_from_reference
        self.state_to_reference = self._state_to_reference
        self._sims: dict[int, BatchSim] = {}

    @property
    def syncs_state(self) -> bool:
        return True

    def simulator(self, n: int) -> BatchSim:
        return BatchSim(self.rules, n, self.nthread)

    def _sim(self, n: int) -> BatchSim:
        if n not in self._sims:
            self._sims[n] = self.simulator(n)
        return self._sims[n]

    # -- state sync (one env: a NamedTuple of float64 numbers and arrays)
    def _state_from_reference(self, env):
        mujoco, data = _mujoco(), env.unwrapped.data
        vector = np.empty(sum(self.sizes))
        mujoco.mj_getState(env.unwrapped.model, data, vector, self.state_spec)
        parts = np.split(vector, np.cumsum(self.sizes)[:-1])
        fields = [np.float64(part[0]) if name == "time" else part for (name, _), part in zip(self.components, parts)]
        if self.rules.derived == "xpos_main":
            fields.append(data.xpos[self.rules.main_body].copy())
        elif self.rules.derived == "xipos":
            fields.append(data.xipos.copy())
        return self.State(*fields)

    def _state_to_reference(self, state, env) -> None:
        mujoco, unwrapped = _mujoco(), env.unwrapped
        vector = np.concatenate([np.asarray(getattr(state, name), np.float64).reshape(-1) for name, _ in self.components])
        mujoco.mj_setState(unwrapped.model, unwrapped.data, vector, self.state_spec)
        if self.rules.derived == "xpos_main":  # what the next step's "position before" reads
            unwrapped.data.xpos[self.rules.main_body] = state.xpos_main
        elif self.rules.derived == "xipos":
            unwrapped.data.xipos[:] = state.xipos

    # -- batches, in chunks of at most MAX_CHUNK simulations
    def _chunks(self, n: int):
        for start in range(0, n, MAX_CHUNK):
            yield slice(start, min(start + MAX_CHUNK, n))

    def _take(self, state, part: slice):
        return self.State(*(np.asarray(value)[part] for value in state))

    def _join(self, pieces):
        return [np.concatenate(values) if np.ndim(values[0]) else np.asarray(values) for values in zip(*pieces)]

    def reset(self, seeds):
        """Each env reset as gymnasium's reset(seed=seeds[i]) resets it: the same noise, bit for bit."""
        seeds = np.asarray(seeds).reshape(-1)
        pieces = []
        for part in self._chunks(len(seeds)):
            count = part.stop - part.start
            sim, ids = self._sim(count), np.arange(count)
            obs = sim.reset(ids, [np.random.default_rng(int(seed)) for seed in seeds[part]])
            pieces.append((obs, *sim.read_state(ids, self.State)))
        obs, *fields = self._join(pieces)
        return obs, self.State(*fields)

    def step(self, seeds, state, actions):
        n = len(np.asarray(seeds).reshape(-1))  # the steps are deterministic: seeds only size the batch
        actions = np.asarray(actions)
        pieces = []
        for part in self._chunks(n):
            count = part.stop - part.start
            sim, ids = self._sim(count), np.arange(count)
            sim.write_state(ids, self._take(state, part))
            obs, reward, terminated = sim.step(ids, actions[part])
            pieces.append((obs, reward, terminated, *sim.read_state(ids, self.State)))
        obs, reward, terminated, *fields = self._join(pieces)
        return obs, self.State(*fields), reward, terminated

    def rollout(self, seeds, state, actions):
        n = len(np.asarray(seeds).reshape(-1))
        actions = np.asarray(actions)
        steps = actions.shape[1]
        obs = np.empty((n, steps) + self.observation_space.shape)
        reward, terminated = np.empty((n, steps)), np.empty((n, steps), bool)
        for part in self._chunks(n):
            count = part.stop - part.start
            sim, ids = self._sim(count), np.arange(count)
            sim.write_state(ids, self._take(state, part))
            for t in range(steps):
                obs[part, t], reward[part, t], terminated[part, t] = sim.step(ids, actions[part, t])
        return obs.reshape(n, steps, -1), reward, terminated

    def protocol_problems(self, obs_space: gym.Space, action_space: gym.Space) -> list[str]:
        problems = []
        model = self.rules.model
        if not (isinstance(action_space, gym.spaces.Box) and action_space.shape == (model.nu,)):
            problems.append(f"{SIGNATURE_PROBLEM}the model has {model.nu} actuators, the action space is {action_space}")
        obs, _ = self.reset(np.zeros(1, np.uint32))
        if obs.shape[1:] != obs_space.shape:
            problems.append(f"observations have shape {obs.shape[1:]}, the observation space {obs_space.shape}")
        return problems

    def close(self) -> None:
        self._reference.close()


def load_mujoco_batch(env_id: str) -> MujocoBatchBackend:
    return MujocoBatchBackend(env_id)


# ---------------------------------------------------------------- the training adapter

class MujocoBatchVectorEnv(TranslationVectorEnv):
    """gymnasium's SyncVectorEnv of `env_id`, NEXT_STEP autoreset, stepped on one mujoco.batch: the
    step after an episode ends returns the reset observation, reward 0, both flags False; episodes are
    truncated at the registered max_episode_steps. Env i's reset noise comes from its own generator,
    seeded seed + i by reset(seed=seed) as gymnasium seeds its envs, so both give the same numbers.
    No infos (gymnasium's per-step infos are not reproduced)."""

    def __init__(self, backend: MujocoBatchBackend, num_envs: int, seed: int | None = None):
        super().__init__(backend, num_envs, seed)
        self.sim = backend.simulator(num_envs)
        self._limit = self.max_episode_steps if self.max_episode_steps is not None else np.iinfo(np.int64).max
        self._seed = seed
        self._rngs: list[np.random.Generator] | None = None
        self._all = np.arange(num_envs)
        self._elapsed = np.zeros(num_envs, np.int64)
        self._autoreset = np.zeros(num_envs, bool)
        self._started = False

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        self._refuse(options)
        if seed is None and self._rngs is None:
            seed = self._seed
        if seed is not None:
            seeds = list(seed) if isinstance(seed, (list, tuple, np.ndarray)) else [int(seed) + i for i in range(self.num_envs)]
            if len(seeds) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
            self._rngs = [np.random.default_rng(None if s is None else int(s)) for s in seeds]
        elif self._rngs is None:
            self._rngs = [np.random.default_rng() for _ in range(self.num_envs)]
        obs = self.sim.reset(self._all, self._rngs)
        self._elapsed[:] = 0
        self._autoreset[:] = False
        self._started = True
        return obs, {}

    def step(self, actions):
        if not self._started:
            raise RuntimeError("call reset() before step()")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) + self.single_action_space.shape:
            raise ValueError(f"expected actions of shape {(self.num_envs,) + self.single_action_space.shape}, "
                             f"got {actions.shape}")
        resetting = self._autoreset
        if not resetting.any():  # most steps: every env steps, without the scatter below
            obs, reward, terminated = self.sim.step(ALL_ROWS, actions)
            self._elapsed += 1
            truncated = self._elapsed >= self._limit
            self._autoreset = terminated | truncated
            return obs, reward, terminated, truncated, {}
        obs = np.empty((self.num_envs,) + self.single_observation_space.shape)
        reward = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, bool)
        stepping = np.flatnonzero(~resetting)
        if len(stepping):
            obs[stepping], reward[stepping], terminated[stepping] = self.sim.step(stepping, actions[stepping])
        restarting = np.flatnonzero(resetting)
        if len(restarting):
            obs[restarting] = self.sim.reset(restarting, [self._rngs[i] for i in restarting])
        self._elapsed[stepping] += 1
        self._elapsed[restarting] = 0
        truncated = ~resetting & (self._elapsed >= self._limit)
        self._autoreset = terminated | truncated
        return obs, reward, terminated, truncated, {}

    def close_extras(self, **kwargs):
        self._started = False
        self.backend.close()


def make_mujoco_batch_vec_env(env_id: str, num_envs: int, seed: int | None = None) -> MujocoBatchVectorEnv:
    return MujocoBatchVectorEnv(MujocoBatchBackend(env_id), num_envs, seed)
