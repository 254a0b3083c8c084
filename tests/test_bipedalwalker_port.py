"""The Rust port of BipedalWalker-v3 (envs_fast/translations/bipedalwalker_v3.rs + _sync.py) against the real
gymnasium env on pybox2d: Box2D's pieces one by one (mass data, edge-polygon manifolds, lidar ray
casts, time of impact, a joints-only solve in the air), then whole steps from states synced off
real rollouts (random actions and gymnasium's heuristic walker), the state round trip, and the
port's own reset. Box2D computes in float32; the port repeats its operations in the same order, so
the comparisons are exact wherever the state is synced exactly."""
import ctypes
import math

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("Box2D", reason="BipedalWalker's reference needs Box2D (gymnasium[box2d])")
import Box2D  # noqa: E402
from Box2D import b2  # noqa: E402
from gymnasium.envs.box2d.bipedal_walker import (  # noqa: E402
    HULL_POLY, LEG_H, LEG_W, SCALE, TERRAIN_STEP, BipedalWalkerHeuristics)
from scipy import stats  # noqa: E402

from envs_fast.rust.backend import load_rust  # noqa: E402
from envs_fast.rust.build import rustc_available  # noqa: E402
from envs_fast.translations import bipedalwalker_v3_sync as sync  # noqa: E402

pytestmark = [pytest.mark.skipif(not rustc_available(), reason="rustc not found on PATH"),
              pytest.mark.usefixtures("module_private_cache")]

ENV_ID = "BipedalWalker-v3"
SOURCE = "envs_fast/translations/bipedalwalker_v3.rs"
F32P = ctypes.POINTER(ctypes.c_float)
F64P = ctypes.POINTER(ctypes.c_double)
# step matching: Box2D rounds in float32, the observation is float32; a synced step is exact here,
# the allowance only absorbs a libm that rounds sinf/cosf differently
OBS_TOLERANCE = 1e-5
REWARD_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def port(module_private_cache):
    backend = load_rust(SOURCE, ENV_ID)
    lib = backend.library
    lib.autorl_bw_manifold.argtypes = [F32P, ctypes.c_size_t, F32P, F64P]
    lib.autorl_bw_raycast.argtypes = [F64P, F32P]
    lib.autorl_bw_raycast.restype = ctypes.c_float
    lib.autorl_bw_toi.argtypes = [F32P, ctypes.c_size_t, F32P, F32P]
    lib.autorl_bw_mass.argtypes = [ctypes.c_size_t, F32P]
    return backend


def f32(values) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32))


def ptr(array: np.ndarray, kind=F32P):
    return array.ctypes.data_as(kind)


def shapes():
    """pybox2d's shapes of the scene, kinds as the port numbers them: hull, upper leg, lower leg."""
    return [b2.polygonShape(vertices=[(x / SCALE, y / SCALE) for x, y in HULL_POLY]),
            b2.polygonShape(box=(LEG_W / 2, LEG_H / 2)),
            b2.polygonShape(box=(0.8 * LEG_W / 2, LEG_H / 2))]


def transform(x: float, y: float, angle: float):
    """A b2Transform (pybox2d leaves a new one uninitialised, like C++)."""
    xf = b2.transform()
    xf.position = (float(x), float(y))
    xf.angle = float(angle)
    return xf


def port_step(port, state: list, action: np.ndarray):
    array = np.array(state, dtype=np.float64)[None]
    obs, new_state, reward, terminated = port.step(np.array([1]), port._batched_state(array),
                                                   np.asarray(action, np.float64)[None])
    return np.asarray(obs[0], np.float64), float(reward[0]), bool(terminated[0]), new_state


# ---------------------------------------------------------------- components

def test_mass_data_matches_pybox2d(port):
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    u = env.unwrapped
    out = np.zeros(4, np.float32)
    for kind, body in [(0, u.hull), (1, u.legs[0]), (2, u.legs[1])]:
        port.library.autorl_bw_mass(kind, ptr(out))
        assert out[0] == np.float32(1.0) / np.float32(body.mass)
        # Box2D's I about the body origin is I_centre + m |c|^2; invI is 1 / I_centre
        centre_inertia = np.float32(body.inertia) - np.float32(body.mass) * np.float32(np.dot(body.localCenter, body.localCenter))
        assert out[1] == pytest.approx(1.0 / centre_inertia, rel=1e-6)
        assert (out[2], out[3]) == tuple(f32(body.localCenter))


