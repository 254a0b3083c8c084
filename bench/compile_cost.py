"""What compiling cost each scored run of a night, baselines and candidates' first runs side by side.

    python -m bench.compile_cost results/<tag> [results/<tag2> ...]

Reads the `compiled the update in X s` line train.py's jax-e2e path prints into each run's train.log
(exp-0000/train.log, exp-0000/run-N/, exp-NNNN/ and their confirm*/ folders). Every run compiles
cold in an empty cache of its own (orchestrator/runners/local.JaxCaches), so a baseline and a
candidate's first run pay alike out of the same budget; this prints the figures that show it.
"""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

COMPILED = re.compile(r"compiled the update in ([0-9.]+)s")


def compile_seconds(train_log: Path) -> float | None:
    try:
        found = COMPILED.search(train_log.read_text(errors="replace"))
    except OSError:
        return None
    return float(found.group(1)) if found else None


def runs(run_dir: Path) -> dict[str, list[tuple[str, float]]]:
    """{"baseline": [(label, seconds)], "first run": [...], "confirmation": [...]} of one run folder."""
    found: dict[str, list[tuple[str, float]]] = {"baseline": [], "first run": [], "confirmation": []}
    for exp in sorted(run_dir.glob("exp-*")):
        if exp.name == "exp-0000":
            logs = [("baseline", exp / "train.log")] + [("baseline", p / "train.log") for p in sorted(exp.glob("run-*"))]
        else:
            logs = [("first run", exp / "train.log")] + [("confirmation", p / "train.log")
                                                         for p in sorted(exp.glob("confirm*"))]
        for kind, log in logs:
            seconds = compile_seconds(log)
            if seconds is not None:
                found[kind].append((f"{exp.name}/{log.parent.name if log.parent != exp else ''}".rstrip("/"), seconds))
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for run_dir in map(Path, argv):
        found = runs(run_dir)
        print(f"{run_dir}: compile_seconds of each scored run (train.log)")
        for kind, items in found.items():
            if not items:
                continue
            values = [s for _, s in items]
            print(f"  {kind:13s} n={len(values):2d}  mean {statistics.mean(values):5.2f} s  "
                  f"min {min(values):5.2f}  max {max(values):5.2f}   " + ", ".join(f"{l} {s:.2f}" for l, s in items))
        if found["baseline"] and found["first run"]:
            ratio = statistics.mean(s for _, s in found["first run"]) / statistics.mean(s for _, s in found["baseline"])
            print(f"  first runs / baselines: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
