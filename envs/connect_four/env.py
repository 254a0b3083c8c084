"""Connect Four against a random opponent as a gymnasium env: `envs.connect_four.env:Env`."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from . import connect_four as domain


class Env(gym.Env):
    """Discrete(7) actions (the column), a Box(-1, 1, (42,)) board observation, truncated at MAX_STEPS.

    `state` is the domain state; `info["legal_actions"]` lists the columns that are not full."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, render_mode: str | None = None):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', not {render_mode!r}")
        self.render_mode = render_mode
        self.action_space = gym.spaces.Discrete(len(domain.ACTIONS))
        self.observation_space = gym.spaces.Box(domain.OBSERVATION_LOW, domain.OBSERVATION_HIGH,
                                                (domain.OBSERVATION_SIZE,), np.float32)
        self.state = None
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        # One integer seeds the domain: the given seed, else one drawn from the env's own generator.
        domain_seed = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
        self.state = domain.reset(domain_seed, (options or {}).get("task"))
        self.steps = 0
        return self._observation(), self._info()

    def step(self, action):
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        self.state, reward, terminated = domain.step(self.state, int(action))
        self.steps += 1
        truncated = not terminated and self.steps >= domain.MAX_STEPS
        return self._observation(), float(reward), bool(terminated), truncated, self._info()

    def render(self):
        if self.render_mode == "ansi":
            return domain.render(self.state)
        return None

    def _observation(self) -> np.ndarray:
        return np.asarray(domain.observation(self.state), dtype=np.float32)

    def _info(self) -> dict:
        return {"legal_actions": domain.legal_actions(self.state)}
