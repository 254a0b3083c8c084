"""The JAX BipedalWalker-v3 port (envs_fast/translations/bipedalwalker_v3.py) against the Rust port and gymnasium on the
states where `verify` told it apart (bench/results/bipedal-jax-verify-2026-11-26.txt), rebuilt the way
the verifier builds them, and along L3's scripted trajectories.

    .venv/bin/python -m bench.bipedal_jax_vs_rust [--jax-file PATH] [--no-rollout-states] [--no-trajectories]

- L2 rollout states (the verifier's collect_rollout_samples, seed 0, without its sensitivity probes):
  among them the failing one, "constant action 0, episode seed 2, step 106";
- the failing boundary state: leg0's cx (.bodies[13]) moved 8 spreads left of L2's base state 3;
- L3's five scripted trajectories (reset seeds 100-104) up to their predictable horizons.

For each step from a synced state: whether the JAX port's next state is the Rust port's bit for bit (the
Rust port steps gymnasium's Box2D bit for bit; prev_shaping is left out, the Rust port keeps it in float64),
and the largest |JAX - reference| over observation, reward and state as a fraction of the verifier's float
tolerance without its sensitivity term (1e-5 + 1e-4 |reference|). --jax-file runs another copy of the port
(its folder needs the sync companion), e.g. an older commit's, for a before/after.
"""
import argparse
import sys
import time
import warnings
from pathlib import Path


import jax  # noqa: E402
import numpy as np  # noqa: E402

from envs_fast.translations import bipedalwalker_v3_sync as sync  # noqa: E402
from envs_fast.verify.probes import (ReferenceStepper, _replace_component, collect_rollout_samples,  # noqa: E402
                              field_names, flat_values, scripted_plans)
from envs_fast.rust.backend import load_rust  # noqa: E402
from envs_fast.verify import interactions, rollouts  # noqa: E402
from envs_fast.verify.context import Context, Settings  # noqa: E402

ENV_ID = "BipedalWalker-v3"
ROOT = Path(__file__).resolve().parent.parent
ATOL, RTOL = 1e-5, 1e-4
FAILING_ROLLOUT_STATE = "constant action array([0., 0., 0., 0.], dtype=float32), episode seed 2, step 106"
NOT_COMPARED_WITH_RUST = {"prev_shaping"}  # float32 in the JAX state, float64 in the Rust one


class QuickStepper(ReferenceStepper):
    """The verifier's stepper without the sensitivity probes (3x fewer reference steps)."""

    def sample(self, state, action, origin, sensitivity=False):
        return super().sample(state, action, origin, sensitivity=False)


def rollout_samples(ctx, stepper):
    """L2's 'step from rollout states', as interactions._check gathers them (same target, same seed)."""
    s = ctx.settings
    horizon = min(ctx.max_episode_steps or s.rollout_steps, s.rollout_steps)
    policies = [p for p in ctx.declarations.policies if p.l2_episodes > 0]
    planned = sum(p.l2_episodes * interactions._policy_steps(s, p, horizon) for p in policies)
    return collect_rollout_samples(stepper, ctx.action_space, horizon, max(s.l2_target - planned, 0), s.seed)


def boundary_sample(stepper, rollout):
    """The boundary state verify failed on: '.bodies[13] = 1.36368 from base state 3' (collect_boundary_samples:
    base state 3 is the last rollout state; the value is start - scale * 2**3, first probe action)."""
    states = [smp.state for smp in rollout]
    spreads = np.std(np.stack([flat_values(st) for st in states]), axis=0)
    base = states[-1]
    component = field_names(base).index(".bodies[13]")
    start = float(np.asarray(base.bodies).reshape(-1)[13])
    scale = max(float(spreads[component]), 0.05 * abs(start), 1e-3)
    value = start - scale * 2.0 ** 3
    leaf = [i for i, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(base)[0])
            if jax.tree_util.keystr(path) == ".bodies"][0]
    return stepper.sample(_replace_component(base, leaf, 13, value), -np.ones(4, np.float32),
                          f"boundary search: .bodies[13] = {value:.6g} from base state 3")