def test_manifolds_match_pybox2d(port):
    """b2CollideEdgeAndPolygon on random poses of each body shape around random terrain segments:
    point count, type, normal, reference point, clip points and feature ids, bit for bit."""
    rng = np.random.default_rng(0)
    polys = shapes()
    touching = 0
    for trial in range(1500):
        kind = trial % 3
        x1, y1 = rng.uniform(0, 5), rng.uniform(3, 6)
        v1, v2 = (x1, y1), (x1 + TERRAIN_STEP, y1 + rng.uniform(-0.3, 0.3))
        mid = np.array([(v1[0] + v2[0]) / 2, (v1[1] + v2[1]) / 2])
        pose = f32([mid[0] + rng.uniform(-0.8, 0.8), mid[1] + rng.uniform(-0.7, 0.7), rng.uniform(-math.pi, math.pi)])
        edge = b2.edgeShape(vertices=[v1, v2])
        manifold = Box2D.b2Manifold()
        Box2D.b2CollideEdgeAndPolygon(manifold, edge, transform(0, 0, 0), polys[kind], transform(*pose))
        out = np.zeros(12, np.float64)
        port.library.autorl_bw_manifold(ptr(f32([*edge.vertices[0], *edge.vertices[1]])), kind, ptr(pose), ptr(out, F64P))
        assert int(out[0]) == manifold.pointCount, (trial, pose)
        if manifold.pointCount == 0:
            continue
        touching += 1
        assert int(out[1]) == manifold.type_
        assert tuple(f32(out[2:6])) == tuple(f32([*manifold.localNormal, *manifold.localPoint]))
        for p in range(manifold.pointCount):
            point = manifold.points[p]
            assert tuple(f32(out[6 + 3 * p:8 + 3 * p])) == tuple(f32(point.localPoint)), (trial, p)
            assert int(out[8 + 3 * p]) == point.id.key
    assert touching > 300  # the poses do exercise contact


def rollout_states(env, steps: int, seed: int, policy: str = "random"):
    """(state, action, the reference's (obs, reward, terminated)) along a real rollout."""
    rng = np.random.default_rng(seed)
    heuristic = BipedalWalkerHeuristics()
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        if policy == "random":
            action = rng.uniform(-1, 1, 4).astype(np.float32)
        else:
            action = np.asarray(heuristic.step_heuristic(obs), dtype=np.float32)
        state = sync.state_from_reference(env)
        obs, reward, terminated, truncated, _ = env.step(action)
        yield state, action, (np.asarray(obs, np.float64), float(reward), terminated)
        if terminated or truncated:
            obs, _ = env.reset()


def after_random_steps(seed: int, steps: int):
    """A reference env `steps` random actions after reset(seed), and the generator that drew them."""
    env = gym.make(ENV_ID)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        env.step(rng.uniform(-1, 1, 4).astype(np.float32))
    return env, rng


class NearestTerrain(Box2D.b2.rayCastCallback):
    """gymnasium's LidarCallback: terrain only (category bit 1), every hit clips the ray."""

    def ReportFixture(self, fixture, point, normal, fraction):
        if (fixture.filterData.categoryBits & 1) == 0:
            return -1
        self.fraction = fraction
        return fraction


def test_lidar_matches_world_raycast(port):
    env = gym.make(ENV_ID)
    rng = np.random.default_rng(1)
    checked = hits = 0
    for state, _, _ in rollout_states(env, 120, seed=4):
        u = env.unwrapped
        array = np.array(state, dtype=np.float64)
        for _ in range(3):
            p1 = f32(u.hull.position) + f32(rng.normal(0, 0.3, 2))
            angle = rng.uniform(0, 2 * math.pi)
            p2 = p1 + f32([math.sin(angle) * 5.3, -abs(math.cos(angle)) * 5.3])
            callback = NearestTerrain()
            callback.fraction = 1.0
            u.world.RayCast(callback, tuple(map(float, p1)), tuple(map(float, p2)))
            fraction = port.library.autorl_bw_raycast(ptr(array, F64P), ptr(f32([*p1, *p2])))
            assert np.float32(fraction) == np.float32(callback.fraction)
            checked += 1
            hits += callback.fraction < 1.0
    assert checked == 360 and hits > 100


