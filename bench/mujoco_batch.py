"""Raw steps/s of the mujoco_batch backend (envs_fast/mujoco/batch.py) side by side with gymnasium's
own vector env and envpool's MuJoCo, measured in interleaved rounds (envs_fast.bench.throughput.measure) so
every figure sees the same machine load.

    .venv/bin/python -m bench.mujoco_batch [--envs HalfCheetah-v5,Hopper-v5] [--num-envs 16] [--seconds 8]

Rows per env, all at --num-envs envs, each stepping random actions drawn beforehand (the figure times
the envs, not an action sampler), NEXT_STEP autoreset and the registered time limit included:
`mujoco_batch` (its VectorEnv; mujoco.batch on every CPU), `mujoco_batch, 1 thread`, `gymnasium`
(gym.make_vec, SyncVectorEnv) and `envpool` (envpool.make_gymnasium, its own MuJoCo build).

    .venv/bin/python -m bench.mujoco_batch --post-constraint [--envs Ant-v5,Humanoid-v5]

What exact cfrc_ext costs: mj_step does not compute it, so each stepped Ant/Humanoid simulation is
copied out of the batch (Batch.get_data) and mj_rnePostConstraint runs on the copy; prints that part's
microseconds per env step beside the whole step's.

    .venv/bin/python -m bench.mujoco_batch --match 1100 --num-envs 4

Whole trajectories against gymnasium's SyncVectorEnv (same seed, same random actions, autoresets and the
time limit included): how many vector steps are bit for bit equal.
"""
import argparse
import json
import sys
import time
import warnings


import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from envs_fast.mujoco.batch import MujocoBatchBackend, MujocoBatchVectorEnv  # noqa: E402
from envs_fast.bench.throughput import Runner, measure  # noqa: E402


def vector_env_runner(venv, seed: int = 0, chunk: int = 16) -> Runner:
    """A VectorEnv stepped with 8 action batches drawn beforehand, in turn."""
    venv.reset(seed=seed)
    venv.action_space.seed(seed)
    actions = [venv.action_space.sample() for _ in range(8)]

    def run_once():
        for k in range(chunk):
            venv.step(actions[k % 8])
        return chunk * venv.num_envs

    run_once()  # warm-up
    return Runner(run_once, venv.close)


def envpool_env(env_id: str, num_envs: int, seed: int):
    """envpool's own MuJoCo build through envs_fast's adapter (the gymnasium spaces), or None."""
    from envs_fast.backends.envpool_backend import EnvpoolVectorEnv, envpool_supports

    return EnvpoolVectorEnv(env_id, num_envs, seed) if envpool_supports(env_id) else None


def throughput(env_ids: list[str], num_envs: int, seconds: float, seed: int) -> dict:
    figures = {}
    for env_id in env_ids:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runners = {
                "mujoco_batch": vector_env_runner(MujocoBatchVectorEnv(MujocoBatchBackend(env_id), num_envs, seed), seed),
                "mujoco_batch, 1 thread": vector_env_runner(
                    MujocoBatchVectorEnv(MujocoBatchBackend(env_id, nthread=1), num_envs, seed), seed),
                "gymnasium": vector_env_runner(gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync"), seed),
            }
            pool = envpool_env(env_id, num_envs, seed)
            if pool is not None:
                runners["envpool"] = vector_env_runner(pool, seed)
            sps = measure(runners, seconds)
        figures[env_id] = sps
        base = sps["gymnasium"]
        for name, value in sps.items():
            print(f"{env_id:15s} {name:24s} @{num_envs}: {value:>10,.0f} steps/s  ({value / base:.2f}x gymnasium"
                  + (f", {value / sps['envpool']:.2f}x envpool)" if "envpool" in sps else ")"), flush=True)
    return figures


def post_constraint_cost(env_ids: list[str], num_envs: int, steps: int, seed: int) -> dict:
    """Microseconds per env step of the whole step and of its get_data + mj_rnePostConstraint part."""
    figures = {}
    for env_id in env_ids:
        sim = MujocoBatchBackend(env_id).simulator(num_envs)
        ids = np.arange(num_envs)
        sim.reset(ids, [np.random.default_rng(seed + i) for i in range(num_envs)])
        space = gym.make(env_id).action_space
        space.seed(seed)
        whole = part = 0.0
        for _ in range(steps):
            actions = np.stack([space.sample() for _ in range(num_envs)])
            started = time.perf_counter()
            sim.step(ids, actions)
            whole += time.perf_counter() - started
            started = time.perf_counter()
            sim._post_constraint(ids)  # the same work again, timed alone
            part += time.perf_counter() - started
        scale = 1e6 / (steps * num_envs)
        figures[env_id] = {"step_us": whole * scale, "post_constraint_us": part * scale}
        print(f"{env_id:15s} @{num_envs}: step {whole * scale:,.1f} us/env, of which get_data + mj_rnePostConstraint "
              f"{part * scale:,.1f} us/env ({part / whole:.0%})", flush=True)
    return figures


def trajectory_match(env_ids: list[str], num_envs: int, steps: int, seed: int) -> dict:
    """Whole trajectories, not only up to the verifier's predictable horizon: the VectorEnv and gymnasium's
    SyncVectorEnv from reset(seed) under the same random actions for `steps` steps, autoresets and time
    limits included; counts the steps whose observations, rewards and flags are all bit for bit equal."""
    from envs_fast.mujoco.batch import make_mujoco_batch_vec_env

    figures = {}
    for env_id in env_ids:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mine = make_mujoco_batch_vec_env(env_id, num_envs, seed)
            theirs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
            same = int(np.array_equal(mine.reset(seed=seed)[0], theirs.reset(seed=seed)[0]))
            theirs.action_space.seed(seed)
            episodes = 0
            for _ in range(steps):
                action = theirs.action_space.sample()
                a, b = mine.step(action), theirs.step(action)
                same += all(np.array_equal(x, y) for x, y in zip(a[:4], b[:4]))
                episodes += int(np.sum(b[2] | b[3]))
        figures[env_id] = {"steps": steps + 1, "bit_for_bit": same, "episodes_ended": episodes}
        print(f"{env_id:15s} {num_envs} envs: {same} of {steps + 1} vector steps (reset included) bit for bit, "
              f"{episodes} episodes ended", flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default=None, help="comma-separated env ids")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per figure (4 interleaved rounds)")
    parser.add_argument("--post-constraint", action="store_true", help="time the cfrc_ext part of a step instead")
    parser.add_argument("--steps", type=int, default=200, help="--post-constraint: steps timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--match", type=int, metavar="STEPS", help="compare whole trajectories with gymnasium instead")
    args = parser.parse_args()
    if args.match:
        envs = (args.envs or "HalfCheetah-v5,Hopper-v5,Walker2d-v5,Ant-v5,Humanoid-v5").split(",")
        result = {"trajectory_match": trajectory_match(envs, args.num_envs, args.match, args.seed)}
    elif args.post_constraint:
        envs = (args.envs or "Ant-v5,Humanoid-v5").split(",")
        result = {"post_constraint": post_constraint_cost(envs, args.num_envs, args.steps, args.seed)}
    else:
        envs = (args.envs or "HalfCheetah-v5,Hopper-v5").split(",")
        result = {"steps_per_second": throughput(envs, args.num_envs, args.seconds, args.seed)}
    print(json.dumps({"num_envs": args.num_envs, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
