"""Where a long L4 check stands: each training run kept in its --l4-dir, finished or checkpointed.

    .venv/bin/python -m bench.l4_progress DIR [--out FILE]

`python -m envs_fast.verify ... --levels 4 --l4-dir DIR` trains for hours (the JAX BipedalWalker port's
runs: ~3 h each on 2 CPU cores) and resumes where it stopped. This prints, per run folder, its side and
seed, then either its finished figures (env steps, the harness's score) or its last checkpoint's env
steps and updates and the last progress line of its log, so a measurement spread over several sittings
can be committed as it goes (--out).
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import train_plumbing  # noqa: E402  (the checkpoint format train.py writes)


def run_line(folder: Path) -> str:
    identity, run = {}, None
    for source in ("run.json", "identity.json"):  # a finished run's record holds its identity too
        try:
            record = json.loads((folder / source).read_text())
        except (OSError, ValueError):
            continue
        identity, run = (record.get("identity", {}), record.get("run")) if source == "run.json" else (record, None)
        break
    backend = ":".join(part[:12] for part in str(identity.get("backend", "?")).split(":")[:2])
    name = f"{folder.name} (trains on {backend}, {identity.get('env_steps', 0):,} env steps)"
    if run:
        score = run.get("score", {})
        return (f"{name}: FINISHED {run['env_steps']:,} env steps in {run['seconds']:.0f} s on path {run['path']!r}; "
                f"score {score.get('mean', float('nan')):.1f} (sd {score.get('std', float('nan')):.1f}) on the reference env")
    line = f"{name}: training"
    checkpoint = train_plumbing.Checkpoint(folder / "checkpoint")  # what train.py's jax-host path saves
    restored = checkpoint.restore()
    if restored:
        env_steps, updates, episode_log = restored[1]
        saved = datetime.fromtimestamp(checkpoint.path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        line += (f"; checkpoint of {saved}: {env_steps:,} env steps, {updates} updates, "
                 f"return of its last 20 episodes {train_plumbing.recent_mean(episode_log):.1f}")
    else:
        line += "; no checkpoint yet"
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("l4_dir", type=Path)
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    folders = sorted(p for p in args.l4_dir.glob("*-seed*") if p.is_dir())
    if not folders:
        print(f"{args.l4_dir}: no training run folders (side-seedN) in it", file=sys.stderr)
        return 1
    lines = [f"# L4 runs in {args.l4_dir}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"] + [run_line(f) for f in folders]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
