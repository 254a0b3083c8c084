"""The JAX BipedalWalker-v3 port (envs_fast/translations/bipedalwalker_v3.py) beside the Rust one: raw steps/s in
interleaved rounds (envs_fast.bench.throughput.measure, every figure under the same load), its compile time,
and how far one of its steps from a synced reference state deviates, per field.

    .venv/bin/python -m bench.bipedal_jax [--seconds 8] [--envs 16,64] [--jax-envs 16,256] [--scan-steps 8]

Rows: `port@N` (the Rust port's autorl_step over N envs), `port-jax@N` (a jitted lax.scan of
--scan-steps random-action steps over N envs, auto-reset and time limit included: envs_fast.bench.throughput's
jax_runner, what bench's backend_sps times), `gymnasium` (one reference env). Compile time: building a
port-jax runner (jit of the batched reset and of the scan, and their first call) is timed apart.

    .venv/bin/python -m bench.bipedal_jax --deviation 400 [--seed 0]

Deviation instead of speed: states from reference episodes under random actions and under each
declared verification policy (VERIFY_POLICIES), written into the reference and read back; the port
steps them (one jitted vmapped batch) and the reference steps them with the same action; prints the
largest |port - reference| per observation component, the reward, and per state group, each also as a
fraction of the verifier's float tolerance without its sensitivity term (1e-5 + 1e-4 |reference|).
"""
import argparse
import json
import time
import warnings
from pathlib import Path


from envs_fast.bench.throughput import jax_runner, measure, reference_runner, rust_runner  # noqa: E402

ENV_ID = "BipedalWalker-v3"
ROOT = Path(__file__).resolve().parent.parent
JAX_SOURCE = ROOT / "envs_fast" / "translations" / "bipedalwalker_v3.py"
RUST_SOURCE = ROOT / "envs_fast" / "translations" / "bipedalwalker_v3.rs"
ATOL, RTOL = 1e-5, 1e-4


def timed_jax_runner(num_envs: int, scan_steps: int):
    """The runner and (wall, this process's CPU) seconds to build it: on a shared machine the wall time
    waits for cores, the CPU time does not."""
    started, cpu = time.perf_counter(), time.process_time()
    runner = jax_runner(str(JAX_SOURCE), ENV_ID, num_envs, scan_steps=scan_steps)
    return runner, (round(time.perf_counter() - started, 1), round(time.process_time() - cpu, 1))


def _samples(count: int, seed: int):
    """(state, action, origin) from reference episodes: random actions, then each declared policy."""
    import gymnasium as gym
    import numpy as np

    from envs_fast.translations import bipedalwalker_v3 as port

    rng = np.random.default_rng(seed)
    samples = []
    sources = [("random actions", lambda s: (lambda obs: rng.uniform(-1, 1, 4).astype(np.float32)), 200)]
    sources += [(name, spec["make"], spec.get("l2_steps") or 300) for name, spec in port.VERIFY_POLICIES.items()]
    per_source = count // len(sources)
    for name, make, steps in sources:
        episode = 0
        taken = 0
        while taken < per_source:
            env = gym.make(ENV_ID)
            obs, _ = env.reset(seed=seed + episode)
            act = make(seed + episode)
            for _ in range(steps):
                action = np.asarray(act(obs), np.float32)
                samples.append((port.state_from_reference(env), action, name))
                taken += 1
                obs, _, terminated, _, _ = env.unwrapped.step(action)
                if taken >= per_source or (terminated and name != "standing still until asleep"):
                    break
            episode += 1
    return samples


