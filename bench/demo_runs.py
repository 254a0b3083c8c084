"""How often does `make demo` show a real gain, and how long does it take? Fresh runs, resumable.

    python -m bench.demo_runs [--runs 5] [--out bench/results/demo-runs.tsv] [-- DEMO OPTIONS, e.g. --budget 30]

Each run is the demo (bench/demo.py, what `make demo` runs after `make install`) in a fresh clone of
this checkout's HEAD with an empty user-level verdict cache, as on a fresh machine: the setup
verifies and benchmarks the shipped backends again. The installed venv is reused (`make install`
is timed separately in the docs). One row per run is appended to --out as the run ends, with the
machine's load average before and after (the figure depends on it); running again adds only the
runs still missing, so an interrupted measurement goes on where it stopped.
A run "shows a gain" when the night kept an experiment and its best rescored significantly above
the start on fresh seeds (demo.json's `confirmed`).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.benchmark.rescoring import embedded_agent_env

REPO = Path(__file__).resolve().parent.parent
COLUMNS = ("run", "utc", "commit", "demo_args", "machine", "load_before", "load_after", "exit", "wall_s", "kept", "confirmed",
           "start_rescored", "best_rescored", "gain", "p_better")


def machine() -> str:
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"


def one_run(number: int, demo_args: list[str]) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="autorl-demo-run-") as scratch:
        clone = Path(scratch) / "autorl"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        env = embedded_agent_env()
        env["AUTORL_USER_CACHE"] = str(Path(scratch) / "user-cache")   # a fresh machine's empty cache
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "bench.demo", "--tag", f"demo-run-{number}", *demo_args], cwd=clone, env=env,
                              capture_output=True, text=True)
        wall = time.monotonic() - started
        verdict_file = clone / "results" / f"demo-run-{number}" / "demo.json"
        verdict = json.loads(verdict_file.read_text()) if verdict_file.exists() else {}
        if done.returncode != 0:
            print(done.stdout[-1500:], done.stderr[-1500:], sep="\n", file=sys.stderr)
    return {"run": number, "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), "commit": commit,
            "demo_args": " ".join(demo_args) or "-", "machine": machine(), "load_before": f"{load_before:.1f}", "load_after": f"{os.getloadavg()[0]:.1f}",
            "exit": done.returncode, "wall_s": f"{wall:.0f}", "kept": verdict.get("kept", ""),
            "confirmed": verdict.get("confirmed", ""),
            "start_rescored": " ".join(f"{s:.1f}" for s in verdict.get("start_rescored", [])),
            "best_rescored": " ".join(f"{s:.1f}" for s in verdict.get("best_rescored", [])),
            "gain": f"{verdict['gain']:.1f}" if "gain" in verdict else "",
            "p_better": f"{verdict['p_better']:.3f}" if "p_better" in verdict else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs wanted in --out in all (default 5)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "demo-runs.tsv")
    parser.add_argument("demo_args", nargs="*", help="passed on to bench/demo.py after --, e.g. -- --budget 30")
    args = parser.parse_args()
    done = list(csv.DictReader(args.out.open(), delimiter="\t")) if args.out.exists() else []
    if not args.out.exists():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\t".join(COLUMNS) + "\n")
    header = args.out.read_text().splitlines()[0].split("\t")   # a file's own columns (older files lack some)
    for number in range(len(done) + 1, args.runs + 1):
        row = one_run(number, args.demo_args)
        with args.out.open("a") as out:
            out.write("\t".join(str(row.get(c, "")) for c in header) + "\n")
        done.append(row)
        print("\t".join(f"{c}={row[c]}" for c in COLUMNS), flush=True)
    shown = sum(str(r["confirmed"]) == "True" for r in done)
    walls = sorted(float(r["wall_s"]) for r in done)
    print(f"{shown} of {len(done)} runs kept a gain confirmed on fresh seeds; wall {walls[0] / 60:.1f}-"
          f"{walls[-1] / 60:.1f} min" if done else "no runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