def rust_flat(state) -> np.ndarray:
    """The Rust port's flat state of a JAX port state (feature codes back to Box2D's keys)."""
    contacts = np.array(state.contacts, np.float64).reshape(sync.MAX_CONTACTS, sync.CONTACT_FIELDS)
    for column in (14, 19):
        code = contacts[:, column].astype(np.int64)
        contacts[:, column] = (code % 8) | (((code // 8) % 8) << 8) | (((code // 64) % 2) << 16) | (((code // 128) % 2) << 24)
    return np.concatenate([np.asarray(state.header, np.float64).ravel(), np.asarray(state.bodies, np.float64).ravel(),
                           np.asarray(state.joints, np.float64).ravel(), np.asarray(state.terrain_y, np.float64).ravel(),
                           np.asarray(state.edge_proxy, np.float64).ravel(), contacts.ravel()])


def compare_steps(ctx, rust, samples) -> list[dict]:
    """Each sample stepped by the JAX port (as L2 does: the verifier's batched backend) and by the Rust port."""
    names = rust.state_fields
    stack = lambda xs: jax.tree_util.tree_map(lambda *v: np.stack(v), *xs)  # noqa: E731
    b_obs, b_state, b_reward, _ = ctx.backend.step(np.arange(len(samples)), stack([s.state for s in samples]),
                                                   np.stack([np.asarray(s.action) for s in samples]))
    flats = np.stack([rust_flat(s.state) for s in samples])
    r_obs, r_state, r_reward, _ = rust.step(np.arange(len(samples)), rust._batched_state(flats),
                                            np.stack([np.asarray(s.action, np.float64) for s in samples]))
    r_state = np.stack(r_state, axis=1)
    keep = np.array([n not in NOT_COMPARED_WITH_RUST and not n.startswith("terrain_y") for n in names])
    rows = []
    for i, smp in enumerate(samples):
        j_state = rust_flat(jax.tree_util.tree_map(lambda x: np.asarray(x)[i], b_state))
        differ = keep & ~((j_state == r_state[i]) | (np.isnan(j_state) & np.isnan(r_state[i])))
        ref = np.concatenate([flat_values(smp.obs), [smp.reward], rust_flat(smp.next_state)])
        back = np.concatenate([np.asarray(b_obs[i], np.float64), [float(b_reward[i])], j_state])
        unreadable = np.concatenate([np.zeros(25, bool), [n.endswith("sleep_time") for n in names]])
        fraction = np.where(unreadable, 0.0, np.abs(back - ref) / (ATOL + RTOL * np.abs(ref)))
        worst = int(np.nanargmax(fraction))
        labels = [f"obs[{k}]" for k in range(24)] + ["reward"] + names
        rows.append({"origin": smp.origin, "rust_identical": not differ.any(),
                     "obs_identical": bool(np.array_equal(np.asarray(b_obs[i], np.float32), np.asarray(r_obs[i], np.float32))),
                     "differing": [(names[k], r_state[i][k], j_state[k]) for k in np.flatnonzero(differ)],
                     "worst": (labels[worst], float(fraction[worst]), float(ref[worst]), float(back[worst]))})
    return rows


def print_step(row):
    name, fraction, ref, back = row["worst"]
    print(f"  {row['origin']}\n    next state bit for bit the Rust port's: {row['rust_identical']} "
          f"(observation: {row['obs_identical']}); largest |JAX - reference|: {name} {back:.9g} vs {ref:.9g}, "
          f"{fraction:.3g}x the float tolerance")
    for field, rust_value, jax_value in row["differing"][:8]:
        print(f"    differs from Rust: {field}: {rust_value:.9g} -> {jax_value:.9g}")
    if len(row["differing"]) > 8:
        print(f"    ... {len(row['differing'])} fields differ from Rust")


def trajectories(ctx, stepper, count: int):
    """L3's first `count` scripted trajectories (rollouts._synced's plans and seeds), each compared with the
    reference up to its predictable horizon."""
    s = ctx.settings
    horizon = min(ctx.max_episode_steps or s.rollout_steps, s.rollout_steps)
    plans = scripted_plans(ctx.action_space)[:count]
    trajs = []
    for i, (name, plan) in enumerate(plans):
        traj = rollouts._reference_trajectory(ctx, stepper, s.seed + 100 + i, lambda t, obs, plan=plan: plan(t), horizon,
                                              name, record_states=False)
        traj["predictable"] = rollouts._nudged_horizon(ctx, stepper, traj)
        trajs.append(traj)
    longest = max(len(t["actions"]) for t in trajs)
    actions = np.stack([np.stack([np.asarray(a) for a in t["actions"]] + [np.asarray(t["actions"][-1])] * (longest - len(t["actions"])))
                        for t in trajs])
    start = jax.tree_util.tree_map(lambda *v: np.stack(v), *[t["start"] for t in trajs])
    obs, reward, _ = ctx.backend.rollout(np.arange(len(trajs)), start, actions)
    for index, traj in enumerate(trajs):
        exact, first, worst = 0, None, (0.0, None, None)
        for t in range(traj["predictable"]):
            ref = np.concatenate([traj["obs"][t], [traj["reward"][t]]])
            back = np.concatenate([obs[index][t], [reward[index][t]]])
            fraction = np.abs(back - ref) / (ATOL + RTOL * np.abs(ref))
            exact += bool(np.array_equal(back[:-1], ref[:-1]))
            k = int(np.argmax(fraction))
            if fraction[k] > worst[0]:
                worst = (float(fraction[k]), t, traj["names"][k])
            if first is None and fraction[k] > 1:
                first = (t, traj["names"][k], float(fraction[k]))
        print(f"  {traj['name']}, reset seed {traj['seed']}: predictable horizon {traj['predictable']} of "
              f"{len(traj['actions'])} steps; observation bit for bit at {exact}; largest {worst[0]:.3g}x the tolerance"
              f" (step {worst[1]}, {worst[2]}); " + (f"FIRST OVER at step {first[0]} ({first[1]}, {first[2]:.3g}x)"
                                                     if first else "never over"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jax-file", default=str(ROOT / "envs_fast" / "translations" / "bipedalwalker_v3.py"))
    parser.add_argument("--no-rollout-states", action="store_true", help="only the two failing L2 states")
    parser.add_argument("--no-trajectories", action="store_true")
    parser.add_argument("--trajectories", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore", UserWarning)
    started = time.perf_counter()
    ctx = Context.open(ENV_ID, args.jax_file, Settings())
    rust = load_rust(str(ROOT / "envs_fast" / "translations" / "bipedalwalker_v3.rs"), ENV_ID)
    stepper = QuickStepper(ENV_ID, ctx.backend)
    print(f"JAX port {args.jax_file}, jax {jax.__version__} on {jax.devices()[0].platform}")
    rollout = rollout_samples(ctx, stepper)
    failing = [smp for smp in rollout if smp.origin == FAILING_ROLLOUT_STATE] + [boundary_sample(stepper, rollout)]
    print(f"{len(rollout)} L2 rollout states gathered in {time.perf_counter() - started:.0f} s")
    print("the two L2 states verify failed on:")
    for row in compare_steps(ctx, rust, failing):
        print_step(row)
    if not args.no_rollout_states:
        rows = compare_steps(ctx, rust, rollout)
        identical = sum(r["rust_identical"] for r in rows)
        over = [r for r in rows if r["worst"][1] > 1]
        worst = max(rows, key=lambda r: r["worst"][1])
        print(f"all {len(rows)} L2 rollout states: next state bit for bit the Rust port's at {identical}; "
              f"{len(over)} over the float tolerance without its sensitivity term; largest {worst['worst'][1]:.3g}x "
              f"({worst['worst'][0]}, {worst['origin']})")
        for row in [r for r in rows if not r["rust_identical"]][:5]:
            print_step(row)
    if not args.no_trajectories:
        print("L3 scripted trajectories (the reference's own; the JAX port's rollout from the synced start):")
        trajectories(ctx, stepper, args.trajectories)
    stepper.close()
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
