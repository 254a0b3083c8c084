"""A Box-action env that does NOT clip its action: it refuses one out of bounds and pays the action
itself as reward, so a return shows which action arrived. For the harness's clipping test (Pendulum
and MountainCarContinuous clip their actions themselves, so they cannot show it).

Used as `tests.action_echo_env:ActionEchoEnv`."""
import gymnasium as gym
import numpy as np

EPISODE_STEPS = 5


class ActionEchoEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        action = np.asarray(action, np.float32)
        if not self.action_space.contains(action):
            raise ValueError(f"action {action} outside {self.action_space}")
        self.steps += 1
        return np.zeros(1, np.float32), float(action[0]), self.steps >= EPISODE_STEPS, False, {}
