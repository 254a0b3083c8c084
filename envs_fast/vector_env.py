"""The VectorEnv shape that the adapters of translations share (JAX: backends/jax_vector.py, Rust:
rust/vector.py, MuJoCo: mujoco/batch.py). No JAX here: a Rust backend trains without importing it."""
from __future__ import annotations

import gymnasium as gym
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envs_fast.protocol import check_env_id


def reference_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def max_episode_steps(env_id: str) -> int | None:
    return check_env_id(env_id).max_episode_steps


class TranslationVectorEnv(VectorEnv):
    """What the adapters of translations (JAX, Rust) share: gymnasium's NEXT_STEP autoreset, the
    reference's spaces and its registered time limit."""
    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, backend, num_envs: int, seed: int | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.backend = backend
        self.env_id = backend.env_id
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = reference_spaces(backend.env_id)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.max_episode_steps = max_episode_steps(backend.env_id)
        self.render_mode = None
        self.spec = None
        if seed is not None:
            self.observation_space.seed(seed)
            self.action_space.seed(seed)

    def _refuse(self, options) -> None:
        if options:
            raise ValueError(f"{type(self).__name__} does not support reset options, got {options}")
