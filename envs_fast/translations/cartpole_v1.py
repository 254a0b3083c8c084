"""CartPole-v1 in JAX, equivalent to gymnasium 1.x `classic_control/cartpole.py`.

A worked example of the envs_fast backend protocol: ONE environment, pure functions, the
framework vmaps them, auto-resets and applies the registered time limit (500 steps).
"""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ENV_ID = "CartPole-v1"

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASS_POLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds between state updates
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class State(NamedTuple):
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array


def _obs(state: State) -> jax.Array:
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot]).astype(jnp.float32)


def reset(key):
    values = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)
    state = State(*values)
    return _obs(state), state


def step(key, state: State, action):
    force = jnp.where(action == 1, FORCE_MAG, -FORCE_MAG)
    cos_theta = jnp.cos(state.theta)
    sin_theta = jnp.sin(state.theta)
    temp = (force + POLEMASS_LENGTH * state.theta_dot**2 * sin_theta) / TOTAL_MASS
    theta_acc = (GRAVITY * sin_theta - cos_theta * temp) / (
        LENGTH * (4.0 / 3.0 - MASS_POLE * cos_theta**2 / TOTAL_MASS)
    )
    x_acc = temp - POLEMASS_LENGTH * theta_acc * cos_theta / TOTAL_MASS
    # explicit Euler, as the reference's default kinematics_integrator
    new = State(
        x=state.x + TAU * state.x_dot,
        x_dot=state.x_dot + TAU * x_acc,
        theta=state.theta + TAU * state.theta_dot,
        theta_dot=state.theta_dot + TAU * theta_acc,
    )
    terminated = (
        (new.x < -X_THRESHOLD)
        | (new.x > X_THRESHOLD)
        | (new.theta < -THETA_THRESHOLD)
        | (new.theta > THETA_THRESHOLD)
    )
    reward = jnp.float32(1.0)  # also 1.0 on the terminating step
    return _obs(new), new, reward, terminated


def state_from_reference(env) -> State:
    values = np.asarray(env.unwrapped.state, dtype=np.float64)
    return State(*(np.float32(v) for v in values))


def state_to_reference(state: State, env) -> None:
    env.unwrapped.state = np.array([float(v) for v in state], dtype=np.float64)
    env.unwrapped.steps_beyond_terminated = None
