"""CliffWalking-v1 in JAX, written to the envs_fast protocol (a test translation: no backend ships for it)."""
import jax.numpy as jnp

ENV_ID = "CliffWalking-v1"
ROWS, COLS = 4, 12
START = 36
ROW_DELTA = jnp.array([-1, 0, 1, 0])
COL_DELTA = jnp.array([0, 1, 0, -1])


def reset(key):
    state = jnp.int32(START)
    return state, state


def step(key, state, action):
    row = jnp.clip(state // COLS + ROW_DELTA[action], 0, ROWS - 1)
    col = jnp.clip(state % COLS + COL_DELTA[action], 0, COLS - 1)
    cliff = (row == ROWS - 1) & (col >= 1) & (col <= COLS - 2)
    new = jnp.where(cliff, START, row * COLS + col).astype(jnp.int32)
    reward = jnp.where(cliff, -100.0, -1.0)
    terminated = (~cliff) & (row == ROWS - 1) & (col == COLS - 1)
    return new, new, reward, terminated


def state_from_reference(env):
    return jnp.int32(env.unwrapped.s)


def state_to_reference(state, env):
    env.unwrapped.s = int(state)
