"""Issue 56's no-regression table: candidate/train.py at two commits (the one-learner train.py and the
two-learner one before it), side by side, on the default path a night would take.

    .venv/bin/python -m bench.one_ppo --old COMMIT [--new HEAD] [--cases cartpole-3s,pendulum-15s,...]
                                      [--work DIR] [--out bench/results/one-ppo-DATE.jsonl] [--episodes 100]
                                      [--seeds 7,8,9] [--sides old,new]

Both sides train in checkouts that share one base (this checkout's evaluate.py, envs_fast/,
train_plumbing.py and policy_export.py, committed at --new) and differ only in candidate/train.py, so
one private verdict cache serves both: the shipped JAX translations of the cases' envs are verified
into it first (L1-L3, as a night's setup does), and each side takes the path its train.py takes with
them. Each case's runs are interleaved old, new, old, new... (the same machine load on both sides),
each a fresh process as the daemon runs it (an empty JAX compilation cache: every run compiles cold),
and each artifact is scored by evaluate.py on the reference env over --episodes episodes from a seed
no training run resets with.

Resumable: every finished run is one JSON line in --out (its identity: side, its commit's train.py,
case, seed); a later call with the same --out trains only the runs missing, so a 720 s case spread
over sittings adds to the same file. The table at the end is computed from the whole file.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
from orchestrator.artifacts import parse_summary  # noqa: E402  (train.py's summary lines, as the daemon reads them)

EVAL_SEED = 900_000  # far from every training run's resets
SHARED = ("evaluate.py", "envs_fast", "envs", "train_plumbing.py", "policy_export.py")


@dataclass(frozen=True)
class Case:
    name: str
    env_id: str
    budget: float
    seeds: tuple
    what: str  # the criterion
    old_constants: tuple = ()  # (NAME, value) pairs set in the old train.py for this case: the path it is measured on


CASES = {c.name: c for c in (
    Case("cartpole-3s", "CartPole-v1", 3, (1, 2), ">= 475 on seeds 1 and 2"),
    Case("cartpole-10s", "CartPole-v1", 10, (1, 2, 3, 4), "env steps at least the old train.py's"),
    Case("pendulum-15s", "Pendulum-v1", 15, (1, 2, 3), ">= -200 on 3 seeds"),
    Case("lunarlander-15s", "LunarLander-v3", 15, (1, 2, 3, 4, 5, 6), "no port: no worse than the old train.py"),
    Case("lunarlander-120s", "LunarLander-v3", 120, (1, 2), "no port: no worse than the old train.py"),
    Case("connect-four-15s", "envs.connect_four.env:Env", 15, (1, 2, 3, 4, 5, 6),
         "a created env (no port): no worse than the old train.py"),
    Case("connect-four-120s", "envs.connect_four.env:Env", 120, (1, 2),
         "a created env (no port): no worse than the old train.py"),
    Case("bipedalwalker-720s", "BipedalWalker-v3", 720, (1, 2, 3), "mean of 3 seeds >= 310"),
    # the old train.py took jax-host here too; the baseline is its torch host path (2952 on 2 seeds)
    Case("halfcheetah-720s", "HalfCheetah-v5", 720, (1, 2, 3), "at least the old host path's mean",
         old_constants=(("LEARNER", '"torch"'),)),
)}
PORTS = {"CartPole-v1": "envs_fast/translations/cartpole_v1.py", "Pendulum-v1": "envs_fast/translations/pendulum_v1.py",
         "BipedalWalker-v3": "envs_fast/translations/bipedalwalker_v3.rs", "HalfCheetah-v5": "mujoco_batch"}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def train_py_blob(commit: str) -> str:
    """The blob of `commit`'s candidate/train.py, or "" where the commit is not in this clone."""
    try:
        return git("rev-parse", f"{commit}:candidate/train.py")
    except subprocess.CalledProcessError:
        return ""


def with_constants(source: str, constants: tuple) -> str:
    """train.py's text with each (NAME, value) constant's top-level assignment set to value."""
    lines = source.splitlines()
    for name, value in constants:
        at = [i for i, line in enumerate(lines) if line.startswith(f"{name} = ")]
        if len(at) != 1:
            raise SystemExit(f"one_ppo: train.py has {len(at)} top-level assignments of {name}, not 1")
        comment = lines[at[0]].partition("  #")[2]
        lines[at[0]] = f"{name} = {value}" + (f"  #{comment}" if comment else "")
    return "\n".join(lines) + "\n"


def blob_of(text: str) -> str:
    return subprocess.run(["git", "hash-object", "--stdin"], cwd=REPO, input=text, capture_output=True, text=True,
                          check=True).stdout.strip()


def checkout(root: Path, base_commit: str, train_py: str) -> Path:
    """`base_commit`'s SHARED files with `train_py` as candidate/train.py."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", base_commit, *SHARED], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    (root / "candidate").mkdir()
    (root / "candidate" / "train.py").write_text(train_py)
    return root


def verify(base: Path, env_id: str, cache: Path) -> str:
    """The env's port verified (L1-L3) into `cache`, as a night's setup does; its report's first line."""
    port = PORTS.get(env_id)
    if port is None:
        return f"{env_id}: no port (trains on envpool or gymnasium's vector env)"
    proc = subprocess.run([sys.executable, "-m", "envs_fast.verify", "--env", env_id, "--backend", port], cwd=base,
                          env=dict(os.environ, PYTHONPATH=str(base), AUTORL_VERIFY_CACHE=str(cache)),
                          capture_output=True, text=True)
    first = (proc.stdout.strip().splitlines() or ["(no output)"])[0]
    return f"{env_id}: {port} " + ("verified: " if proc.returncode == 0 else "FAILED verification: ") + first