def test_time_of_impact_matches_pybox2d(port):
    """b2TimeOfImpact of each body shape swept towards (and across) a terrain segment."""
    rng = np.random.default_rng(2)
    polys = shapes()
    states = set()
    for trial in range(600):
        kind = trial % 3
        body = polys[kind]
        x1, y1 = rng.uniform(0, 5), rng.uniform(3, 6)
        v1, v2 = (x1, y1), (x1 + TERRAIN_STEP, y1 + rng.uniform(-0.3, 0.3))
        edge = b2.edgeShape(vertices=[v1, v2])
        c0 = f32([x1 + rng.uniform(-0.2, 0.7), y1 + rng.uniform(0.4, 1.2)])
        c = c0 + f32([rng.uniform(-0.3, 0.3), -rng.uniform(0.0, 1.5)])
        a0 = np.float32(rng.uniform(-1, 1))
        a = np.float32(a0 + rng.uniform(-0.5, 0.5))
        port_centre = np.zeros(4, np.float32)
        port.library.autorl_bw_mass(kind, ptr(port_centre))
        centre = (float(port_centre[2]), float(port_centre[3]))
        sweep_b = Box2D.b2Sweep(localCenter=centre, c0=tuple(map(float, c0)), c=tuple(map(float, c)),
                                a0=float(a0), a=float(a), alpha0=0.0)
        sweep_a = Box2D.b2Sweep(localCenter=(0, 0), c0=(0, 0), c=(0, 0), a0=0.0, a=0.0, alpha0=0.0)
        state, t = Box2D.b2TimeOfImpact(shapeA=edge, shapeB=body, sweepA=sweep_a, sweepB=sweep_b, tMax=1.0)
        out = np.zeros(2, np.float32)
        port.library.autorl_bw_toi(ptr(f32([*edge.vertices[0], *edge.vertices[1]])), kind,
                                   ptr(f32([*c0, a0, *c, a])), ptr(out))
        assert (int(out[0]), out[1]) == (state, np.float32(t)), trial
        states.add(state)
    assert {3, 4} <= states  # touching and separated both occur


def lifted(state: list, dy: float) -> list:
    state = list(state)
    for b in range(5):
        state[sync.O_BODY + b * sync.BODY_FIELDS + 1] += dy
    return state


def test_joint_solve_in_the_air_matches(port):
    """With the walker lifted clear of the ground, a step is gravity plus the 4 revolute joints
    (motors, limits, warm starting): written to the reference, read back, stepped on both sides."""
    env = gym.make(ENV_ID)
    env.reset(seed=5)
    rng = np.random.default_rng(5)
    sync.state_to_reference(lifted(sync.state_from_reference(env), 4.0), env)
    for t in range(25):
        action = rng.uniform(-1, 1, 4).astype(np.float32)
        state = sync.state_from_reference(env)
        obs, reward, terminated, _ = port_step(port, state, action)
        ref_obs, ref_reward, ref_terminated, _, _ = env.step(action)
        if t > 0:  # from the second step on, no contact is left to touch
            assert not any(c.touching for c in env.unwrapped.world.contacts)
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=OBS_TOLERANCE)
        assert reward == pytest.approx(ref_reward, abs=REWARD_TOLERANCE)
        assert terminated == ref_terminated


@pytest.mark.parametrize("policy, seed, steps", [("random", 7, 700), ("heuristic", 8, 700)])
def test_synced_steps_match_gymnasium(port, policy, seed, steps):
    """One step of the port from the state synced off each state of a real rollout (resets included,
    so proxy ids come from a reused world) equals gymnasium's step: observation, reward, termination."""
    env = gym.make(ENV_ID)
    worst = exact = 0
    contacts_seen = 0
    for state, action, (ref_obs, ref_reward, ref_terminated) in rollout_states(env, steps, seed, policy):
        obs, reward, terminated, _ = port_step(port, state, action)
        deviation = float(np.max(np.abs(obs - ref_obs)))
        worst = max(worst, deviation)
        exact += deviation == 0 and reward == ref_reward
        contacts_seen += state[4] > 0
        assert deviation <= OBS_TOLERANCE, (policy, deviation)
        assert reward == pytest.approx(ref_reward, abs=REWARD_TOLERANCE)
        assert terminated == ref_terminated
    assert contacts_seen > steps // 2
    print(f"{policy}: {exact}/{steps} steps bit-exact, max observation deviation {worst:.3g}")


