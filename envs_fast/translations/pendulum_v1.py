"""Pendulum-v1 in JAX, equivalent to gymnasium 1.x `classic_control/pendulum.py` (g = 10)."""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ENV_ID = "Pendulum-v1"

MAX_SPEED = 8.0
MAX_TORQUE = 2.0
DT = 0.05
G = 10.0
M = 1.0
L = 1.0


class State(NamedTuple):
    theta: jax.Array
    theta_dot: jax.Array


def _obs(s: State) -> jax.Array:
    return jnp.stack([jnp.cos(s.theta), jnp.sin(s.theta), s.theta_dot]).astype(jnp.float32)


def _angle_normalize(x):
    return ((x + math.pi) % (2 * math.pi)) - math.pi


def reset(key):
    values = jax.random.uniform(key, (2,), minval=jnp.array([-math.pi, -1.0]), maxval=jnp.array([math.pi, 1.0]))
    state = State(*values)
    return _obs(state), state


def step(key, state: State, action):
    u = jnp.clip(jnp.asarray(action, dtype=jnp.float32).reshape(-1)[0], -MAX_TORQUE, MAX_TORQUE)
    costs = _angle_normalize(state.theta) ** 2 + 0.1 * state.theta_dot**2 + 0.001 * u**2
    theta_dot = state.theta_dot + (3 * G / (2 * L) * jnp.sin(state.theta) + 3.0 / (M * L**2) * u) * DT
    theta_dot = jnp.clip(theta_dot, -MAX_SPEED, MAX_SPEED)
    new = State(state.theta + theta_dot * DT, theta_dot)
    return _obs(new), new, (-costs).astype(jnp.float32), jnp.bool_(False)


def state_from_reference(env) -> State:
    theta, theta_dot = env.unwrapped.state
    return State(np.float32(theta), np.float32(theta_dot))


def state_to_reference(state: State, env) -> None:
    env.unwrapped.state = np.array([float(state.theta), float(state.theta_dot)], dtype=np.float64)
