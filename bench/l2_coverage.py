"""L2 on every shipped port with state sync: the states it compares and the seconds it takes.

    PYTHONPATH=. .venv/bin/python -m bench.l2_coverage --out bench/results/l2-coverage-DATE.jsonl [--only ENV,...]

One line per port (its env, spec, seconds, and per L2 check the states compared), printed and appended
to --out with the commit of envs_fast it ran on. Run it at two commits (PYTHONPATH at the other's
checkout) to see what a change to L2 does to its coverage and time; since L2's boundary search is
bounded by counts, the states are the same on any machine and only the seconds vary with its load.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from pathlib import Path

from envs_fast.verify import verify

PORTS = (("CartPole-v1", "jax"), ("Acrobot-v1", "jax"), ("MountainCar-v0", "jax"), ("MountainCarContinuous-v0", "jax"),
         ("Pendulum-v1", "jax"), ("CartPole-v1", "rust"), ("Acrobot-v1", "rust"), ("BipedalWalker-v3", "rust"),
         ("Hopper-v5", "mujoco_batch"), ("Walker2d-v5", "mujoco_batch"))


def commit_of(package: Path) -> str:
    """The commit `package` (envs_fast) is at, with "+edited" when its files differ from it."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=package, capture_output=True, text=True)
    edited = subprocess.run(["git", "status", "--porcelain", "."], cwd=package, capture_output=True, text=True)
    return (proc.stdout.strip() or "unknown") + ("+edited" if edited.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated env ids (default: every port)")
    args = parser.parse_args(argv)
    import envs_fast

    package = Path(envs_fast.__file__).resolve().parent
    only = set(filter(None, args.only.split(",")))
    for env_id, spec in PORTS:
        if only and env_id not in only:
            continue
        began = time.perf_counter()
        report = verify(env_id, spec, (2,), use_cache=False)
        level = report.levels[-1]
        states = {check.name: int(m.group(1)) for check in level.checks
                  if (m := re.search(r" of (\d+)", check.detail)) and check.name.startswith("step from")}
        row = {"env_id": env_id, "spec": spec, "commit": commit_of(package), "status": level.status,
               "seconds": round(time.perf_counter() - began, 1), "states": states, "load": Path("/proc/loadavg").read_text().split()[0]}
        print(json.dumps(row), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