def test_rust_reset_round_trips_into_the_reference(port):
    """A state of the port's own reset (its terrain, its proxy ids) written into a reference env:
    the terrain is rebuilt, the bodies land where the state says, and the synced steps match."""
    obs, state = port.reset(np.array([11]))
    rust_state = [float(np.asarray(v)[0]) for v in state]
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    sync.state_to_reference(rust_state, env)
    read = sync.state_from_reference(env)
    terrain = slice(sync.O_TERRAIN, sync.O_TERRAIN + sync.TERRAIN_LENGTH)
    assert read[terrain] == rust_state[terrain]
    for b in range(5):
        o = sync.O_BODY + b * sync.BODY_FIELDS
        np.testing.assert_allclose(read[o:o + 6], rust_state[o:o + 6], rtol=0, atol=1e-6)
    rng = np.random.default_rng(11)
    for _ in range(60):
        action = rng.uniform(-1, 1, 4).astype(np.float32)
        state = sync.state_from_reference(env)
        obs, reward, terminated, _ = port_step(port, state, action)
        ref_obs, ref_reward, ref_terminated, _, _ = env.step(action)
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=OBS_TOLERANCE)
        assert terminated == ref_terminated
        if terminated:
            break


def test_port_reset_and_rollout_are_sane(port):
    """The port's reset draws its own terrain (not numpy's stream): its first observations follow
    the reference's distribution (KS per varying component), and its rollouts stay in the space."""
    n = 150
    port_obs, _ = port.reset(np.arange(n))
    env = gym.make(ENV_ID)
    ref_obs = np.array([env.reset(seed=int(s))[0] for s in range(1000, 1000 + n)])
    space = env.observation_space
    for i in range(24):
        a, b = np.asarray(port_obs)[:, i], ref_obs[:, i]
        if np.ptp(b) > 1e-6:
            assert stats.ks_2samp(a, b).pvalue > 1e-3 / 24, i
    obs, state = port.reset(np.arange(8))
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (8, 200, 4))
    observations, rewards, terminated = port.rollout(np.arange(8), state, actions)
    assert np.all(np.isfinite(rewards))
    inside = (observations >= space.low - 1e-6) & (observations <= space.high + 1e-6)
    assert inside[..., 14:].all()  # lidar fractions
    again = port.rollout(np.arange(8), state, actions)
    np.testing.assert_array_equal(again[0], observations)


def test_writing_a_state_gives_the_same_world_whatever_came_before(port):
    """state_to_reference makes what the reference derives itself (contacts, joint impulses,
    broad-phase) a function of the written state: the same state written after different histories
    reads back the same and steps the same, on the reference and on the port."""
    env, rng = after_random_steps(seed=9, steps=60)
    state = sync.state_from_reference(env)
    action = rng.uniform(-1, 1, 4).astype(np.float32)
    outcomes = []
    for history in range(2):
        for _ in range(15 + 10 * history):
            env.step(rng.uniform(-1, 1, 4).astype(np.float32))
        sync.state_to_reference(state, env)
        read = sync.state_from_reference(env)
        obs, reward, terminated, _ = port_step(port, read, action)
        ref_obs, ref_reward, ref_terminated, _, _ = env.step(action)
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=OBS_TOLERANCE)
        outcomes.append((read, ref_obs.tolist(), ref_reward))
    assert outcomes[0] == outcomes[1]
    assert read[4] > 0 and any(read[sync.O_CONTACT + 20 * k + 2] for k in range(int(read[4])))  # touching contacts


