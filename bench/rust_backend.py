"""Throughput of the Rust backend kind against envpool and JAX, measured side by side (interleaved
rounds, so that all figures see the same machine load).

    .venv/bin/python -m bench.rust_backend [--env CartPole-v1] [--seconds 3] [--adapter-envs 32] [--raw-envs 65536]

Adapter rows: the gymnasium VectorEnv each backend trains through on the host path, stepped with
random actions drawn beforehand (so the figure is the env and its adapter, not the action sampler).
Raw rows: the backend with no adapter: `autorl_step` called directly (autoreset through the resets
array, no time limit), against the JAX translation's jitted lax.scan (envs_fast.bench.throughput.jax_runner,
autoreset and time limit included).
"""
import argparse
import sys
import warnings



from envs_fast.bench.throughput import Runner, jax_runner, measure, rust_runner  # noqa: E402
from envs_fast.protocol import translation_path  # noqa: E402
from envs_fast.rust.vector import make_rust_vec_env  # noqa: E402


def adapter_runner(venv, seed: int = 0, chunk: int = 64) -> Runner:
    venv.reset(seed=seed)
    venv.action_space.seed(seed)
    actions = [venv.action_space.sample() for _ in range(256)]
    position = 0

    def run_once():
        nonlocal position
        for _ in range(chunk):
            venv.step(actions[position])
            position = (position + 1) % len(actions)
        return chunk * venv.num_envs

    run_once()  # warm-up (the JAX adapter compiles here)
    return Runner(run_once, venv.close)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seconds", type=float, default=3.0, help="per figure")
    parser.add_argument("--adapter-envs", type=int, default=32)
    parser.add_argument("--raw-envs", type=int, default=65536)
    args = parser.parse_args()
    env_id, rust_path = args.env, translation_path(args.env, lang="rust")
    from envs_fast import make_vec_env
    from envs_fast.backends.envpool_backend import EnvpoolVectorEnv

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runners = {
            f"rust adapter ({args.adapter_envs} envs)": adapter_runner(make_rust_vec_env(rust_path, env_id, args.adapter_envs, 0)),
            f"envpool adapter ({args.adapter_envs} envs)": adapter_runner(EnvpoolVectorEnv(env_id, args.adapter_envs, 0)),
            f"jax adapter ({args.adapter_envs} envs)": adapter_runner(make_vec_env("jax", env_id, args.adapter_envs, 0)),
            f"rust autorl_step ({args.raw_envs} envs)": rust_runner(str(rust_path), env_id, args.raw_envs),
            f"jax lax.scan ({args.raw_envs} envs)": jax_runner("jax", env_id, args.raw_envs),
        }
        sps = measure(runners, args.seconds)
    names = list(sps)
    envpool = sps[names[1]]
    jax_scan = sps[names[4]]
    print(f"{env_id}: steps/s, {args.seconds:g} s per figure, interleaved")
    print(f"{'':<34}{'steps/s':>14}{'vs envpool':>12}{'vs jax':>9}")
    for name in names[:3]:
        print(f"{name:<34}{sps[name]:>14,.0f}{sps[name] / envpool:>11.2f}x{sps[name] / sps[names[2]]:>8.2f}x")
    for name in names[3:]:
        print(f"{name:<34}{sps[name]:>14,.0f}{'':>12}{sps[name] / jax_scan:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
