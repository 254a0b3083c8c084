"""How far one mjx step (envs_fast/mujoco/mjx.py) is from gymnasium's, from the same synced state, along
random-action episodes (actions doubled, so half fall outside the ctrl range, and none every third step),
reset on termination and, with --reset-every N, every N steps (a reset state's warm start is zero, where
the constraint solve runs longest), split by whether the reference step had contacts. Run once in float32
and once with --x64 to tell rounding (gone in float64) from algorithm (stays); --solver mjx steps MJX's own
constraint solver instead of the backend's C-rule solve (envs_fast.mujoco.c_solver.c_solve), to measure what
that changes:

    .venv/bin/python -m bench.mjx_deviation --env Hopper-v5 [--steps 300] [--x64] [--solver c|mjx] [--reset-every 7]

Per field, the largest |mjx - reference| and the largest ratio to the verifier's base tolerance
1e-5 + 1e-4 x |reference| (L2 adds a sensitivity term on top of it).
"""
from __future__ import annotations

import argparse
import time
import warnings



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--x64", action="store_true", help="run MJX in float64 (jax_enable_x64)")
    parser.add_argument("--solver", choices=("c", "mjx"), default="c",
                        help="c: the backend's solve with C MuJoCo's stopping rules; mjx: MJX's own solver")
    parser.add_argument("--reset-every", type=int, default=0, help="also reset every N steps (0: only on termination)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import jax

    if args.x64:
        jax.config.update("jax_enable_x64", True)
    import gymnasium as gym
    import numpy as np

    from envs_fast.mujoco.mjx import MjxEnv

    env = MjxEnv(args.env, solver=args.solver)
    step = jax.jit(env.step)
    reference = gym.make(args.env)
    reference.reset(seed=args.seed)
    reference.action_space.seed(args.seed)
    worst: dict[str, dict[str, float]] = {"no contact": {}, "contact": {}}
    counts = {"no contact": 0, "contact": 0}
    terminations_differ = 0
    started = time.perf_counter()
    for t in range(args.steps):
        state = env.state_from_reference(reference)
        action = reference.action_space.sample() * (2 if t % 3 else 0)  # every third: no action
        obs, reward, terminated, _, _ = reference.unwrapped.step(action)
        kind = "contact" if reference.unwrapped.data.ncon else "no contact"
        counts[kind] += 1
        b_obs, b_state, b_reward, b_terminated = step(jax.random.PRNGKey(0), state, action)
        after = env.state_from_reference(reference)
        terminations_differ += bool(b_terminated) != terminated
        for name, mine, theirs in (("obs", b_obs, obs), ("reward", b_reward, reward), ("qpos", b_state.qpos, after.qpos),
                                   ("qvel", b_state.qvel, after.qvel),
                                   ("warmstart", b_state.qacc_warmstart, after.qacc_warmstart)):
            mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
            gap = np.abs(mine - theirs)
            for key, value in ((f"{name} abs", gap.max()), (f"{name} /tol", (gap / (1e-5 + 1e-4 * np.abs(theirs))).max())):
                worst[kind][key] = max(worst[kind].get(key, 0.0), float(value))
        if terminated or (args.reset_every and t % args.reset_every == 0):
            reference.reset(seed=args.seed * 1000 + t)
    precision = "float64 (x64)" if args.x64 else "float32"
    print(f"{args.env} mjx ({args.solver} solver) {precision}: {args.steps} synced steps in {time.perf_counter() - started:.0f} s "
          f"(compile included), terminations differing: {terminations_differ}")
    for kind, fields in worst.items():
        if counts[kind]:
            print(f"  {kind:10s} ({counts[kind]:3d} steps): " + ", ".join(f"{k} {v:.3g}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
