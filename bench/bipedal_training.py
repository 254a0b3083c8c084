"""BipedalWalker-v3 training side by side: candidate/train.py's PPO for the same budget on the two host
backends (envpool, the Rust port envs_fast/translations/bipedalwalker_v3.rs), as the daemon runs it (the jax-host
path; `jax-e2e:SPEC` trains a JAX translation end to end, `jax-host:SPEC` steps it from the host). --env trains another env (its Rust translation
envs_fast/translations/<slug>.rs for `rust`; `mujoco_batch` for a MuJoCo env, `reference` for gymnasium's vector env,
any backend spec train.py takes). Figures per run: env steps trained in the budget (the clock starts
with the process: imports, env start-up and JAX's compile count), the training loop's sps, compile
seconds, updates, and (with --episodes) the artifact's score from evaluate.py.

    .venv/bin/python -m bench.bipedal_training [--budgets 90] [--repeats 1] [--episodes 10] [--seed 1]
                                              [--configs jax-host:rust,jax-host:envpool]
                                              [--env BipedalWalker-v3] [--set NUM_ENVS=128 ...]

Each config is a checkout of a commit's evaluate.py and envs_fast/ (below) with this checkout's
train.py (BACKEND and END_TO_END set in it, nothing else), train_plumbing.py and policy_export.py, run
with an empty JAX compilation cache of its
own (every run compiles cold, as in a night); the configs are interleaved per repeat, so that all see
the same machine load.

A backend other than envpool and gymnasium (the Rust port, mujoco_batch) trains only with a passing
verdict. Verifying BipedalWalker's port takes ~15 min on 2 cores, so a verdict run setup stored in the
user cache (~/.cache/autorl/verify, or $AUTORL_USER_CACHE) is copied into the benchmark's private cache.
A verdict's key covers all of envs_fast's source, so the checkouts hold envs_fast (and evaluate.py) as of
the newest of envs_fast's last 10 commits that has one for every such backend (the output says which,
and what HEAD changed since); none: the benchmark verifies HEAD's backends itself (--verify) or stops.
Committed envs_fast, never the working tree's (someone's uncommitted edits would miss).

    .venv/bin/python -m bench.bipedal_training --env HalfCheetah-v5 --budgets 120 --repeats 2 --verify \
        --configs jax-host:reference,jax-host:mujoco_batch

(issue 39's target: HalfCheetah's env steps in a 120 s budget on mujoco_batch against gymnasium's vector env.)

Resumable: with --out DIR, each run's figures go to DIR/<config>-<budget>s-<repeat>/result.json as it
ends, and a later call with the same DIR reuses every run whose identity (the checkout's envs_fast
commit, train.py's text, config, budget, seed, episodes) matches, training only the missing ones; a
720 s comparison is hours on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = ("jax-host:rust", "jax-host:envpool")
END_TO_END = {"jax-host": False, "jax-e2e": True}  # a config's path: how train.py feeds its learner
TRAIN_COMPANIONS = ("train_plumbing.py", "policy_export.py")  # what this checkout's train.py imports
UNVERIFIED = ("envpool", "reference", "gymnasium")  # train.py trains on these without a verdict


def summary(stdout: str) -> dict:
    if "\n---\n" not in stdout:
        return {}
    tail = stdout.rsplit("\n---\n", 1)[1]
    return dict(line.split(": ", 1) for line in tail.strip().splitlines() if ": " in line)


# Run in the base checkout (its envs_fast decides the verdict's key), argv: backend spec, env id, the user
# cache, the private cache. Copies the user cache's passing verdict for the backend into the private
# cache (and builds a Rust port's library there); prints the verdict found (null: none).
PREPARE_CACHE = """
import json, os, sys
from envs_fast import cache
port, env_id, user, private = sys.argv[1:]
os.environ[cache.CACHE_ENV_VAR] = user
record = cache.cached_verdict(port, env_id)
os.environ[cache.CACHE_ENV_VAR] = private
if record and record.get("passed"):
    cache.store_verdict(port, env_id, record["levels"], True, record["summary"])
    if port.endswith(".rs"):
        from envs_fast.rust.backend import load_rust
        load_rust(port, env_id)