def test_a_lower_leg_written_far_from_its_knee_keeps_its_own_proxy(port):
    """A lower leg written ~18 m from its knee, over the terrain: its fat AABB holds a terrain edge's,
    so an internal node of the reference's b2DynamicTree (its children's combined AABB) has exactly
    the leg's fat AABB, with a lower id. The sync must take the leaf (b2BroadPhase::CreateProxy's
    id), not that node: a step then moves the leaf (the knee joint pulls the leg back, and
    b2Fixture::Synchronize's displacement widens the fat AABB by ~2 x 24 m), the internal node reads
    as two edges' box, and the pair order the port derives from the id differs. Stepped once with
    the brake action on both sides, every readable field agrees bit for bit."""
    env, _ = after_random_steps(seed=1, steps=40)
    state = sync.state_from_reference(env)
    o = sync.O_BODY + 2 * sync.BODY_FIELDS  # lower0
    state[o] += 17.7
    sync.state_to_reference(state, env)
    u = env.unwrapped
    bp = u.world.contactManager.broadPhase
    tight = sync._aabb(u.legs[1].fixtures[0].GetAABB(0))
    e = sync.AABB_EXTENSION
    fat = (tight[0] - e, tight[1] - e, tight[2] + e, tight[3] + e)
    same = [n for n in range(sync._node_capacity(bp)) if sync._aabb(bp.GetFatAABB(n)) == fat]
    assert len(same) > 1 and not sync._is_leaf(bp, same[0])  # the case: a lower-id internal node has the box
    read = sync.state_from_reference(env)
    ids = [int(read[sync.O_BODY + b * sync.BODY_FIELDS + 12]) for b in range(5)]
    assert ids == [2 * (sync.EDGES + b) - 1 for b in range(5)]  # a fresh world's leaves, in creation order
    action = np.array([-1, -1, -1, -1], np.float32)
    _, _, _, new_state = port_step(port, read, action)
    env.step(action)
    reference = sync.state_from_reference(env)
    ported = [float(np.asarray(v)[0]) for v in new_state]
    names = list(port.State._fields)
    differ = [(name, r, x) for name, r, x in zip(names, reference, ported)
              if name not in sync.UNREADABLE_FIELDS and not (r == x or (r != r and x != x))]
    assert not differ, differ[:8]
    assert reference[o + 8] < tight[0] - 40  # the leaf's fat AABB did take the step's displacement


@pytest.mark.parametrize("policy, seed, steps", [("random", 2, 300), ("heuristic", 2, 500)])
def test_port_rollout_follows_the_reference(port, policy, seed, steps):
    """Synced once, then the port runs on its own state (contacts, warm starts, broad-phase, sleep
    timers all its own) next to the reference under the same actions. A 1-ulp nudge of the hull grows
    to O(1) within 300 steps here, so staying within float32 rounding for hundreds of steps means
    the port repeats every rounding of Box2D's."""
    env = gym.make(ENV_ID)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    heuristic = BipedalWalkerHeuristics()
    act = lambda o: (rng.uniform(-1, 1, 4).astype(np.float32) if policy == "random"  # noqa: E731
                     else np.asarray(heuristic.step_heuristic(o), dtype=np.float32))
    for _ in range(30):
        obs, *_ = env.step(act(obs))
    state = port._batched_state(np.array(sync.state_from_reference(env))[None])
    port_obs = obs
    for t in range(steps):
        action = act(port_obs)
        out, state, reward, terminated = port.step(np.array([t]), state, np.asarray(action, np.float64)[None])
        ref_obs, ref_reward, ref_terminated, _, _ = env.step(action)
        port_obs = np.asarray(out[0])
        np.testing.assert_allclose(port_obs, ref_obs, rtol=0, atol=OBS_TOLERANCE, err_msg=f"step {t}")
        assert float(reward[0]) == pytest.approx(ref_reward, abs=REWARD_TOLERANCE)
        assert bool(terminated[0]) == ref_terminated
        if ref_terminated:
            break
    assert t >= min(steps - 1, 250)


def test_sleeping_matches(port):
    """Box2D puts the island to sleep after 0.5 s below its sleep tolerances (velocities zeroed)
    and gymnasium's motor-speed writes wake it each step. A walker only lies that still after its
    episode ended, so the reference is stepped on past termination: the port, synced once just after
    reset (every body moving, so every sleep timer at 0, as the sync reads them), falls asleep on the
    same step."""
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    u = env.unwrapped
    state = port._batched_state(np.array(sync.state_from_reference(env))[None])
    action = np.array([1, 0, 1, 0], np.float32)  # hips pushed to their limit, knees free
    asleep = []
    for t in range(600):
        out, state, reward, terminated = port.step(np.array([t]), state, np.asarray(action, np.float64)[None])
        ref_obs, ref_reward, ref_terminated, _, _ = u.step(action)
        np.testing.assert_allclose(np.asarray(out[0], np.float64), ref_obs, rtol=0, atol=OBS_TOLERANCE, err_msg=f"step {t}")
        port_awake = bool(np.asarray(state.hull_awake)[0])
        assert port_awake == u.hull.awake, t
        if not u.hull.awake:
            asleep.append(t)
            if len(asleep) > 5:
                break
    assert asleep  # the reference did sleep, and the port with it


