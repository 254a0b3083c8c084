"""The keep rule's error rates and cost, by simulation (orchestrator/keep_rule.simulate).

    python bench/keep_rule.py [--trials 20000]

For each number of same-code pairs the night has produced so far, candidates whose true score
is the best's (no gain) or the best's + 2 sigma are judged by the rule; prints how often each is
kept, the mean number of train runs per candidate (1 + confirmations) and how often the gain is
kept on its first run. Two settings of the
best: the reference the rule compares against (what the rule's levels are about), and the mean
of 2 runs of code as good as the best (a night's start: the baseline), whose own noise adds to
the comparison.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.keep_rule import simulate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument("--se", type=float, default=0.1, help="evaluation standard error, in sigmas")
    args = parser.parse_args()
    for best_runs, title in ((0, "best = the reference"), (2, "best = mean of 2 runs (the baseline)")):
        print(f"{title}; {args.trials} candidates per cell")
        print("  pairs | no gain: kept  runs | +2 sigma: kept  runs  first run")
        for pairs in (1, 2, 3, 5, 8, 10, 20, 40):
            null = simulate(0.0, pairs, args.trials, seed=pairs, se=args.se, best_runs=best_runs)
            gain = simulate(2.0, pairs, args.trials, seed=10_000 + pairs, se=args.se, best_runs=best_runs)
            print(f"  {pairs:5d} |       {null.kept:6.3f} {null.runs:5.2f} |         {gain.kept:6.3f} {gain.runs:5.2f}"
                  f"  {gain.outright:6.3f}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
