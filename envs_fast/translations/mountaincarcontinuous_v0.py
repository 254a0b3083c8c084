"""MountainCarContinuous-v0 in JAX, equivalent to gymnasium 1.x
`classic_control/continuous_mountain_car.py` (whose state is float32 after the first step)."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ENV_ID = "MountainCarContinuous-v0"

MIN_ACTION = -1.0
MAX_ACTION = 1.0
MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.45
GOAL_VELOCITY = 0.0
POWER = 0.0015


class State(NamedTuple):
    position: jax.Array
    velocity: jax.Array


def _obs(s: State) -> jax.Array:
    return jnp.stack([s.position, s.velocity]).astype(jnp.float32)


def reset(key):
    state = State(jax.random.uniform(key, (), minval=-0.6, maxval=-0.4), jnp.float32(0.0))
    return _obs(state), state


def step(key, state: State, action):
    raw = jnp.asarray(action, dtype=jnp.float32).reshape(-1)[0]
    force = jnp.clip(raw, MIN_ACTION, MAX_ACTION)
    velocity = state.velocity + force * POWER - 0.0025 * jnp.cos(3 * state.position)
    velocity = jnp.clip(velocity, -MAX_SPEED, MAX_SPEED)
    position = jnp.clip(state.position + velocity, MIN_POSITION, MAX_POSITION)
    velocity = jnp.where((position == MIN_POSITION) & (velocity < 0), 0.0, velocity)
    new = State(position.astype(jnp.float32), velocity.astype(jnp.float32))
    terminated = (new.position >= GOAL_POSITION) & (new.velocity >= GOAL_VELOCITY)
    # the reward uses the unclipped action, as the reference does
    reward = jnp.where(terminated, 100.0, 0.0) - raw**2 * 0.1
    return _obs(new), new, reward.astype(jnp.float32), terminated


def state_from_reference(env) -> State:
    position, velocity = env.unwrapped.state
    return State(np.float32(position), np.float32(velocity))


def state_to_reference(state: State, env) -> None:
    env.unwrapped.state = np.array([float(state.position), float(state.velocity)], dtype=np.float32)