def deviation(count: int, seed: int, batch: int = 64) -> dict:
    import gymnasium as gym
    import jax
    import numpy as np

    from envs_fast.translations import bipedalwalker_v3 as port

    step = jax.jit(jax.vmap(port.step))
    reference = gym.make(ENV_ID)
    reference.reset(seed=seed)
    rows = []  # per sample: obs(24), reward, state groups
    groups = {"body position (cx, cy)": (slice(0, 2),), "body angle": (slice(2, 3),),
              "body velocity (vx, vy, w)": (slice(3, 6),)}
    worst: dict = {}
    samples = _samples(count, seed)
    started = time.perf_counter()
    for start in range(0, len(samples), batch):
        part = samples[start:start + batch]
        states, actions, expected = [], [], []
        for state, action, origin in part:
            port.state_to_reference(state, reference)
            states.append(port.state_from_reference(reference))
            actions.append(action)
            obs, reward, terminated, _, _ = reference.unwrapped.step(action)
            expected.append((obs, reward, terminated, port.state_from_reference(reference), origin))
        pad = batch - len(part)
        stack = lambda xs: jax.tree_util.tree_map(lambda *v: np.stack(v), *(xs + [xs[-1]] * pad))  # noqa: E731
        obs, next_state, reward, terminated = step(jax.random.split(jax.random.PRNGKey(0), batch), stack(states),
                                                  np.stack(actions + [actions[-1]] * pad))
        for i, (ref_obs, ref_reward, ref_terminated, ref_state, origin) in enumerate(expected):
            fields = {f"obs[{k}]": (float(obs[i][k]), float(ref_obs[k])) for k in range(24)}
            fields["reward"] = (float(reward[i]), float(ref_reward))
            bodies, ref_bodies = np.asarray(next_state.bodies[i], np.float64), np.asarray(ref_state.bodies, np.float64)
            for name, (cols,) in groups.items():
                diff = np.abs(bodies[:, cols] - ref_bodies[:, cols])
                j = np.unravel_index(np.argmax(diff - RTOL * np.abs(ref_bodies[:, cols])), diff.shape)
                fields[name] = (float(bodies[:, cols][j]), float(ref_bodies[:, cols][j]))
            joints, ref_joints = np.asarray(next_state.joints[i], np.float64), np.asarray(ref_state.joints, np.float64)
            j = np.unravel_index(np.argmax(np.abs(joints - ref_joints)), joints.shape)
            fields["joint impulses"] = (float(joints[j]), float(ref_joints[j]))
            fields["terminated"] = (float(bool(terminated[i])), float(ref_terminated))
            for name, (back, ref) in fields.items():
                diff = abs(back - ref)
                fraction = diff / (ATOL + RTOL * abs(ref))
                if name not in worst or fraction > worst[name]["fraction_of_tolerance"]:
                    worst[name] = {"abs": diff, "reference": ref, "fraction_of_tolerance": fraction, "origin": origin}
        rows.append(len(part))
    seconds = time.perf_counter() - started
    return {"samples": len(samples), "seconds": round(seconds, 1), "worst": worst}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per row, over all rounds")
    parser.add_argument("--envs", default="16,64", help="Rust port batch sizes")
    parser.add_argument("--jax-envs", default="16,256", help="JAX port batch sizes")
    parser.add_argument("--scan-steps", type=int, default=8, help="steps per jitted call of a port-jax row")
    parser.add_argument("--deviation", type=int, default=0, metavar="STATES",
                        help="measure one-step deviations from STATES synced states instead of speed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.deviation:
        result = deviation(args.deviation, args.seed)
        for name, item in result["worst"].items():
            print(f"{name:>26}: max |diff| {item['abs']:.3g} ({item['fraction_of_tolerance']:.3f} of 1e-5 + 1e-4 |ref|,"
                  f" ref {item['reference']:.4g}, {item['origin']})")
        print(json.dumps(result))
        return 0
    runners, compile_seconds = {}, {}
    for n in (int(v) for v in args.jax_envs.split(",")):
        runners[f"port-jax@{n}"], compile_seconds[f"port-jax@{n}"] = timed_jax_runner(n, args.scan_steps)
        wall, cpu = compile_seconds[f"port-jax@{n}"]
        print(f"port-jax@{n}: compiled (batched reset, scan of {args.scan_steps} steps, first call) in "
              f"{wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    for n in (int(v) for v in args.envs.split(",")):
        runners[f"port@{n}"] = rust_runner(str(RUST_SOURCE), ENV_ID, n, chunk=4 if n > 16 else 16)
    runners["gymnasium"] = reference_runner(ENV_ID)
    sps = measure(runners, args.seconds)
    reference = sps["gymnasium"]
    for name, value in sps.items():
        print(f"{name:>14}: {value:10.0f} steps/s  ({value / reference:6.2f}x one gymnasium env)")
    print(json.dumps({"sps": sps, "ratio_to_gymnasium": {k: v / reference for k, v in sps.items()},
                      "jax_compile_seconds_wall_cpu": compile_seconds, "scan_steps": args.scan_steps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
