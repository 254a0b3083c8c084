"""State sync of the Rust CartPole-v1 (`cartpole_v1.rs`) with gymnasium's CartPoleEnv: the state in
the order of its `autorl_state_fields` (x, x_dot, theta, theta_dot), float64 like the reference."""
import numpy as np


def state_from_reference(env):
    return [float(v) for v in env.unwrapped.state]


def state_to_reference(state, env) -> None:
    env.unwrapped.state = np.array([float(v) for v in state], dtype=np.float64)
    env.unwrapped.steps_beyond_terminated = None  # a fresh step: reward 1 even if it terminates
