"""Verification of the Rust BipedalWalker-v3 port through the levels (envs_fast/verify with the
declarations of envs_fast/translations/bipedalwalker_v3_sync.py): the kinds of state L2 must step from occur and
are counted, and a port that differs from the reference fails its level naming the field, the state
and the figures (a changed constant compiled into a copy of the port, or a wrapper that moves one
observation field). The whole verification's run lives in bench/results/bipedalwalker-verify-*."""
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("Box2D", reason="BipedalWalker's reference needs Box2D (gymnasium[box2d])")

from envs_fast.backends import load as backends  # noqa: E402
from envs_fast.translations import bipedalwalker_v3_sync as sync  # noqa: E402
from envs_fast.rust.build import rustc_available  # noqa: E402
from envs_fast.verify import Settings, verify  # noqa: E402

pytestmark = pytest.mark.usefixtures("private_cache")

REPO = Path(__file__).resolve().parent.parent
ENV_ID = "BipedalWalker-v3"
SOURCE = REPO / "envs_fast" / "translations" / "bipedalwalker_v3.rs"
needs_rustc = pytest.mark.skipif(not rustc_available(), reason="rustc not found on PATH")
# Small enough for the suite (a few hundred L2 states; the full run is bench/results/bipedalwalker-verify-*).
QUICK = Settings(reset_samples=150, state_reset_samples=120, l2_target=100, l2_policy_steps=10, rollout_steps=30,
                 l3_trajectories=8, statistics_episodes=12)


def test_declared_kinds_of_state_occur_under_the_declared_policies():
    """The predicates L2 counts fire on the states L2 steps from (read off an episode running on its
    own, written into a second reference and read back), and not on every state: the heuristic walker
    strikes its feet down and drives joints to their limits; standing still, the bodies sleep."""
    env, synced = gym.make(ENV_ID), gym.make(ENV_ID)
    synced.reset(seed=0)
    seen = {name: 0 for name in sync.STATE_CATEGORIES}
    steps = 0
    for name, seed in (("heuristic walker", 3), ("standing still until asleep", 0)):
        obs, _ = env.reset(seed=seed)
        act = sync.VERIFY_POLICIES[name]["make"](seed)
        for _ in range(sync.VERIFY_POLICIES[name]["l2_steps"]):
            action = act(obs)
            sync.state_to_reference(sync.state_from_reference(env), synced)
            state = sync.state_from_reference(synced)
            synced.unwrapped.step(action)
            after = sync.state_from_reference(synced)
            for kind, holds in sync.STATE_CATEGORIES.items():
                seen[kind] += holds(state, after)
            obs, *_ = env.unwrapped.step(action)
            steps += 1
    assert all(count > 0 for count in seen.values()), seen
    assert all(count < steps / 2 for count in seen.values()), seen


def test_a_written_state_replays_the_contact_events_of_the_next_collision():
    """A state read after a step holds manifolds of that step's start; the real world's next collision
    ends or begins contacts and gymnasium's listener flips ground_contact. Written into the reference
    (which collides at once, without the listener), the same flags must come out: stepped with states
    written every step, the legs' ground-contact observations follow the unwritten reference's."""
    plain, written = gym.make(ENV_ID), gym.make(ENV_ID)
    obs, _ = plain.reset(seed=500)
    written.reset(seed=500)
    act = sync.heuristic_walker(0)
    flips = 0
    previous = obs[[8, 13]]
    for t in range(60):
        action = act(obs)
        sync.state_to_reference(sync.state_from_reference(plain), written)
        obs, *_ = plain.unwrapped.step(action)
        written_obs, *_ = written.unwrapped.step(action)
        assert list(written_obs[[8, 13]]) == list(obs[[8, 13]]), t
        flips += int(np.any(obs[[8, 13]] != previous))
        previous = obs[[8, 13]]
    assert flips >= 2  # the feet did leave and strike the ground


def _mutant(tmp_path, old: str, new: str) -> Path:
    """A copy of the port with one change, next to a copy of its sync companion."""
    text = SOURCE.read_text()
    assert text.count(old) == 1, f"mutation anchor {old!r} not found once"
    path = tmp_path / SOURCE.name
    path.write_text(text.replace(old, new))
    (tmp_path / "bipedalwalker_v3_sync.py").write_text((REPO / "envs_fast" / "translations" / "bipedalwalker_v3_sync.py").read_text())
    return path