def run(root: Path, case: Case, seed: int, cache: Path, out: Path, episodes: int) -> dict:
    """One training run of `root`'s train.py and its artifact's score."""
    if out.exists():
        shutil.rmtree(out)
    env = {k: v for k, v in os.environ.items() if k not in ("AUTORL_JAX_CACHE_DIR", "PYTHONPATH")}
    env.update(AUTORL_ENV_ID=case.env_id, AUTORL_TIME_BUDGET=f"{case.budget:g}", AUTORL_SEED=str(seed),
               AUTORL_OUTPUT_DIR=str(out), AUTORL_VERIFY_CACHE=str(cache), AUTORL_JAX_CACHE_DIR=str(out / "jax-cache"))
    proc = subprocess.run([sys.executable, str(root / "candidate" / "train.py")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=case.budget + 600)
    (out / "train.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "train.log").write_text(proc.stdout + proc.stderr)
    stats = parse_summary(proc.stdout)
    row = {"returncode": proc.returncode, "path": stats.get("path"), "backend": stats.get("backend"),
           "env_steps": int(stats.get("env_steps", 0)), "wall_seconds": float(stats.get("wall_seconds", "nan"))}
    if proc.returncode == 0 and (out / "policy.pt").is_file():
        ev = subprocess.run([sys.executable, "evaluate.py", "--policy", str(out / "policy.pt"), "--env", case.env_id,
                             "--episodes", str(episodes), "--seed", str(EVAL_SEED)], cwd=root, capture_output=True,
                            text=True, timeout=3600)
        if ev.returncode == 0:
            row["score"] = json.loads(ev.stdout.strip().splitlines()[-1])["mean"]
    return row


def table(rows: list[dict]) -> str:
    lines = ["| case | side | commit | path | env steps (per seed) | score (per seed) | mean score |", "|" + "---|" * 7]
    for name in CASES:
        for side in ("old", "new"):
            mine = sorted((r for r in rows if r["case"] == name and r["side"] == side), key=lambda r: r["seed"])
            if not mine:
                continue
            scores = [r.get("score") for r in mine]
            known = [s for s in scores if s is not None]
            steps = ", ".join(format(r["env_steps"], ",") for r in mine)
            per_seed = ", ".join("—" if s is None else format(s, ".1f") for s in scores)
            mean = format(statistics.mean(known), ".1f") if known else "—"
            lines.append(f"| {name} | {side} | {mine[0]['commit'][:8]} | {mine[0]['path']} | {steps} | {per_seed} "
                         f"| {mean} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the commit of the train.py to compare against")
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--cases", default="cartpole-3s,cartpole-10s,pendulum-15s,lunarlander-15s,lunarlander-120s")
    parser.add_argument("--work", type=Path, default=None, help="checkouts and run folders (default: a temp dir)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON lines file results go to (resumable)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seeds", default="", help="comma-separated seeds for every case (default: each case's)")
    parser.add_argument("--sides", default="old,new", choices=("old,new", "new", "old"),
                        help="which sides train now (a later call adds the other: the file is resumable)")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    cases = [CASES[c] for c in args.cases.split(",")]
    commits = {"old": git("rev-parse", args.old), "new": git("rev-parse", args.new)}
    work = args.work or Path(tempfile.mkdtemp(prefix="one-ppo-"))
    sources = {side: git("show", f"{commit}:candidate/train.py") + "\n" for side, commit in commits.items()}
    roots = {side: checkout(work / side, commits["new"], text) for side, text in sources.items()}
    cache = work / "verify-cache"
    for env_id in dict.fromkeys(case.env_id for case in cases):
        print(verify(roots["new"], env_id, cache), flush=True)
    done = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    # a run is known by its train.py's content: a commit that changes only other files trains nothing again
    # (rows carry it; older rows name a commit, which may be gone from this clone: then they match nothing)
    blob = {commit: train_py_blob(commit) for commit in {r["commit"] for r in done} | set(commits.values())}
    have = {(r["side"], r.get("train_py") or blob[r["commit"]], r["case"], r["seed"]) for r in done}
    seeds = [int(seed) for seed in args.seeds.split(",")] if args.seeds else None
    for case in cases:
        for seed in seeds or case.seeds:
            for side in args.sides.split(","):  # interleaved: both see the same load
                root, train_py = roots[side], blob[commits[side]]
                constants = case.old_constants if side == "old" else ()
                if constants:  # its own checkout, known by the edited train.py's blob
                    text = with_constants(sources[side], constants)
                    train_py = blob_of(text)
                    root = work / f"{side}-{case.name}"
                    if not (root / "candidate" / "train.py").is_file() or \
                            (root / "candidate" / "train.py").read_text() != text:
                        checkout(root, commits["new"], text)
                identity = (side, train_py, case.name, seed)
                if identity in have:
                    continue
                row = run(root, case, seed, cache, work / "runs" / f"{case.name}-{side}-{seed}", args.episodes)
                row.update(side=side, commit=commits[side], train_py=train_py, case=case.name, seed=seed,
                           env_id=case.env_id, budget=case.budget, episodes=args.episodes)
                if constants:
                    row["constants"] = dict(constants)
                print(json.dumps(row), flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                with open(args.out, "a") as file:
                    file.write(json.dumps(row) + "\n")
                done.append(row)
    print(table(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