def test_a_batch_steps_the_same_whatever_its_split_over_threads(port):
    """40 envs in one call (split over threads where the machine has more than one core) step to
    exactly what the same envs give one per call: envs are independent, so the split is
    results-neutral."""
    n, steps = 40, 30
    rng = np.random.default_rng(0)
    seeds = np.arange(1, n + 1)
    _, together = port.reset(seeds)
    alone = [port.reset(seeds[i:i + 1])[1] for i in range(n)]
    for t in range(steps):
        actions = rng.uniform(-1, 1, (n, 4))
        step_seeds = seeds * 1000 + t
        obs, together, reward, terminated = port.step(step_seeds, together, actions)
        for i in range(n):
            obs_i, alone[i], reward_i, terminated_i = port.step(step_seeds[i:i + 1], alone[i], actions[i:i + 1])
            np.testing.assert_array_equal(np.asarray(obs_i)[0], np.asarray(obs)[i])
            assert reward_i[0] == reward[i] and terminated_i[0] == terminated[i]


def test_concurrent_callers_step_the_same_as_one_caller(port):
    """Two threads stepping their own 40-env batches at once (ctypes releases the GIL: one gets the
    library's worker pool, the other fresh threads) get exactly what one caller gets, call after call
    (the pool's workers are reused between calls)."""
    import threading

    n, steps = 40, 12
    seeds = np.arange(1, n + 1)
    actions = [np.random.default_rng(t).uniform(-1, 1, (n, 4)) for t in range(steps)]

    def rollout(results: list, barrier=None):
        _, state = port.reset(seeds)
        for t in range(steps):
            if barrier is not None:
                barrier.wait()
            obs, state, reward, terminated = port.step(seeds * 1000 + t, state, actions[t])
            results.append((np.array(obs), np.array(reward), np.array(terminated)))
        results.append(np.array(state))

    expected: list = []
    rollout(expected)
    barrier = threading.Barrier(2)
    outputs: list[list] = [[], []]
    threads = [threading.Thread(target=rollout, args=(outputs[k], barrier)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for output in outputs:
        assert len(output) == len(expected)
        for got, want in zip(output, expected):
            for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                np.testing.assert_array_equal(a, b)


def test_a_written_worlds_proxy_ids_are_the_leaves_that_hold_each_body():
    """state_to_reference takes every proxy id of the world it builds from the tree's allocation order
    (proxy k's leaf is node 2k - 1 in a fresh b2DynamicTree) rather than reading every node: each of the
    199 edges and 5 walker bodies must be a leaf holding exactly that body's fat AABB, over states with
    feet on the ground and legs crossing, as a scan of every node would have found them."""
    env = gym.make("BipedalWalker-v3")
    rng = np.random.default_rng(3)
    written = 0
    for seed in range(3):
        env.reset(seed=seed)
        for t in range(90):
            env.step(rng.uniform(-1, 1, 4).astype(np.float32))
            if t % 15:
                continue
            sync.state_to_reference(sync.state_from_reference(env), env)
            u = env.unwrapped
            bp = u.world.contactManager.broadPhase
            terrain, edge_ids = u._autorl_edge_proxies
            assert terrain is u.terrain and len(edge_ids) == sync.EDGES
            by_segment = {sync.EDGES - 1 - k: body for k, body in enumerate(u.terrain)}
            pairs = [(by_segment[k], edge_ids[k]) for k in range(sync.EDGES)]
            pairs += [(body, body._autorl_proxy) for body in sync._bodies(u)]
            for body, node in pairs:
                assert sync._is_leaf(bp, node), node
                assert sync._aabb(bp.GetFatAABB(node)) == sync._fat(sync._aabb(body.fixtures[0].GetAABB(0))), node
            assert len({node for _, node in pairs}) == len(pairs)
            written += 1
    env.close()
    assert written == 18
