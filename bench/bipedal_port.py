"""Raw steps/s of the Rust BipedalWalker-v3 port side by side with one gymnasium env and envpool,
measured in interleaved rounds (envs_fast.bench.throughput.measure) so every figure sees the same load.

    .venv/bin/python -m bench.bipedal_port [--seconds 8] [--envs 1,16,64] [--envpool-envs 16]

Rows: `port@N` (autorl_step over N envs, random actions drawn beforehand, finished envs reset
through the resets array, no time limit), `gymnasium` (one reference env, env.step with random
actions, reset on episode end), `envpool@N` (its BipedalWalker-v3, Box2D 2.4.1, synchronous
vector env, if installed). Prints one line per row and a JSON line with all figures and ratios.

    .venv/bin/python -m bench.bipedal_port --baseline OLD/bipedalwalker_v3.rs [--baseline-flags "-O ..."]

adds rows `base@N` (same batch sizes) for another copy of the port (its folder needs the sync
companion), built with `--baseline-flags` instead of rust_build's flags: before and after in one
interleaved run.

    .venv/bin/python -m bench.bipedal_port --match 2000 [--seed 0]

Step-match instead of speed: along real gymnasium rollouts (random actions, then gymnasium's
heuristic walker; episodes reset as they end) the port steps once from each state synced off the
reference (state_from_reference) with the same action; prints how many steps agree bit for bit and
the largest observation and reward deviations, per policy.
"""
import argparse
import json
import warnings
from pathlib import Path


from envs_fast.bench.throughput import Runner, measure, reference_runner, rust_runner  # noqa: E402

ENV_ID = "BipedalWalker-v3"
SOURCE = Path(__file__).resolve().parent.parent / "envs_fast" / "translations" / "bipedalwalker_v3.rs"


def envpool_runner(num_envs: int, seed: int = 0, chunk: int = 16) -> Runner | None:
    try:
        import envpool
    except ImportError:
        return None
    import numpy as np

    env = envpool.make_gymnasium(ENV_ID, num_envs=num_envs, seed=seed)
    env.reset()
    rng = np.random.default_rng(seed)
    actions = [rng.uniform(-1, 1, (num_envs, 4)).astype(np.float32) for _ in range(8)]

    def run_once():
        for k in range(chunk):
            env.step(actions[k % 8])
        return chunk * num_envs

    run_once()
    return Runner(run_once, env.close)


def baseline_runners(source: str, flags: str | None, sizes: list[int]) -> dict[str, Runner]:
    """Rows base@N for another copy of the port, compiled with `flags` (rust_build keys its cache by
    the flags, so the library differs from one built with the current flags)."""
    import shlex

    from envs_fast.rust import build as rust_build

    current = rust_build.RUSTC_FLAGS
    if flags:
        rust_build.RUSTC_FLAGS = tuple(shlex.split(flags))
    try:
        return {f"base@{n}": rust_runner(source, ENV_ID, n, chunk=4 if n > 16 else 16) for n in sizes}
    finally:
        rust_build.RUSTC_FLAGS = current


def step_match(steps: int, seed: int) -> dict:
    import gymnasium as gym
    import numpy as np
    from gymnasium.envs.box2d.bipedal_walker import BipedalWalkerHeuristics

    from envs_fast.translations import bipedalwalker_v3_sync as sync
    from envs_fast.rust.backend import load_rust

    port = load_rust(str(SOURCE), ENV_ID)
    results = {}
    for policy in ("random", "heuristic"):
        env = gym.make(ENV_ID)
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        heuristic = BipedalWalkerHeuristics()
        exact, worst_obs, worst_reward, flag_mismatches, episodes = 0, 0.0, 0.0, 0, 1
        for _ in range(steps):
            action = (rng.uniform(-1, 1, 4).astype(np.float32) if policy == "random"
                      else np.asarray(heuristic.step_heuristic(obs), dtype=np.float32))
            state = port._batched_state(np.array(sync.state_from_reference(env), dtype=np.float64)[None])
            out, _, reward, terminated = port.step(np.array([1]), state, np.asarray(action, np.float64)[None])
            obs, ref_reward, ref_terminated, truncated, _ = env.step(action)
            deviation = float(np.max(np.abs(np.asarray(out[0], np.float64) - obs)))
            reward_deviation = abs(float(reward[0]) - float(ref_reward))
            exact += deviation == 0 and reward_deviation == 0 and bool(terminated[0]) == ref_terminated
            worst_obs, worst_reward = max(worst_obs, deviation), max(worst_reward, reward_deviation)
            flag_mismatches += bool(terminated[0]) != ref_terminated
            if ref_terminated or truncated:
                obs, _ = env.reset()
                episodes += 1
        results[policy] = {"steps": steps, "episodes": episodes, "bit_exact": exact, "max_obs_deviation": worst_obs,
                           "max_reward_deviation": worst_reward, "terminated_mismatches": flag_mismatches}
        print(f"{policy:>10}: {exact}/{steps} steps bit-exact over {episodes} episodes, max |obs diff| "
              f"{worst_obs:.3g}, max |reward diff| {worst_reward:.3g}, terminated mismatches {flag_mismatches}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per row, over all rounds")
    parser.add_argument("--envs", default="1,16,64", help="port batch sizes")
    parser.add_argument("--envpool-envs", type=int, default=16)
    parser.add_argument("--match", type=int, default=0, metavar="STEPS",
                        help="measure step-match over STEPS synced steps per policy instead of speed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", metavar="SOURCE", help="also time this copy of the port, as rows base@N")
    parser.add_argument("--baseline-flags", metavar="FLAGS", help="rustc flags for --baseline (default: rust_build's)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.match:
        print(json.dumps(step_match(args.match, args.seed)))
        return 0
    runners = {f"port@{n}": rust_runner(str(SOURCE), ENV_ID, int(n), chunk=4 if int(n) > 16 else 16)
               for n in args.envs.split(",")}
    if args.baseline:
        runners.update(baseline_runners(args.baseline, args.baseline_flags, [int(n) for n in args.envs.split(",")]))
    runners["gymnasium"] = reference_runner(ENV_ID)
    pool = envpool_runner(args.envpool_envs)
    if pool is not None:
        runners[f"envpool@{args.envpool_envs}"] = pool
    sps = measure(runners, args.seconds)
    reference = sps["gymnasium"]
    for name, value in sps.items():
        print(f"{name:>12}: {value:10.0f} steps/s  ({value / reference:5.2f}x one gymnasium env)")
    result = {"sps": sps, "ratio_to_gymnasium": {k: v / reference for k, v in sps.items()}}
    if pool is not None:
        result["ratio_to_envpool"] = {k: v / sps[f"envpool@{args.envpool_envs}"] for k, v in sps.items()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
