"""State sync of the Rust Acrobot-v1 (`acrobot_v1.rs`) with gymnasium's AcrobotEnv: the state in the
order of its `autorl_state_fields` (theta1, theta2, dtheta1, dtheta2). The reference keeps its reset
state as float32 and every later one as float64; both read back exactly as float64."""
import numpy as np


def state_from_reference(env):
    return [float(v) for v in env.unwrapped.state]


def state_to_reference(state, env) -> None:
    env.unwrapped.state = np.array([float(v) for v in state], dtype=np.float64)
