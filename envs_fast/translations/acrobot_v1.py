"""Acrobot-v1 in JAX, equivalent to gymnasium 1.x `classic_control/acrobot.py` ("book" dynamics,
no torque noise, one RK4 step of dt = 0.2 per env step)."""
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ENV_ID = "Acrobot-v1"

DT = 0.2
LINK_LENGTH_1 = 1.0
LINK_MASS_1 = 1.0
LINK_MASS_2 = 1.0
LINK_COM_POS_1 = 0.5
LINK_COM_POS_2 = 0.5
LINK_MOI = 1.0
MAX_VEL_1 = 4 * math.pi
MAX_VEL_2 = 9 * math.pi
AVAILABLE_TORQUE = (-1.0, 0.0, 1.0)
G = 9.8


class State(NamedTuple):
    theta1: jax.Array
    theta2: jax.Array
    dtheta1: jax.Array
    dtheta2: jax.Array


def _obs(s: State) -> jax.Array:
    return jnp.stack(
        [jnp.cos(s.theta1), jnp.sin(s.theta1), jnp.cos(s.theta2), jnp.sin(s.theta2), s.dtheta1, s.dtheta2]
    ).astype(jnp.float32)


def reset(key):
    values = jax.random.uniform(key, (4,), minval=-0.1, maxval=0.1)
    state = State(*values)
    return _obs(state), state


def _derivatives(y, torque):
    theta1, theta2, dtheta1, dtheta2 = y
    m1, m2, l1 = LINK_MASS_1, LINK_MASS_2, LINK_LENGTH_1
    lc1, lc2, i1, i2 = LINK_COM_POS_1, LINK_COM_POS_2, LINK_MOI, LINK_MOI
    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * jnp.cos(theta2)) + i1 + i2
    d2 = m2 * (lc2**2 + l1 * lc2 * jnp.cos(theta2)) + i2
    phi2 = m2 * lc2 * G * jnp.cos(theta1 + theta2 - math.pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * dtheta2**2 * jnp.sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * jnp.sin(theta2)
        + (m1 * lc1 + m2 * l1) * G * jnp.cos(theta1 - math.pi / 2)
        + phi2
    )
    ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * jnp.sin(theta2) - phi2) / (
        m2 * lc2**2 + i2 - d2**2 / d1
    )
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return jnp.stack([dtheta1, dtheta2, ddtheta1, ddtheta2])


def _wrap(x, low, high):
    """The reference's while-loop wrap in closed form: shift by whole periods until in [low, high]."""
    period = high - low
    above = jnp.ceil((x - high) / period)
    below = jnp.ceil((low - x) / period)
    return jnp.where(x > high, x - above * period, jnp.where(x < low, x + below * period, x))


def step(key, state: State, action):
    torque = jnp.asarray(AVAILABLE_TORQUE, dtype=jnp.float32)[action]
    y0 = jnp.stack(list(state))
    k1 = _derivatives(y0, torque)
    k2 = _derivatives(y0 + DT / 2 * k1, torque)
    k3 = _derivatives(y0 + DT / 2 * k2, torque)
    k4 = _derivatives(y0 + DT * k3, torque)
    y = y0 + DT / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    new = State(
        theta1=_wrap(y[0], -math.pi, math.pi),
        theta2=_wrap(y[1], -math.pi, math.pi),
        dtheta1=jnp.clip(y[2], -MAX_VEL_1, MAX_VEL_1),
        dtheta2=jnp.clip(y[3], -MAX_VEL_2, MAX_VEL_2),
    )
    terminated = -jnp.cos(new.theta1) - jnp.cos(new.theta2 + new.theta1) > 1.0
    reward = jnp.where(terminated, 0.0, -1.0).astype(jnp.float32)
    return _obs(new), new, reward, terminated


def state_from_reference(env) -> State:
    values = np.asarray(env.unwrapped.state, dtype=np.float64)
    return State(*(np.float32(v) for v in values))


def state_to_reference(state: State, env) -> None:
    env.unwrapped.state = np.array([float(v) for v in state], dtype=np.float64)
