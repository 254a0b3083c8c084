"""How the report writes states, actions, spaces and samples of numbers: leaf formatters that need
no Context (context.py and the levels import them; shared.py holds the routines that take one)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from envs_fast.verify.probes import field_names, flat_values


def format_state(state) -> str:
    names = field_names(state)
    values = flat_values(state)
    return ", ".join(f"{n or 'state'}={v:.9g}" for n, v in zip(names, values))


def format_action(action) -> str:
    return np.array2string(np.asarray(action), precision=9) if np.ndim(action) else repr(np.asarray(action).item())


def summary(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Box):
        return f"Box(shape {space.shape}, {space.dtype}, bounds included)"
    return str(space)


def describe(values: np.ndarray) -> str:
    values = np.asarray(values, dtype=np.float64)
    return f"{values.mean():.4g}/{values.std():.3g}/{values.min():.4g}/{values.max():.4g}"


def histogram(values: np.ndarray) -> str:
    """Counts of each value for a few discrete values, else mean/sd/min/max."""
    unique, counts = np.unique(values, return_counts=True)
    if len(unique) <= 10:
        return ", ".join(f"{u:g}: {c}" for u, c in zip(unique, counts))
    return "mean/sd/min/max " + describe(values)


def num(value) -> str:
    return f"{float(value):.9g}"