@needs_rustc
@pytest.mark.slow
def test_a_weaker_motor_fails_l2_naming_field_state_and_figures(tmp_path):
    """MOTORS_TORQUE 80 -> 78: the joints' motor impulses saturate lower, so a synced step differs."""
    report = verify(ENV_ID, str(_mutant(tmp_path, "const MOTORS_TORQUE: f64 = 80.0;", "const MOTORS_TORQUE: f64 = 78.0;")),
                    (2,), QUICK)
    level = report.levels[0]
    assert level.status == "fail", report.to_text()
    failure = level.failure
    assert failure["check"].startswith("step from"), failure
    assert failure["fields"] and all(item["reference"] != item["backend"] for item in failure["fields"])
    assert any(item["field"].startswith(("obs[", "state.")) for item in failure["fields"])
    assert "hull_cx=" in failure["state"] and failure["action"]
    text = report.to_text()
    assert "differing fields (field: reference -> backend, |diff|, allowed):" in text


@needs_rustc
def test_a_sync_field_left_out_fails_l2_naming_the_fields_and_the_state(tmp_path):
    """state_to_reference that never writes the bodies' angular velocities (a field left out of the
    sync): L2's round trip fails before any step, naming each field that did not read back, with the
    state written and the state read back."""
    path = tmp_path / SOURCE.name
    path.write_text(SOURCE.read_text())  # the port as shipped, beside a sync with the field left out
    sync_path = tmp_path / "bipedalwalker_v3_sync.py"
    text = (REPO / "envs_fast" / "translations" / "bipedalwalker_v3_sync.py").read_text()
    assert text.count("        body.angularVelocity = s[o + 5]\n") == 1
    sync_path.write_text(text.replace("        body.angularVelocity = s[o + 5]\n", ""))
    report = verify(ENV_ID, str(path), (2,), QUICK)
    failure = report.levels[0].failure
    assert report.levels[0].status == "fail" and failure["check"] == "state sync round trip", report.to_text()
    lost = failure["fields that did not read back (field: written -> read back)"]
    assert ".hull_w: " in lost and "-> 0" in lost, lost
    assert not any(name in lost for name in (".hull_cx:", ".hull_vx:", ".hull_angle:")), lost
    assert ".hull_w=" in failure["written"] and ".hull_w=0" in failure["read back"]
    assert "fields that did not read back" in report.to_text()


class ObservationOffBy:
    """The port with one observation component moved: a stand-in for a mistranslated formula."""

    def __init__(self, inner, index: int, offset: float):
        self._inner, self._index, self._offset = inner, index, offset

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _moved(self, obs):
        obs = np.array(obs, dtype=np.float32, copy=True)
        obs[..., self._index] += np.float32(self._offset)
        return obs

    def step(self, seeds, state, actions):
        obs, state, reward, terminated = self._inner.step(seeds, state, actions)
        return self._moved(obs), state, reward, terminated

    def rollout(self, seeds, state, actions):
        obs, reward, terminated = self._inner.rollout(seeds, state, actions)
        return self._moved(obs), reward, terminated


@needs_rustc
def test_an_observation_field_off_by_a_little_fails_l3_synced_rollouts_naming_it(monkeypatch):
    """obs[2] (the hull's horizontal speed) off by 1e-3 in the port's steps: L3's synced rollouts
    fail at their first step, naming obs[2] with the reference's and the port's figures."""
    load = backends.load_batched
    monkeypatch.setattr(backends, "load_batched", lambda *args, **kw: ObservationOffBy(load(*args, **kw), 2, 1e-3))
    report = verify(ENV_ID, str(SOURCE), (3,), Settings(l3_trajectories=4, rollout_steps=20, statistics_episodes=4))
    level = report.levels[0]
    trajectories = next(check for check in level.checks if check.name == "trajectories from synced starts")
    assert not trajectories.passed, report.to_text()
    failure = level.failure
    assert failure["check"] == "trajectories from synced starts" and failure["step"] == 0
    assert [item["field"] for item in failure["fields"]] == ["obs[2]"]
    item = failure["fields"][0]
    assert abs(float(item["backend"]) - float(item["reference"]) - 1e-3) < 1e-5
    assert "hull_cx=" in failure["state"]


@needs_rustc
def test_rougher_terrain_fails_l1_reset_state_distribution_naming_a_terrain_height(tmp_path):
    """The port's terrain drawn twice as rough: the first observation hardly shows it (the walker
    starts on a flat pad), the reset state's terrain heights do."""
    path = _mutant(tmp_path, "velocity += rng.uniform(-1.0, 1.0) / SCALE;", "velocity += rng.uniform(-2.0, 2.0) / SCALE;")
    report = verify(ENV_ID, str(path), (1,), QUICK)
    level = report.levels[0]
    check = next(check for check in level.checks if check.name == "reset state distribution")
    assert not check.passed, report.to_text()
    failure = level.failure
    assert failure["check"] == "reset state distribution" and failure["field"].startswith("state.terrain_y")
    assert failure["backend mean/sd/min/max"] != failure["reference mean/sd/min/max"]
