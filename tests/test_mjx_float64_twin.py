"""mjx computes in float32 where its reference (C MuJoCo) computes in float64, and at stiff constraints
float32 rounding alone goes beyond the verifier's tolerances. verify separates the two: L2 and L3 hold
mjx's float64 twin (the same program under jax_enable_x64) to the reference, and report how far the
float32 backend is from that twin; L1 and L4 run the float32 backend itself."""
from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("mujoco.mjx", reason="mujoco-mjx is not installed")
jax = pytest.importorskip("jax")

from envs_fast.backends.load import load_batched, load_float64_twin  # noqa: E402
from envs_fast.verify import verify  # noqa: E402
from envs_fast.verify.context import Settings  # noqa: E402

pytestmark = [pytest.mark.usefixtures("private_cache"), pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.mark.slow
def test_l2_and_l3_hold_the_float64_twin_to_the_reference_and_measure_float32_apart():
    """Hopper passes L2 and L3 through its twin, whose steps agree with C MuJoCo far inside the base
    tolerance (float32 steps would use a visible fraction of it), and the report states how far the
    float32 backend departs from the twin, in both levels."""
    settings = Settings(l2_target=200, rollout_steps=60, l3_trajectories=6)
    report = verify("Hopper-v5", "mjx", levels=(2, 3), settings=settings, use_cache=False)
    assert report.passed, report.to_text()
    for level in report.levels:
        assert level.largest_deviation["fraction of allowed"] < 1e-3, level.largest_deviation
        assert "jax_enable_x64" in level.tolerances["float64 twin"]
        assert "depart from the twin's by up to" in level.tolerances["float32 backend"], level.tolerances


@pytest.mark.slow
def test_the_twin_steps_in_float64_beside_the_float32_backend():
    """Called in turn, the twin and the backend each keep their own precision (JAX's x64 switch leaves
    nested jits cached in the other mode; the twin clears them), and only mjx has a twin."""
    import gymnasium as gym

    backend, twin = load_batched("mjx", "Hopper-v5"), load_float64_twin("mjx", "Hopper-v5")
    reference = gym.make("Hopper-v5")
    reference.reset(seed=1)
    state = jax.tree_util.tree_map(lambda x: np.asarray(x)[None], backend.state_from_reference(reference))
    action = np.zeros((1, 3), np.float32)
    seeds = np.zeros(1, np.uint32)
    for _ in range(2):
        twin_obs = twin.step(seeds, state, action)[0]
        own_obs = backend.step(seeds, state, action)[0]
        assert twin_obs.dtype == np.float64 and own_obs.dtype == np.float32
    assert load_float64_twin("mujoco_batch", "Hopper-v5") is None
    assert load_float64_twin("gymnax", "CartPole-v1") is None
