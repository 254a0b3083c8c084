"""The keep rule's error rates and cost, by simulation through the loop's own round and bookkeeping
(orchestrator/keep_rule_simulation.py: the incumbent rebuilt from rows and exp folders as on
resume, TrainPhase.judge_round, decision.json, the rows' order; only the scores are synthetic).

    python -m bench.keep_rule [--trials 4000] [--candidate-sd 1,3,5,8] [--copy-jitter 0,0.01,0.03] [--parallel K] [--workers 2]

1. Null nights by candidate noise: 12 candidates as good as the start, each with a seed-to-seed sd
   R times the start's (R < 1: a noisy start, as a detune that makes training unstable gives, among
   quieter candidates); prints `R x: null nights keeping something X%` (the promise: X <= 5).
   Then seed-copying candidates (a train.py that pins its own seed: its confirmations copy its first
   run, exactly or within a jitter of J sigma): `copies within J sigma: null nights keeping something X%`.
   The measured case (a seed-pinned Pendulum candidate: -138.3, -137.3, -138.3 where the start's
   seeds differ by 44) is about 0.1 x the evaluation's standard error: 0.01 sigma at --se 0.1.
2. Power: a +4 sigma gain as the first of 12 candidates at equal noise, how often the night keeps
   it, and the runs per candidate; the same over a start 10x noisier than its candidates, and +3
   sigma as the third candidate there (what re-measuring a noisy start is for).
3. Whole nights (trials / 10 each): longer null nights, a gain at candidate j, gains after worse
   candidates; and how often a night finds a gain by --baselines (gains from a stream of their own).
"""
from __future__ import annotations

import argparse
import random
import sys
from concurrent.futures import ProcessPoolExecutor


from orchestrator.config import BASELINE_RUNS  # noqa: E402
from orchestrator.keep_rule_simulation import SimulatedNights, simulate_nights  # noqa: E402


def _chunk(kwargs: dict) -> SimulatedNights:
    return simulate_nights(**kwargs)


