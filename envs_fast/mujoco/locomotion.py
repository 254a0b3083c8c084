"""Each MuJoCo v5 locomotion env's *Python* around mj_step, over a batch of simulations: the
observation, reward, termination and reset noise of gymnasium's half_cheetah_v5.py, hopper_v5.py,
walker2d_v5.py, ant_v5.py and humanoid_v5.py, with the same numpy operations in the same order and
dtypes, so that every figure is bit for bit the reference's. The constants (weights, healthy ranges,
noise scale, frame_skip, init_qpos) are read from a gymnasium instance of the env, so its constructor
defaults are the spec. The batch these rules read (`BatchSim`) is batch.py's; MJX's backend (mjx.py)
applies the same rules."""
from __future__ import annotations

import collections

import numpy as np

from envs_fast.protocol import BackendError


class Rules:
    """What a gymnasium MuJoCo v5 env computes around mj_step, over rows `ids` of a `BatchSim` (batch.py's:
    its qpos, qvel, ctrl and derived fields). Subclasses translate one env; constants come from the
    gymnasium instance `env` (unwrapped)."""
    needs_cfrc_ext = False
    derived: str | None = None  # the derived field the next step's x velocity starts from (state field name)
    outputs: tuple[str, ...] = ()  # derived MjData fields the batch must copy out after each call
    position_skip = 1  # exclude_current_positions_from_observation: qpos[skip:] observed

    def __init__(self, env):
        self.env = env
        self.model = env.model
        self.dt = env.dt
        self.frame_skip = env.frame_skip
        self.init_qpos = env.init_qpos
        self.init_qvel = env.init_qvel
        self.noise = env._reset_noise_scale
        self.forward_weight = env._forward_reward_weight
        self.ctrl_weight = env._ctrl_cost_weight
        if not env._exclude_current_positions_from_observation:
            raise BackendError(f"mujoco_batch translates {type(env).__name__} with its default observation only")

    normal_velocity_noise = False  # reset_model draws qvel noise uniform, or scale * standard normal

    def reset_noise(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """qpos, qvel of reset_model, drawn in its order from the env's generator."""
        qpos = self.init_qpos + rng.uniform(low=-self.noise, high=self.noise, size=self.model.nq)
        if self.normal_velocity_noise:
            qvel = self.init_qvel + self.noise * rng.standard_normal(self.model.nv)
        else:
            qvel = self.init_qvel + rng.uniform(low=-self.noise, high=self.noise, size=self.model.nv)
        return qpos, qvel

    def position(self, sim, ids) -> np.ndarray:
        """The x position x velocity is taken from (before the step: read before stepping)."""
        return sim.qpos[ids, 0]

    def velocity(self, before, after) -> np.ndarray:
        return (after - before) / self.dt

    def observation(self, sim, ids) -> np.ndarray:
        return np.concatenate((sim.qpos[ids, self.position_skip:], sim.qvel[ids]), axis=1)

    def ctrl_cost(self, sim, ids, actions) -> np.ndarray:
        # reference: weight * np.sum(np.square(action)), in the action's dtype (float32 from the space)
        return self.ctrl_weight * np.sum(np.square(actions), axis=1)

    def reward_terminated(self, sim, ids, x_velocity, actions) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


class HalfCheetah(Rules):
    normal_velocity_noise = True

    def reward_terminated(self, sim, ids, x_velocity, actions):
        reward = self.forward_weight * x_velocity - self.ctrl_cost(sim, ids, actions)
        return reward, np.zeros(len(reward), bool)


class _Healthy(Rules):
    """Hopper and Walker2d: forward + healthy reward - control cost; terminated when unhealthy."""

    def __init__(self, env):
        super().__init__(env)
        self.healthy_reward = env._healthy_reward
        self.terminate_when_unhealthy = env._terminate_when_unhealthy
        self.min_z, self.max_z = env._healthy_z_range
        self.min_angle, self.max_angle = env._healthy_angle_range

    def observation(self, sim, ids):
        return np.concatenate((sim.qpos[ids, 1:], np.clip(sim.qvel[ids], -10, 10)), axis=1)

    def is_healthy(self, sim, ids) -> np.ndarray:
        z, angle = sim.qpos[ids, 1], sim.qpos[ids, 2]
        return (self.min_z < z) & (z < self.max_z) & (self.min_angle < angle) & (angle < self.max_angle)

    def reward_terminated(self, sim, ids, x_velocity, actions):
        healthy = self.is_healthy(sim, ids)
        rewards = self.forward_weight * x_velocity + healthy * self.healthy_reward
        reward = rewards - self.ctrl_cost(sim, ids, actions)
        return reward, ~healthy & self.terminate_when_unhealthy


class Hopper(_Healthy):
    def __init__(self, env):
        super().__init__(env)
        self.min_state, self.max_state = env._healthy_state_range

    def is_healthy(self, sim, ids):
        state = np.concatenate((sim.qpos[ids], sim.qvel[ids]), axis=1)[:, 2:]  # state_vector()[2:]
        healthy_state = np.all((self.min_state < state) & (state < self.max_state), axis=1)
        return healthy_state & super().is_healthy(sim, ids)


class Walker2d(_Healthy):
    pass


class Ant(Rules):
    needs_cfrc_ext = True
    normal_velocity_noise = True
    derived = "xpos_main"  # data.body(main_body).xpos: x velocity is taken from its x, y
    outputs = ("xpos",)
    position_skip = 2

    def __init__(self, env):
        super().__init__(env)
        self.main_body = env.model.body(env._main_body).id
        self.contact_weight = env._contact_cost_weight
        self.min_force, self.max_force = env._contact_force_range
        self.healthy_reward = env._healthy_reward
        self.terminate_when_unhealthy = env._terminate_when_unhealthy
        self.min_z, self.max_z = env._healthy_z_range
        if not env._include_cfrc_ext_in_observation:
            raise BackendError("mujoco_batch translates Ant-v5 with its default observation only")

    def derived_value(self, sim, ids):
        return sim.xpos[ids, self.main_body]

    def position(self, sim, ids):
        return sim.derived[ids][:, :2]

    def velocity(self, before, after):
        return ((after - before) / self.dt)[:, 0]

    def observation(self, sim, ids):
        contact_forces = np.clip(sim.cfrc_ext[ids], self.min_force, self.max_force)
        n = len(contact_forces)
        return np.concatenate((sim.qpos[ids, 2:], sim.qvel[ids], contact_forces[:, 1:].reshape(n, -1)), axis=1)

    def reward_terminated(self, sim, ids, x_velocity, actions):
        qpos = sim.qpos[ids]
        state = np.concatenate((qpos, sim.qvel[ids]), axis=1)
        healthy = np.isfinite(state).all(axis=1) & (self.min_z <= qpos[:, 2]) & (qpos[:, 2] <= self.max_z)
        forces = np.clip(sim.cfrc_ext[ids], self.min_force, self.max_force)
        # reference: np.sum over the (nbody, 6) array, i.e. over its flattened row
        contact_cost = self.contact_weight * np.sum(np.square(forces).reshape(len(forces), -1), axis=1)
        rewards = x_velocity * self.forward_weight + healthy * self.healthy_reward
        costs = self.ctrl_cost(sim, ids, actions) + contact_cost
        return rewards - costs, ~healthy & self.terminate_when_unhealthy


class Humanoid(Rules):
    needs_cfrc_ext = True
    derived = "xipos"  # mass_center(model, data) reads data.xipos
    outputs = ("xipos", "cinert", "cvel", "qfrc_actuator")
    position_skip = 2

    def __init__(self, env):
        super().__init__(env)
        self.contact_weight = env._contact_cost_weight
        self.min_cost, self.max_cost = env._contact_cost_range
        self.healthy_reward = env._healthy_reward
        self.terminate_when_unhealthy = env._terminate_when_unhealthy
        self.min_z, self.max_z = env._healthy_z_range
        self.body_mass = env.model.body_mass
        flags = ("_include_cinert_in_observation", "_include_cvel_in_observation",
                 "_include_qfrc_actuator_in_observation", "_include_cfrc_ext_in_observation")
        if not all(getattr(env, flag) for flag in flags):
            raise BackendError("mujoco_batch translates Humanoid-v5 with its default observation only")

    def derived_value(self, sim, ids):
        return sim.xipos[ids]

    def position(self, sim, ids):
        # humanoid_v5.mass_center, env by env: its einsum's summation order is the reference's
        from gymnasium.envs.mujoco.humanoid_v5 import mass_center

        data = collections.namedtuple("Data", "xipos")
        return np.stack([mass_center(self.model, data(xipos)) for xipos in sim.derived[ids]])

    def velocity(self, before, after):
        return ((after - before) / self.dt)[:, 0]

    def observation(self, sim, ids):
        qvel = sim.qvel[ids]
        n = len(qvel)
        return np.concatenate((sim.qpos[ids, 2:], qvel, sim.cinert[ids, 1:].reshape(n, -1),
                               sim.cvel[ids, 1:].reshape(n, -1), sim.qfrc_actuator[ids, 6:],
                               sim.cfrc_ext[ids, 1:].reshape(n, -1)), axis=1)

    def ctrl_cost(self, sim, ids, actions):
        return self.ctrl_weight * np.sum(np.square(sim.ctrl[ids]), axis=1)  # the reference squares data.ctrl

    def reward_terminated(self, sim, ids, x_velocity, actions):
        z = sim.qpos[ids, 2]
        healthy = (self.min_z < z) & (z < self.max_z)
        cfrc_ext = sim.cfrc_ext[ids]
        contact_cost = np.clip(self.contact_weight * np.sum(np.square(cfrc_ext).reshape(len(cfrc_ext), -1), axis=1),
                               self.min_cost, self.max_cost)
        rewards = self.forward_weight * x_velocity + healthy * self.healthy_reward
        costs = self.ctrl_cost(sim, ids, actions) + contact_cost
        return rewards - costs, ~healthy & self.terminate_when_unhealthy


RULES = {"HalfCheetah-v5": HalfCheetah, "Hopper-v5": Hopper, "Walker2d-v5": Walker2d, "Ant-v5": Ant,
         "Humanoid-v5": Humanoid}


def supports(env_id: str) -> bool:
    return env_id in RULES
