"""How long the morning report takes to refresh on a long night (the daemon refreshes it after
every row, so it must stay well under a second or two at 200 rows).

    python -m bench.report [--rows 200] [--repeats 5]

Builds the synthetic night of orchestrator/benchmark/synthetic_night.py (every status, diffs,
errors), writes the report once (imports matplotlib, pandas and scipy as the daemon's first
refresh does), then times report.refresh and prints the median, the fastest and the slowest.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator import report
from orchestrator.benchmark.synthetic_night import synthetic_night

TARGET_S = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = synthetic_night(Path(tmp) / "results" / "big", rows=args.rows)
        report.write(run_dir)
        seconds = []
        for _ in range(args.repeats):
            started = time.monotonic()
            report.refresh(run_dir)
            seconds.append(time.monotonic() - started)
    median = statistics.median(seconds)
    print(f"report refresh, {args.rows} rows: median {median:.2f}s (min {min(seconds):.2f}s, "
          f"max {max(seconds):.2f}s over {args.repeats}); target < {TARGET_S:.0f}s: "
          f"{'met' if median < TARGET_S else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
