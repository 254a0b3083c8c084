"""Training throughput inside the sandbox against outside it.

    python -m bench.sandbox [--env CartPole-v1] [--budget 20] [--rounds 3] [--seed 1]

Trains the committed candidate/train.py (a `git archive HEAD` snapshot, as a run's worktree
would be) for BUDGET seconds, alternately through run_group unwalled and inside the bubblewrap
walls (read-only snapshot, writable output dir, no network, own PID namespace), same seed,
in ABBA order so drift of the machine cancels. Prints the steps/s train.py reports for each run,
the median of each side and their ratio (inside / outside), and the median of the per-round
ratios (each round runs both sides back to back), then one JSON line. On a busy machine use more
rounds: the spread between runs of the same side shows the noise floor; env steps per CPU
second (from the children's rusage, start-up included) are less sensitive to other load."""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from orchestrator.artifacts import parse_summary  # noqa: E402
from orchestrator.processes import run_group, scrubbed_env  # noqa: E402
from orchestrator.sandbox import Sandbox, Walls  # noqa: E402


# Runs train.py and appends the CPU seconds it used to its summary (rusage of a child reaped
# inside the sandbox does not reach the daemon: bwrap's PID-namespace init reaps it).
LAUNCH = """\
import resource, subprocess, sys
code = subprocess.call([sys.executable, *sys.argv[1:]])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"cpu_s: {usage.ru_utime + usage.ru_stime:.3f}", flush=True)
sys.exit(code)
"""


def snapshot(dest: Path) -> Path:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, check=True, capture_output=True).stdout
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def train(code: Path, out: Path, args, sandbox: Sandbox | None) -> dict:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = scrubbed_env({"AUTORL_ENV_ID": args.env, "AUTORL_TIME_BUDGET": str(args.budget),
                        "AUTORL_SEED": str(args.seed), "AUTORL_OUTPUT_DIR": str(out),
                        "PYTHONDONTWRITEBYTECODE": "1"})
    log = out.parent / f"{out.name}.log"
    walls = Walls(cwd=code, read_only=[code], writable=[out], hidden=[REPO]) if sandbox else None
    result = run_group([sys.executable, "-c", LAUNCH, "candidate/train.py"], code, env, log, args.budget + 120,
                       lambda: False, walls=walls, sandbox=sandbox)
    text = log.read_text()
    log.unlink()
    if result.returncode != 0:
        raise SystemExit(f"train.py failed ({'inside' if sandbox else 'outside'}, exit "
                         f"{result.returncode}):\n{text[-2000:]}")
    if sandbox is not None and not result.sandboxed:
        raise SystemExit("the sandbox was not applied")
    return parse_summary(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--budget", type=float, default=20.0, help="training seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs (inside + outside)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    sandbox = Sandbox("require")
    print(sandbox.describe())
    with tempfile.TemporaryDirectory(prefix="autorl-bench-sandbox-") as tmp:
        code = snapshot(Path(tmp) / "code")
        sps = {"outside": [], "inside": []}
        per_cpu = {"outside": [], "inside": []}  # env steps per CPU second (startup included)
        for i in range(args.rounds):
            order = ["outside", "inside"] if i % 2 == 0 else ["inside", "outside"]
            for side in order:
                summary = train(code, Path(tmp) / "out", args, sandbox if side == "inside" else None)
                sps[side].append(float(summary["sps"]))
                per_cpu[side].append(float(summary["env_steps"]) / summary["cpu_s"])
                print(f"round {i + 1} {side:8s} sps {summary['sps']:>8}  env_steps {summary['env_steps']:>8}  "
                      f"cpu {summary['cpu_s']:6.1f} s  steps/cpu-s {per_cpu[side][-1]:8.0f}", flush=True)
    outside, inside = statistics.median(sps["outside"]), statistics.median(sps["inside"])
    ratio = inside / outside
    paired = statistics.median(i / o for i, o in zip(sps["inside"], sps["outside"]))
    print(f"median sps outside {outside:.0f}, inside {inside:.0f}: inside/outside = {ratio:.3f} "
          f"({(ratio - 1) * 100:+.1f}%); median of the per-round ratios {paired:.3f}")
    cpu_ratio = statistics.median(per_cpu["inside"]) / statistics.median(per_cpu["outside"])
    print(f"median steps per CPU second: outside {statistics.median(per_cpu['outside']):.0f}, "
          f"inside {statistics.median(per_cpu['inside']):.0f}: inside/outside = {cpu_ratio:.3f} "
          "(less sensitive to other load on the machine)")
    print(json.dumps({"env_id": args.env, "budget": args.budget, "rounds": args.rounds, "seed": args.seed,
                      "sps_outside": sps["outside"], "sps_inside": sps["inside"],
                      "median_outside": outside, "median_inside": inside, "ratio": round(ratio, 4),
                      "paired_ratio": round(paired, 4),
                      "steps_per_cpu_s_outside": per_cpu["outside"], "steps_per_cpu_s_inside": per_cpu["inside"],
                      "cpu_ratio": round(cpu_ratio, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
