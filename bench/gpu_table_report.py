"""bench/gpu_table.py's table: the figures so far with the machine and packages they were measured on,
the issue's three targets judged against them, written as JSON and markdown at each new figure."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIPEDAL = "BipedalWalker-v3"
# Target 2 is a ratio to this 2-core figure: jax-host on the Rust port, 120 s, seed 1 (November 26)
HOST_120S = {"env_steps": 1_988_825, "source": "bench/results/bipedal-training-budgets-2026-11-26.txt"}
REPORTED_PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "mujoco", "mujoco-mjx", "gymnasium",
                     "Box2D", "torch", "optax", "flax", "numpy")


class Table:
    """The figures so far, rewritten to OUT/gpu_table.json and .md at each one, and printed as a line."""

    def __init__(self, out: Path, plan, deadline: float):  # plan: gpu_table.Plan
        self.out, self.started, self._lock = out, time.time(), threading.Lock()
        self.data = {"machine": machine(), "packages": packages(), "commit": commit(), "deadline_s": deadline,
                     "plan": asdict(plan), "raw": [], "training": [], "verification": [], "notes": [],
                     "finished": False}
        self._write()

    def add(self, part: str, row: dict, line: str) -> None:
        with self._lock:
            row["at_s"] = round(time.time() - self.started, 1)
            self.data[part].append(row)
            self._write()  # on disk before it is printed: whoever saw the line finds it there
            print(f"[{row['at_s']:6.1f} s] {line}", flush=True)

    def note(self, line: str) -> None:
        self.add("notes", {"note": line}, line)

    def finish(self) -> None:
        with self._lock:
            self.data["finished"], self.data["elapsed_s"] = True, round(time.time() - self.started, 1)
            self._write()

    def _write(self) -> None:
        self.data["targets"] = targets(self.data)
        for name, text in (("gpu_table.json", json.dumps(self.data, indent=1)), ("gpu_table.md", markdown(self.data))):
            temporary = self.out / (name + ".tmp")
            temporary.write_text(text)
            os.replace(temporary, self.out / name)  # a reader never sees half a table


def machine() -> dict:
    found = {"cpus": os.cpu_count(), "gpu": "none (nvidia-smi not found)"}
    if shutil.which("nvidia-smi"):
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
        found["gpu"] = query.stdout.strip() or query.stderr.strip()
    return found


def packages() -> dict:
    versions = {}
    for name in REPORTED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    versions["python"] = sys.version.split()[0]
    return versions


def commit() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def targets(data: dict) -> list[dict]:
    """The issue's three targets beside the figures ("pending" until measured)."""
    def best_raw(env_id):
        figures = [row["sps"] for row in data["raw"] if row["env_id"] == env_id and "sps" in row]
        return max(figures) if figures else None

    bipedal = next((row for row in data["training"] if row["env_id"] == BIPEDAL and "env_steps" in row), None)
    found = [("JAX BipedalWalker port, raw env steps/s (best size)", best_raw(BIPEDAL), 1e6, "1M"),
             ("BipedalWalker jax-e2e env steps in 120 s, vs the 2-core jax-host figure",
              bipedal["env_steps"] / HOST_120S["env_steps"] if bipedal else None, 30.0, "30x"),
             ("mjx HalfCheetah-v5, raw env steps/s (best size)", best_raw("HalfCheetah-v5"), 1e6, "1M")]
    return [{"target": name, "figure": figure, "at_least": threshold, "stated": stated,
             "status": "pending" if figure is None else ("met" if figure >= threshold else "missed")}
            for name, figure, threshold, stated in found]


def markdown(data: dict) -> str:
    machine_line = f"GPU: {data['machine']['gpu']}; {data['machine']['cpus']} CPU cores; commit {data['commit']}"
    lines = ["# The fast paths on a GPU (bench/gpu_table.py)", "", machine_line, "",
             "Packages: " + ", ".join(f"{k} {v}" for k, v in data["packages"].items()), "",
             "| target | figure | asked | status |", "|---|---|---|---|"]
    for t in data["targets"]:
        figure = "" if t["figure"] is None else (f"{t['figure']:.1f}x" if t["stated"].endswith("x") else f"{t['figure']:,.0f}")
        lines.append(f"| {t['target']} | {figure} | >= {t['stated']} | {t['status']} |")
    lines += ["", "## Raw env steps/s", "", "| env | backend | envs | steps/s | compile s (wall / CPU) |", "|---|---|---|---|---|"]
    for r in data["raw"]:
        figure = f"{r['sps']:,.0f}" if "sps" in r else r.get("error", "")
        compile_s = f"{r['compile_wall_s']:.1f} / {r['compile_cpu_s']:.1f}" if "compile_wall_s" in r else ""
        lines.append(f"| {r['env_id']} | {Path(r['spec']).name} | {r['num_envs']} | {figure} | {compile_s} |")
    lines += ["", "## Training (candidate/train.py, scored by evaluate.py on the reference env)", "",
              "| env | budget | constants | path | env steps | sps | compile s | updates | eval mean ± se (episodes) | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["training"]:
        constants = ", ".join(f"{k}={v}" for k, v in r.get("constants", {}).items()) or "as shipped"
        score = f"{r['eval_mean']:.1f} ± {r['eval_se']:.1f} ({r['eval_episodes']})" if "eval_mean" in r else r.get("eval_error", "")
        steps = f"{r['env_steps']:,}" if "env_steps" in r else r.get("error", "")
        lines.append(f"| {r['env_id']} | {r['budget']:g} s | {constants} | {r.get('path', '')} | {steps} | {r.get('sps', '')} "
                     f"| {r.get('compile_seconds', '')} | {r.get('updates', '')} | {score} | {r.get('verdict', '')} |")
    lines += ["", "## Verification (envs_fast.verify, L1-L3, on this machine)", "",
              "| env | level | result | active s | wall s |", "|---|---|---|---|---|"]
    for r in data["verification"]:
        lines.append(f"| {r['env_id']} | {r['level']} | {r['result']} | {r.get('active_s', '')} | {r.get('wall_s', '')} |")
    if data["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n['note']}" for n in data["notes"]]
    lines += ["", "finished" if data["finished"] else "(still running, or cut short)", ""]
    return "\n".join(lines)
