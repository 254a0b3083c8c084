"""Train the baseline candidate/train.py and score it with the fixed harness.

    python -m bench.baseline ENV_ID BUDGET [--seed S] [--episodes N] [--eval-seed S]

Prints the training figures (env steps, SPS) and the evaluation figures (mean, se, IQM, min,
max over N episodes), then one JSON line with all of them."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def train_summary(stdout: str) -> dict:
    if "\n---\n" not in stdout:
        return {}
    tail = stdout.rsplit("\n---\n", 1)[1]
    return dict(line.split(": ", 1) for line in tail.strip().splitlines() if ": " in line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env_id")
    parser.add_argument("budget", type=float, help="training seconds")
    parser.add_argument("--seed", type=int, default=1, help="AUTORL_SEED for training")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--out", help="keep the artifact and logs here (default: a temp dir)")
    args = parser.parse_args()

    out = Path(args.out or tempfile.mkdtemp(prefix="autorl-baseline-"))
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, AUTORL_ENV_ID=args.env_id, AUTORL_TIME_BUDGET=str(args.budget),
               AUTORL_SEED=str(args.seed), AUTORL_OUTPUT_DIR=str(out))
    started = time.time()
    with open(out / "train.log", "w") as log:
        train = subprocess.run([sys.executable, "candidate/train.py"], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=log, text=True)
    (out / "train.log").open("a").write(train.stdout)
    train_wall = time.time() - started
    if train.returncode != 0:
        print(f"training failed (exit {train.returncode}); see {out / 'train.log'}", file=sys.stderr)
        return 1
    stats = train_summary(train.stdout)
    evaluation = subprocess.run(
        [sys.executable, "evaluate.py", "--policy", str(out / "policy.pt"), "--env", args.env_id,
         "--episodes", str(args.episodes), "--seed", str(args.eval_seed), "--out", str(out / "eval.json")],
        cwd=REPO, capture_output=True, text=True)
    if evaluation.returncode != 0:
        print(evaluation.stderr.strip(), file=sys.stderr)
        return 1
    result = json.loads(evaluation.stdout.strip().splitlines()[-1])
    print(f"env               {args.env_id}")
    print(f"budget            {args.budget:g} s (train wall {train_wall:.0f} s incl. startup)")
    print(f"env steps         {stats.get('env_steps')}  ({stats.get('sps')} steps/s)")
    print(f"train return      {stats.get('episode_return')} (last 20 training episodes)")
    print(f"eval mean         {result['mean']:.2f} ± {result['se']:.2f} (se), {args.episodes} episodes")
    print(f"eval iqm/min/max  {result['iqm']:.2f} / {result['min']:.2f} / {result['max']:.2f}")
    print(f"artifact          {out / 'policy.pt'}")
    print(json.dumps({"env_id": args.env_id, "budget": args.budget, "seed": args.seed,
                      "env_steps": int(stats.get("env_steps", 0)), "sps": float(stats.get("sps", 0)),
                      "mean": result["mean"], "se": result["se"], "iqm": result["iqm"],
                      "min": result["min"], "max": result["max"], "episodes": args.episodes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
