"""gymnax as a functional backend (no state sync: verified statistically)."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import types

from envs_fast.protocol import BackendError, FunctionalBackend

# gymnax ids that implement the same environment as the gymnasium id
GYMNAX_IDS = {
    "CartPole-v1": "CartPole-v1",
    "Acrobot-v1": "Acrobot-v1",
    "MountainCar-v0": "MountainCar-v0",
    "MountainCarContinuous-v0": "MountainCarContinuous-v0",
    "Pendulum-v1": "Pendulum-v1",
}


def gymnax_supports(env_id: str) -> bool:
    return env_id in GYMNAX_IDS


def _seaborn_on_first_use() -> None:
    """gymnax's package import loads seaborn (Pong's and MinAtar's renderers use its palettes): 2.2 s of
    every process that imports gymnax, a training run's budget included. Until something renders,
    `seaborn` is a stand-in whose first attribute imports the real one. (The standard library's
    LazyLoader does not help: a second `import seaborn` touches the module and loads it.)"""
    if "seaborn" in sys.modules or importlib.util.find_spec("seaborn") is None:
        return
    stand_in = types.ModuleType("seaborn", "seaborn, imported on first use (envs_fast.backends.gymnax_backend)")

    def __getattr__(name):
        if sys.modules.get("seaborn") is stand_in:
            del sys.modules["seaborn"]
        return getattr(importlib.import_module("seaborn"), name)

    stand_in.__getattr__ = __getattr__
    sys.modules["seaborn"] = stand_in


def load_gymnax(env_id: str) -> FunctionalBackend:
    if not gymnax_supports(env_id):
        raise BackendError(f"gymnax has no equivalent of {env_id!r} (supported: {', '.join(GYMNAX_IDS)})")
    _seaborn_on_first_use()
    import gymnax
    import jax.numpy as jnp

    env, params = gymnax.make(GYMNAX_IDS[env_id])
    # The framework applies the registered time limit; gymnax's own must never fire first.
    params = dataclasses.replace(params, max_steps_in_episode=2**30)

    def reset(key):
        return env.reset_env(key, params)

    def step(key, state, action):
        obs, new_state, reward, done, _info = env.step_env(key, state, action, params)
        return obs, new_state, jnp.asarray(reward, jnp.float32), jnp.asarray(done, bool)

    return FunctionalBackend(name="gymnax", env_id=env_id, reset=reset, step=step,
                             source_hash="gymnax-" + getattr(gymnax, "__version__", "unknown"))