print(json.dumps(record))
"""


def lookup_verdict(base: Path, cache_dir: Path, env_id: str, backend: str, source: Path | None = None) -> dict | None:
    """The verdict in `source` (default: the user cache) for `backend` (a config's: "rust" is the checkout
    `base`'s Rust translation) as base's envs_fast keys it; a passing one is copied into cache_dir."""
    from orchestrator.usercache import user_cache_dir

    source = source or user_cache_dir()
    proc = subprocess.run([sys.executable, "-c", PREPARE_CACHE, backend_spec(base, env_id, backend), env_id, str(source),
                           str(cache_dir)], cwd=base, env=dict(os.environ, PYTHONPATH=str(base)), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"reading the verdict failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def verified_checkout(work: Path, cache_dir: Path, env_id: str, backends: list[str], verify: bool) -> tuple[Path, str]:
    """A base checkout on which every one of `backends` passes, and how it was found: envs_fast as of the
    newest of its last 10 commits for which the user cache, or `cache_dir` (what an earlier --verify call
    with the same --out stored), holds a passing verdict for each (run setup stores them; a verdict's
    key covers all of envs_fast's source, so one reached before a later commit touched envs_fast applies
    to the earlier content only, which the checkout then holds); else, with verify, HEAD's verified here."""
    from orchestrator.usercache import user_cache_dir

    log = subprocess.run(["git", "log", "--format=%H", "-n", "10", "--", "envs_fast"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    sources = [user_cache_dir()] + ([cache_dir] if cache_dir.is_dir() else [])  # the latter: an earlier --verify
    for commit in log:
        base = base_checkout(work / f"base-{commit[:8]}", commit)
        found = {}
        for backend in backends:
            for source in sources:
                record = lookup_verdict(base, cache_dir, env_id, backend, source)
                if record and record.get("passed"):
                    found[backend] = f"{backend}: verdict from {source}: {record['summary']}"
                    break
        if len(found) == len(backends):
            differs = subprocess.run(["git", "diff", "--stat", commit, "HEAD", "--", "envs_fast", "evaluate.py"],
                                     cwd=REPO, capture_output=True, text=True).stdout.strip()
            return base, (f"envs_fast and evaluate.py as of {commit[:8]}; " + "; ".join(found.values())
                          + (f"\nHEAD differs there in:\n{differs}" if differs else ""))
        shutil.rmtree(base)
    if not verify:
        raise SystemExit(f"no passing verdict in {user_cache_dir()} for {', '.join(backends)} on {env_id} at any of "
                         f"envs_fast's last 10 commits; run setup (`python -m orchestrator run --env {env_id} "
                         f"--max-experiments 0`) or pass --verify")
    base = base_checkout(work / "base-HEAD")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    verdicts = []
    for backend in backends:
        proc = subprocess.run([sys.executable, "-m", "envs_fast.verify", "--env", env_id, "--backend",
                               backend_spec(base, env_id, backend)], cwd=base,
                              env=dict(os.environ, PYTHONPATH=str(base), AUTORL_VERIFY_CACHE=str(cache_dir)),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{backend} failed verification:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
        verdicts.append(f"{backend}: " + proc.stdout.strip().splitlines()[0])
    return base, f"HEAD's ({head}), verified here: " + "; ".join(verdicts)


def base_checkout(root: Path, commit: str = "HEAD") -> Path:
    """COMMIT's evaluate.py and envs_fast/ at `root`."""
    if root.exists():  # a resumed call: extracted afresh
        shutil.rmtree(root)
    root.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit, "evaluate.py", "envs_fast"], cwd=REPO, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive failed: {archive.stderr.decode()}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def checkout(root: Path, base: Path, backend: str, constants: dict[str, str] | None = None,
             end_to_end: bool = True) -> Path:
    """The base checkout with this checkout's candidate/train.py (BACKEND and END_TO_END set in it, and
    each of `constants`, NAME: a Python literal, in place of its value) and the modules it imports."""
    text = (REPO / "candidate" / "train.py").read_text()
    for old, new in (('BACKEND = "auto"', f'BACKEND = "{backend}"'), ("END_TO_END = True", f"END_TO_END = {end_to_end}")):
        if old not in text:
            raise SystemExit(f"candidate/train.py has no line {old!r}")
        text = text.replace(old, new, 1)
    for name, value in (constants or {}).items():
        text, count = re.subn(rf"^{re.escape(name)} = [^#\n]*?(\s*#|$)", lambda m: f"{name} = {value}{m.group(1)}",
                              text, count=1, flags=re.M)
        if not count:
            raise SystemExit(f"candidate/train.py has no constant {name}")
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(base, root, ignore=shutil.ignore_patterns("__pycache__", "target"))
    (root / "candidate").mkdir()
    (root / "candidate" / "train.py").write_text(text)
    for name in TRAIN_COMPANIONS:
        shutil.copy(REPO / name, root / name)
    return root


def rust_translation(root: Path, env_id: str) -> Path:
    from envs_fast import slug

    return root / "envs_fast" / "translations" / f"{slug(env_id)}.rs"


def backend_spec(root: Path, env_id: str, backend: str) -> str:
    """The spec train.py and verify take for a config's backend: "rust" is the checkout's Rust translation."""
    return str(rust_translation(root, env_id)) if backend == "rust" else backend


def train(root: Path, env_id: str, out: Path, budget: float, seed: int, cache_dir: Path) -> dict:
    if out.exists():  # a run stopped midway, or under another identity
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = dict(os.environ, AUTORL_ENV_ID=env_id, AUTORL_TIME_BUDGET=str(budget), AUTORL_SEED=str(seed),
               AUTORL_OUTPUT_DIR=str(out), AUTORL_VERIFY_CACHE=str(cache_dir),
               AUTORL_JAX_CACHE_DIR=str(out / "jax-cache"))  # empty: this run compiles cold
    proc = subprocess.run([sys.executable, str(root / "candidate" / "train.py")], cwd=root, env=env,
                          capture_output=True, text=True)
    (out / "train.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed; see {out / 'train.log'}")
    return summary(proc.stdout)


def kept_run(out: Path, identity: dict) -> dict | None:
    """A finished run's figures from an earlier call, when it ran under the same identity."""
    try:
        record = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return record["row"] if record.get("identity") == identity else None


def score(policy: Path, env_id: str, episodes: int, eval_seed: int) -> dict:
    proc = subprocess.run([sys.executable, "evaluate.py", "--policy", str(policy), "--env", env_id,
                           "--episodes", str(episodes), "--seed", str(eval_seed)], cwd=REPO, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"evaluate.py failed on {policy}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="BipedalWalker-v3")
    parser.add_argument("--budgets", default="90", help="seconds per training run, comma separated")
    parser.add_argument("--repeats", type=int, default=1,
                        help="interleaved rounds over the configs; round r trains with seed --seed + r")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="path:backend, comma separated")
    parser.add_argument("--episodes", type=int, default=10, help="evaluate.py episodes per artifact (0: none)")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--seed", type=int, default=1, help="AUTORL_SEED of the first round's training")
    parser.add_argument("--verify", action="store_true", help="verify the port here when no verdict is cached")
    parser.add_argument("--out", help="keep artifacts and logs here (default: a temp dir)")
    parser.add_argument("--json", help="also write all figures here")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="train every config with this constant of train.py's block changed (repeatable)")
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.set):
        parser.error("--set takes NAME=VALUE, e.g. --set NUM_ENVS=128")
    constants = dict(item.split("=", 1) for item in args.set)

    work = Path(args.out or tempfile.mkdtemp(prefix="autorl-bipedal-training-"))
    cache_dir = work / "verify-cache"
    configs = [c for c in args.configs.split(",") if c]
    verified = sorted({config.split(":")[1] for config in configs} - set(UNVERIFIED))
    if verified:
        base, origin = verified_checkout(work, cache_dir, args.env, verified, args.verify)
        print(f"checkouts: {origin}", flush=True)
    else:
        base = base_checkout(work / "base-HEAD")
        origin = "HEAD's envs_fast and evaluate.py (" + subprocess.run(
            ["git", "log", "-1", "--format=%H", "--", "envs_fast", "evaluate.py"], cwd=REPO, capture_output=True,
            text=True).stdout.strip() + ")"
        print(f"checkouts: {origin}", flush=True)
    roots = {}
    for config in configs:
        path, backend = config.split(":")
        if path not in END_TO_END:
            raise SystemExit(f"--configs {config}: the path is one of {', '.join(END_TO_END)}")
        roots[config] = checkout(work / "checkouts" / config.replace(":", "-"), base, backend, constants,
                                 END_TO_END[path])
    rows = []
    for budget in [float(b) for b in args.budgets.split(",")]:
        runs = {config: [] for config in configs}
        for repeat in range(args.repeats):
            for config in configs:
                out = work / f"{config.replace(':', '-')}-{budget:g}s-{repeat}"
                identity = {"base": re.search(r"\b[0-9a-f]{8,40}\b", origin).group(), "config": config, "budget": budget, "seed": args.seed + repeat,
                            "episodes": args.episodes, "eval_seed": args.eval_seed,
                            "train_py": hashlib.sha256((roots[config] / "candidate" / "train.py").read_bytes()).hexdigest()}
                row = kept_run(out, identity)
                if row is not None:
                    runs[config].append(row)
                    print(f"{config} {budget:g} s, run {repeat + 1}: kept from {out}", flush=True)
                    continue
                stats = train(roots[config], args.env, out, budget, args.seed + repeat, cache_dir)
                path, backend = config.split(":")
                expected = rust_translation(roots[config], args.env).name if backend == "rust" else backend
                if stats.get("path") != path or not stats.get("backend", "").endswith(expected):
                    raise SystemExit(f"{config}: trained on {stats.get('backend')} by the {stats.get('path')} path")
                row = {"env_steps": int(stats["env_steps"]), "sps": float(stats["sps"]),
                       "updates": int(stats["updates"]), "training_seconds": float(stats["training_seconds"]),
                       "wall_seconds": float(stats["wall_seconds"]),
                       "compile_seconds": float(stats.get("compile_seconds", 0.0)),
                       "episode_return": float(stats["episode_return"])}
                if args.episodes:
                    result = score(out / "policy.pt", args.env, args.episodes, args.eval_seed)
                    row["eval_mean"], row["eval_se"] = result["mean"], result["se"]
                runs[config].append(row)
                (out / "result.json").write_text(json.dumps({"identity": identity, "row": row}, indent=1))
                print(f"{config} {budget:g} s, run {repeat + 1}: {row['env_steps']:,} env steps, {row['sps']:,.0f} sps, "
                      f"compile {row['compile_seconds']:.1f} s, {row['updates']} updates, wall {row['wall_seconds']:.1f} s"
                      + (f", eval {row['eval_mean']:.1f} ± {row['eval_se']:.1f}" if args.episodes else ""), flush=True)
        rows.append({"budget": budget, "runs": runs})

    print(f"\n{args.env}")
    print("| budget | path | backend | env steps (median) | sps (median) | compile s (median) | steps vs "
          f"{configs[0]} |" + (f" eval ({args.episodes} ep.) per run |" if args.episodes else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.episodes else ""))
    for row in rows:
        runs = row["runs"]
        baseline = statistics.median(r["env_steps"] for r in runs[configs[0]])
        for config in configs:
            path, backend = config.split(":")
            steps = statistics.median(r["env_steps"] for r in runs[config])
            ratio = f"{steps / baseline:.2f}x" if baseline else "—"
            line = (f"| {row['budget']:g} s | {path} | {backend} | {steps:,.0f} | "
                    f"{statistics.median(r['sps'] for r in runs[config]):,.0f} | "
                    f"{statistics.median(r['compile_seconds'] for r in runs[config]):.1f} | {ratio} |")
            if args.episodes:
                line += " " + ", ".join(f"{r['eval_mean']:.1f}" for r in runs[config]) + " |"
            print(line)
    load = os.getloadavg()
    print(f"\n{args.repeats} interleaved round(s) per budget, seeds {args.seed}..{args.seed + args.repeats - 1}, {os.cpu_count()} cores, load average "
          f"at the end {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; logs in {work}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