def nights(pool: ProcessPoolExecutor, workers: int, trials: int, seed: int, **kwargs) -> SimulatedNights:
    """simulate_nights over `workers` processes (each its own seeds: independent streams), pooled."""
    sizes = [trials // workers + (i < trials % workers) for i in range(workers)]
    parts = list(pool.map(_chunk, [dict(kwargs, trials=n, seed=seed * 1000 + i) for i, n in enumerate(sizes) if n]))
    total = sum(p.trials for p in parts)

    def mean(name: str) -> float:
        return sum(getattr(p, name) * p.trials for p in parts) / total

    return SimulatedNights(mean("false_keep_nights"), mean("found"), mean("keeps"), mean("gain"), mean("runs"),
                           mean("runs_per_candidate"), total, mean("start_remeasures"))


def quarter_gains(draw: random.Random) -> list[float]:
    """12 candidates, each +2.5 sigma with probability 1/4, else -2..0 sigma."""
    return [2.5 if draw.random() < 0.25 else draw.uniform(-2.0, 0.0) for _ in range(12)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000, help="nights per line of part 1 and 2")
    parser.add_argument("--candidate-sd", default="0.1,0.3,1,3,5,8", help="candidates' seed sd, in multiples of the start's")
    parser.add_argument("--copy-jitter", default="0,0.01,0.03",
                        help="seed-copying candidates: how far (sigmas) their confirmations stray from their first run")
    parser.add_argument("--se", type=float, default=0.1, help="evaluation standard error, in sigmas")
    parser.add_argument("--baselines", type=int, default=BASELINE_RUNS)
    parser.add_argument("--parallel", type=int, default=1, help="candidates per round (the daemon's --parallel)")
    parser.add_argument("--workers", type=int, default=2, help="simulation processes")
    parser.add_argument("--skip-nights", action="store_true", help="parts 1 and 2 only")
    args = parser.parse_args()
    common = dict(se=args.se, baselines=args.baselines, parallel=args.parallel)
    print(f"{args.baselines} baselines, --parallel {args.parallel}, eval se {args.se:g} sigma; "
          f"{args.trials} nights per line")
    with ProcessPoolExecutor(args.workers) as pool:
        for ratio in [float(r) for r in args.candidate_sd.split(",")]:
            s = nights(pool, args.workers, args.trials, seed=int(ratio * 10), gains=[0.0] * 12, candidate_sd=ratio,
                       **common)
            print(f"{ratio:g} x: null nights keeping something {100 * s.false_keep_nights:.1f}%  "
                  f"(runs per candidate {s.runs_per_candidate:.2f}, start re-measured {s.start_remeasures:.2f} "
                  f"runs a night)", flush=True)
        for jitter in [float(j) for j in args.copy_jitter.split(",") if j]:
            s = nights(pool, args.workers, args.trials, seed=300 + int(jitter * 100), gains=[0.0] * 12,
                       copy_jitter=jitter, **common)
            print(f"copies within {jitter:g} sigma ({jitter / args.se:g} x the eval se): null nights keeping something "
                  f"{100 * s.false_keep_nights:.1f}%  "
                  f"(runs per candidate {s.runs_per_candidate:.2f})", flush=True)
        power = nights(pool, args.workers, args.trials, seed=4, gains=[4.0] + [0.0] * 11, **common)
        print(f"power: a +4 sigma gain first of 12 candidates at equal noise is kept in {100 * power.found:.1f}% "
              f"of nights (runs per candidate {power.runs_per_candidate:.2f})", flush=True)
        quiet = nights(pool, args.workers, args.trials, seed=5, gains=[4.0] + [0.0] * 11, candidate_sd=0.1, **common)
        print(f"power: the same gain over a start 10x noisier than its candidates is kept in {100 * quiet.found:.1f}% "
              f"of nights (runs per candidate {quiet.runs_per_candidate:.2f}, start re-measured "
              f"{quiet.start_remeasures:.2f} runs a night)", flush=True)
        # the case a re-measured start serves: earlier candidates' confirmations show the start's spread
        later = nights(pool, args.workers, args.trials, seed=6, gains=[0.0, 0.0, 3.0] + [0.0] * 9, candidate_sd=0.1,
                       **common)
        print(f"power: +3 sigma as candidate 3 over a start 10x noisier than its candidates is kept in "
              f"{100 * later.found:.1f}% of nights (runs per candidate {later.runs_per_candidate:.2f}, start "
              f"re-measured {later.start_remeasures:.2f} runs a night)", flush=True)
        if args.skip_nights:
            return 0
        few = max(args.trials // 10, 200)
        print(f"\nwhole nights; {few} nights per line")
        print("  night                                  | false-keep nights | keeps | gain (sigma) | runs")
        cases = [("12 candidates, none better", [0.0] * 12), ("30 candidates, none better", [0.0] * 30)]
        cases += [(f"+4 sigma at candidate {j}, 12 in all", [0.0] * (j - 1) + [4.0] + [0.0] * (12 - j)) for j in (3, 6)]
        cases += [("+3 then +6 sigma (candidates 2, 5)", [0.0, 3.0, 0.0, 0.0, 6.0] + [0.0] * 7)]
        cases += [("+4 sigma after 5 worse (-4..-2 sigma)", [-3.0, -2.0, -4.0, -2.5, -3.0, 4.0] + [-2.0] * 6)]
        for label, gains in cases:
            s = nights(pool, args.workers, few, seed=len(label), gains=gains, **common)
            print(f"  {label:38s} | {s.false_keep_nights:17.3f} | {s.keeps:5.2f} | {s.gain:12.2f} | {s.runs:5.1f}",
                  flush=True)
        print(f"\nby --baselines: 12-candidate nights, each candidate +2.5 sigma with probability 1/4, else "
              f"-2..0 sigma; {few} nights per line")
        print("  baselines | found a gain | false-keep nights (all candidates equal) | runs")
        for baselines in (2, 3, 4, 6):
            found = nights(pool, args.workers, few, seed=100 + baselines, gains=quarter_gains,
                           **dict(common, baselines=baselines))
            null = nights(pool, args.workers, few, seed=200 + baselines, gains=[0.0] * 12,
                          **dict(common, baselines=baselines))
            print(f"  {baselines:9d} | {found.found:12.2f} | {null.false_keep_nights:39.3f} | {found.runs:5.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
