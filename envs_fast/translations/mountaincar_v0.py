"""MountainCar-v0 in JAX, equivalent to gymnasium 1.x `classic_control/mountain_car.py`."""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ENV_ID = "MountainCar-v0"

MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.5
GOAL_VELOCITY = 0.0
FORCE = 0.001
GRAVITY = 0.0025


class State(NamedTuple):
    position: jax.Array
    velocity: jax.Array


def _obs(s: State) -> jax.Array:
    return jnp.stack([s.position, s.velocity]).astype(jnp.float32)


def reset(key):
    state = State(jax.random.uniform(key, (), minval=-0.6, maxval=-0.4), jnp.float32(0.0))
    return _obs(state), state


def step(key, state: State, action):
    velocity = state.velocity + (action - 1) * FORCE + jnp.cos(3 * state.position) * (-GRAVITY)
    velocity = jnp.clip(velocity, -MAX_SPEED, MAX_SPEED)
    position = jnp.clip(state.position + velocity, MIN_POSITION, MAX_POSITION)
    # hitting the left wall stops the car
    velocity = jnp.where((position == MIN_POSITION) & (velocity < 0), 0.0, velocity)
    new = State(position.astype(jnp.float32), velocity.astype(jnp.float32))
    terminated = (new.position >= GOAL_POSITION) & (new.velocity >= GOAL_VELOCITY)
    return _obs(new), new, jnp.float32(-1.0), terminated


def state_from_reference(env) -> State:
    position, velocity = env.unwrapped.state
    return State(np.float32(position), np.float32(velocity))


def state_to_reference(state: State, env) -> None:
    env.unwrapped.state = np.array([float(state.position), float(state.velocity)], dtype=np.float64)
