"""An env registered WITHOUT a time limit whose episodes never end (reward 1 per step).

Used as `tests.endless_env:Endless-v0`, which also checks the `module:EnvName-v0` id syntax."""
import gymnasium as gym
import numpy as np


class EndlessEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), 1.0, False, False, {}


if "Endless-v0" not in gym.registry:
    gym.register("Endless-v0", entry_point=EndlessEnv, max_episode_steps=None)
