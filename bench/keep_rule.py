"""The keep rule's error rates and cost, by simulation (orchestrator/keep_rule.simulate, simulate_night).

    python bench/keep_rule.py [--trials 20000]

Per candidate: for each number of same-code pairs the night has produced so far, candidates whose
true score is the best's (no gain) or the best's + 2 / 4 sigma are judged by the rule as the first
candidate of a stretch (level 1.25%), against a best that is the mean of the baseline runs (the
default --baselines); prints
how often each is kept and the mean number of train runs per candidate (1 + confirmations), and
beside it the rule that took the best's mean as exact (how it was before).

Per night: nights of 12 and 30 candidates, none better than the start (a night that can gain
nothing), and nights with one real gain at candidate j: how often a night keeps something no
better than its best then, how often it finds the gain, the runs it spends; and how much more
often a night finds a gain with more baseline runs (--baselines).
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.config import BASELINE_RUNS  # noqa: E402
from orchestrator.keep_rule import simulate, simulate_night  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument("--se", type=float, default=0.1, help="evaluation standard error, in sigmas")
    args = parser.parse_args()
    print(f"one candidate against the mean of {BASELINE_RUNS} baselines; {args.trials} candidates per cell")
    print("  pairs | no gain: kept  runs  (best as exact: kept) | +2 sigma: kept  runs | +4 sigma: kept  runs")
    for pairs in sorted({BASELINE_RUNS - 1, 3, 5, 10, 20, 40}):   # the baselines alone give N - 1
        null = simulate(0.0, pairs, args.trials, seed=pairs, se=args.se, best_runs=BASELINE_RUNS)
        blind = simulate(0.0, pairs, args.trials, seed=pairs, se=args.se, best_runs=BASELINE_RUNS, rule_sees_best_runs=False)
        two = simulate(2.0, pairs, args.trials, seed=10_000 + pairs, se=args.se, best_runs=BASELINE_RUNS)
        four = simulate(4.0, pairs, args.trials, seed=20_000 + pairs, se=args.se, best_runs=BASELINE_RUNS)
        print(f"  {pairs:5d} |         {null.kept:6.3f} {null.runs:5.2f}  ({blind.kept:6.3f})            |"
              f"        {two.kept:6.3f} {two.runs:5.2f} |        {four.kept:6.3f} {four.runs:5.2f}")
    nights = max(args.trials // 10, 200)
    print(f"\nwhole nights ({BASELINE_RUNS} baselines, then the candidates); {nights} nights per line")
    print("  night                                  | false-keep nights | keeps | gain (sigma) | runs")
    cases = [("12 candidates, none better", [0.0] * 12), ("30 candidates, none better", [0.0] * 30)]
    cases += [(f"+4 sigma at candidate {j}, 12 in all", [0.0] * (j - 1) + [4.0] + [0.0] * (12 - j)) for j in (1, 3, 6)]
    cases += [("+3 then +6 sigma (candidates 2, 5)", [0.0, 3.0, 0.0, 0.0, 6.0] + [0.0] * 7)]
    cases += [("+4 sigma after 5 worse (-4..-2 sigma)", [-3.0, -2.0, -4.0, -2.5, -3.0, 4.0] + [-2.0] * 6)]
    for label, gains in cases:
        s = simulate_night(gains, nights, seed=len(label), se=args.se)
        print(f"  {label:38s} | {s.false_keep_nights:17.3f} | {s.keeps:5.2f} | {s.gain:12.2f} | {s.runs:5.1f}")
    print(f"\nby --baselines: 12-candidate nights, each candidate +2.5 sigma with probability 1/4, else "
          f"-2..0 sigma; {nights} nights per line")
    print("  baselines | found a gain | false-keep nights (all candidates equal) | runs")
    for baselines in (2, 3, 4, 6):
        found = runs = 0
        for trial in range(nights):
            draw = random.Random(trial)
            gains = [2.5 if draw.random() < 0.25 else draw.uniform(-2.0, 0.0) for _ in range(12)]
            night = simulate_night(gains, 1, seed=trial, se=args.se, baseline_runs=baselines)
            found, runs = found + (night.gain > 0), runs + night.runs
        null = simulate_night([0.0] * 12, nights, seed=baselines, se=args.se, baseline_runs=baselines)
        print(f"  {baselines:9d} | {found / nights:12.2f} | {null.false_keep_nights:39.3f} | {runs / nights:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
