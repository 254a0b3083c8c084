"""Throughput of every shipped JAX translation against its gymnasium reference, with the targets
of issue 4 (CartPole-v1 >= 300x one gymnasium env, every translation >= 30x).

    .venv/bin/python -m bench.translation_speed [--seconds 3] [--num-envs 65536] [--json FILE]
"""
import argparse
import json
import sys
from pathlib import Path


from envs_fast.bench import DEFAULT_NUM_ENVS, bench  # noqa: E402

SHIPPED = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1"]
TARGETS = {"CartPole-v1": 300.0}
DEFAULT_TARGET = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--num-envs", type=int, default=DEFAULT_NUM_ENVS)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows, ok = [], True
    print(f"{'env':<26}{'backend sps':>14}{'reference sps':>15}{'ref vec sps':>13}{'adapter sps':>13}{'ratio':>9}  target")
    for env_id in SHIPPED:
        result = bench(env_id, "jax", args.num_envs, args.seconds)
        target = TARGETS.get(env_id, DEFAULT_TARGET)
        met = result["ratio"] >= target
        ok &= met
        rows.append({**result, "target": target, "met": met})
        print(f"{env_id:<26}{result['backend_sps']:>14,.0f}{result['reference_sps']:>15,.0f}"
              f"{result['reference_vec_sps']:>13,.0f}{result['adapter_sps']:>13,.0f}{result['ratio']:>8,.0f}x"
              f"  >= {target:g}x {'met' if met else 'MISSED'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
