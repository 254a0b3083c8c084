"""envpool as a `gymnasium.vector.VectorEnv` (C++ threads; Box2D, MuJoCo, classic control).

envpool already auto-resets in gymnasium's NEXT_STEP style (the step after a done returns the
reset observation with reward 0 and ignores the action), so this adapter only converts types
and takes the spaces from the reference env, whose bounds envpool does not always report."""
from __future__ import annotations

import warnings
from functools import lru_cache

import gymnasium as gym
import numpy as np


# envpool builds float64-bounded Box spaces on reset; gymnasium warns about the cast each time.
warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32.*", category=UserWarning)


@lru_cache(maxsize=None)
def _envpool_ids() -> frozenset:
    try:
        with warnings.catch_warnings():  # envpool's registrations warn about float64 bounds
            warnings.simplefilter("ignore", UserWarning)
            import envpool
    except ImportError:
        return frozenset()
    return frozenset(envpool.list_all_envs())


def envpool_supports(env_id: str) -> bool:
    return env_id in _envpool_ids()


class EnvpoolVectorEnv(gym.vector.VectorEnv):
    def __init__(self, env_id: str, num_envs: int, seed: int = 0, **envpool_kwargs):
        if not envpool_supports(env_id):
            raise ValueError(f"envpool has no {env_id!r} (or envpool is not installed)")
        reference = gym.make(env_id)
        self.env_id = env_id
        self.num_envs = num_envs
        self.single_observation_space = reference.observation_space
        self.single_action_space = reference.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.spec = reference.spec
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.render_mode = None
        max_steps = reference.spec.max_episode_steps if reference.spec else None
        reference.close()
        self._kwargs = dict(envpool_kwargs)
        if max_steps is not None:
            self._kwargs.setdefault("max_episode_steps", max_steps)
        self._seed = seed
        self._pool = self._make_pool(seed)
        self.action_space.seed(seed)
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)

    def _make_pool(self, seed: int):
        import envpool

        return envpool.make(self.env_id, env_type="gymnasium", num_envs=self.num_envs, seed=seed, **self._kwargs)

    def reset(self, *, seed=None, options=None):
        # envpool seeds at construction: a new seed means a new pool.
        if seed is not None and seed != self._seed:
            self._pool.close()
            self._seed = int(seed if np.isscalar(seed) else seed[0])
            self._pool = self._make_pool(self._seed)
            self.action_space.seed(self._seed)
        obs, info = self._pool.reset()
        return obs.astype(self.single_observation_space.dtype, copy=False), dict(info)

    def step(self, actions):
        actions = np.asarray(actions)
        actions = actions.astype(np.int32) if self._discrete else actions.astype(np.float32)
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        return (
            obs.astype(self.single_observation_space.dtype, copy=False),
            reward.astype(np.float64),
            terminated.astype(bool),
            truncated.astype(bool),
            dict(info),
        )

    def close_extras(self, **kwargs):
        self._pool.close()
