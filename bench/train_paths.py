"""candidate/train.py's two paths side by side: jax-host (envpool stepped from the host, what trains
without a verified translation) and jax-e2e (a verified JAX translation trained end to end under jit),
per env and budget.

    python -m bench.train_paths [--envs CartPole-v1,Acrobot-v1,Pendulum-v1] [--budgets 10,30] [--seed 1]
                                [--episodes 100] [--eval-seed 12345] [--bipedal [SECONDS]] [--json FILE]

For each env: its shipped translation envs_fast/translations/<slug>.py is verified (L1-L3) into a private verdict
cache, as run setup does. candidate/train.py then runs unmodified, as the daemon runs it: with an
empty verdict cache `backend="auto"` resolves to envpool (the jax-host path), with the verified one to
the translation (the jax-e2e path). Each artifact is scored by evaluate.py (the harness) over
--episodes episodes. Figures per row: env steps trained (compile time counts against the budget on
the jax-e2e path), eval mean ± standard error, the steps ratio, compile seconds, and the env's share
of the jax-e2e path's training time.

The env share is profiled, not guessed: in a fresh process, train.py's own `train_end_to_end` is
built for the env, its compiled update run past warm-up, and the time of one update (rollout + GAE +
PPO epochs) compared with the time of the same env steps alone (each the fastest of 30 interleaved
repeats, so that other load on the machine does not skew the ratio): a jitted lax.scan of
JAX_NUM_STEPS calls of the same `env_step` over JAX_NUM_ENVS envs (autoreset and time limit included),
random actions instead of the policy, from the training's own env states.

--bipedal adds BipedalWalker-v3 (no JAX translation ships: a host backend, trained on the jax-host path;
bench/bipedal_training.py compares its backends), 720 s by default.

    python -m bench.train_paths --against COMMIT [--envs Pendulum-v1] [--budgets 10] [--repeats 3]

--against compares the jax-host path instead: candidate/train.py as it is against COMMIT's, both in a
checkout with this evaluate.py and envs_fast/ (so only train.py differs), on the jax-host path (an empty
verdict cache), runs interleaved so that both see the same machine load. Figures: each run's sps
(env steps per second of its training loop: train.py's own `sps:`) and env steps, the median sps of
each side over its runs that trained (the budget counts startup: on a loaded machine a run may not
get to train) and their ratio.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "candidate" / "train.py"
DEFAULT_ENVS = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1")


def summary(stdout: str) -> dict:
    if "\n---\n" not in stdout:
        return {}
    tail = stdout.rsplit("\n---\n", 1)[1]
    return dict(line.split(": ", 1) for line in tail.strip().splitlines() if ": " in line)


def verify(env_id: str, cache_dir: Path) -> None:
    from envs_fast import translation_path

    env = dict(os.environ, AUTORL_VERIFY_CACHE=str(cache_dir))
    proc = subprocess.run([sys.executable, "-m", "envs_fast.verify", "--env", env_id, "--backend",
                           str(translation_path(env_id)), "--levels", "1,2,3"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"verification of the {env_id} translation failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def train_once(env_id: str, budget: float, cache_dir: Path, out: Path, seed: int, root: Path = REPO) -> dict:
    """root/candidate/train.py run as the daemon runs it; its summary (the log goes to out/train.log)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, AUTORL_ENV_ID=env_id, AUTORL_TIME_BUDGET=str(budget), AUTORL_SEED=str(seed),
               AUTORL_OUTPUT_DIR=str(out), AUTORL_VERIFY_CACHE=str(cache_dir))
    with open(out / "train.log", "w") as log:
        proc = subprocess.run([sys.executable, str(root / "candidate" / "train.py")], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=log, text=True)
    (out / "train.log").open("a").write(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed on {env_id}; see {out / 'train.log'}")
    return summary(proc.stdout)


def train_and_score(env_id: str, budget: float, cache_dir: Path, out: Path, args) -> dict:
    stats = train_once(env_id, budget, cache_dir, out, args.seed)
    evaluation = subprocess.run(
        [sys.executable, "evaluate.py", "--policy", str(out / "policy.pt"), "--env", env_id,
         "--episodes", str(args.episodes), "--seed", str(args.eval_seed)], cwd=REPO, capture_output=True, text=True)
    if evaluation.returncode != 0:
        raise SystemExit(f"evaluate.py failed on {out / 'policy.pt'}: {evaluation.stderr.strip()}")
    result = json.loads(evaluation.stdout.strip().splitlines()[-1])
    return {"path": stats.get("path"), "backend": stats.get("backend"), "env_steps": int(stats["env_steps"]),
            "sps": float(stats["sps"]), "training_seconds": float(stats["training_seconds"]),
            "compile_seconds": float(stats["compile_seconds"]) if "compile_seconds" in stats else None,
            "eval_mean": result["mean"], "eval_se": result["se"]}


def profile(env_id: str, cache_dir: Path) -> dict:
    env = dict(os.environ, AUTORL_ENV_ID=env_id, AUTORL_VERIFY_CACHE=str(cache_dir))
    proc = subprocess.run([sys.executable, "-m", "bench.train_paths", "--profile-env", env_id], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"profiling {env_id} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile_in_this_process(env_id: str, warmup: int = 30, repeats: int = 30) -> dict:
    """Time of one jax-e2e update vs the same env steps alone (see the module docstring)."""
    import importlib.util

    import jax
    import jax.numpy as jnp
    import numpy as np

    from envs_fast.bench.throughput import random_actions
    from envs_fast.backends.jax_vector import derive_keys

    spec_ = importlib.util.spec_from_file_location("candidate_train", TRAIN)
    train = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(train)  # AUTORL_ENV_ID is set: train.ENV_ID is env_id
    spec, _ = train.plumbing.choose_backend(train.BACKEND, env_id, train.NUM_ENVS)
    if not train.plumbing.is_jax_functional(spec):
        raise SystemExit(f"{env_id}: backend {spec} is not a JAX backend (is its translation verified?)")
    problem = train.Problem(env_id)
    training = train.train_end_to_end(spec, problem, train.init_params(problem, np.random.default_rng(1)))
    N, T = train.JAX_NUM_ENVS, train.JAX_NUM_STEPS
    sample = random_actions(problem.act_space)

    def update(state, *_):
        return training.iterate(state, 0.0)
    lr = ent = None

    @jax.jit
    def env_alone(env_state, elapsed, needs_reset, keys, round_):
        def body(carry, step):
            env_state, elapsed, needs_reset = carry
            _, env_state, reward, _, elapsed, needs_reset = training.env_step(
                keys[step], env_state, elapsed, needs_reset, sample(round_, step, N))
            return (env_state, elapsed, needs_reset), reward.sum()

        return jax.lax.scan(body, (env_state, elapsed, needs_reset), jnp.arange(T, dtype=jnp.uint32))

    state = training.state
    for _ in range(warmup):  # past the first, short episodes: realistic env states and reset rates
        state, metrics = update(state, lr, ent)
    jax.block_until_ready(metrics)
    env_args = (state["envs"]["env"], state["envs"]["elapsed"], state["envs"]["needs_reset"])
    jax.block_until_ready(env_alone(*env_args, derive_keys(jnp.zeros(2, jnp.uint32), T), jnp.uint32(0)))
    update_times, env_times = [], []
    for round_ in range(repeats):  # interleaved, so both see the same machine load
        started = time.perf_counter()
        state, metrics = update(state, lr, ent)
        jax.block_until_ready(metrics)
        update_times.append(time.perf_counter() - started)
        keys = derive_keys(jnp.array([round_, 7], jnp.uint32), T)
        started = time.perf_counter()
        jax.block_until_ready(env_alone(*env_args, keys, jnp.uint32(round_)))
        env_times.append(time.perf_counter() - started)
    # the fastest of each: what an uncontended machine gives (a shared machine only adds noise)
    update_s, env_s = float(np.min(update_times)), float(np.min(env_times))
    return {"env_id": env_id, "num_envs": N, "num_steps": T, "update_ms": update_s * 1e3, "env_ms": env_s * 1e3,
            "env_share": env_s / update_s, "update_sps": N * T / update_s}


def fmt_steps(n) -> str:
    return "—" if n is None else f"{n:,}"


def fmt_score(row) -> str:
    return "—" if row is None else f"{row['eval_mean']:.1f} ± {row['eval_se']:.1f}"


def table(rows: list[dict], episodes: int) -> str:
    head = (f"| env | budget | host steps | host eval ({episodes} ep.) | jax-e2e steps | jax-e2e eval | steps ratio "
            f"| compile s | env share |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        host, e2e, prof = r["host"], r.get("e2e"), r.get("profile")
        ratio = f"{e2e['env_steps'] / host['env_steps']:.1f}x" if e2e else "—"
        lines.append(f"| {r['env_id']} | {r['budget']:g} s | {fmt_steps(host['env_steps'])} | {fmt_score(host)} "
                     f"| {fmt_steps(e2e and e2e['env_steps'])} | {fmt_score(e2e)} | {ratio} "
                     f"| {e2e['compile_seconds']:.1f} | {prof['env_share']:.1%} |" if e2e else
                     f"| {r['env_id']} | {r['budget']:g} s | {fmt_steps(host['env_steps'])} | {fmt_score(host)} "
                     f"| — | — | — | — | — |")
    return "\n".join(lines)


def checkout_with_train_py_of(commit: str, root: Path) -> Path:
    """A checkout at `root` with this evaluate.py and envs_fast/ and COMMIT's candidate/train.py."""
    text = subprocess.run(["git", "show", f"{commit}:candidate/train.py"], cwd=REPO, capture_output=True, text=True)
    if text.returncode != 0:
        raise SystemExit(f"no candidate/train.py at {commit}: {text.stderr.strip()}")
    (root / "candidate").mkdir(parents=True)
    shutil.copy(REPO / "evaluate.py", root / "evaluate.py")
    shutil.copytree(REPO / "envs_fast", root / "envs_fast", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "candidate" / "train.py").write_text(text.stdout)
    return root


def host_against(commit: str, envs: list[str], budgets: list[float], repeats: int, seed: int, work: Path) -> list[dict]:
    """This train.py's jax-host path against COMMIT's host-stepped path, interleaved (see the module docstring)."""
    sides = {"this": REPO, commit: checkout_with_train_py_of(commit, work / "against")}
    rows = []
    for env_id in envs:
        for budget in budgets:
            runs = {side: [] for side in sides}
            for repeat in range(repeats):
                for side, root in sides.items():
                    out = work / f"{env_id}-{budget:g}s-{side}-{repeat}"
                    stats = train_once(env_id, budget, work / "cache-empty", out, seed, root=root)
                    if stats.get("path", "host") not in ("host", "jax-host"):  # an older train.py: "host"
                        raise SystemExit(f"{side}: {env_id} was not stepped from the host ({stats.get('path')})")
                    runs[side].append({"sps": float(stats["sps"]), "env_steps": int(stats["env_steps"]),
                                       "updates": int(stats["updates"])})
                    print(f"{env_id} {budget:g} s, {side} run {repeat + 1}: {stats['sps']} sps, "
                          f"{stats['env_steps']} env steps", flush=True)
            # a run whose startup took the whole budget (a loaded machine) trained nothing: no figure
            trained = {side: [r["sps"] for r in runs[side] if r["updates"] > 0] for side in sides}
            if not all(trained.values()):
                raise SystemExit(f"{env_id} {budget:g} s: a side never trained (startup took the budget); "
                                 f"try a larger --budgets")
            median = {side: statistics.median(trained[side]) for side in sides}
            rows.append({"env_id": env_id, "budget": budget, "runs": runs, "median_sps": median,
                         "ratio": median["this"] / median[commit]})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(DEFAULT_ENVS))
    parser.add_argument("--budgets", default="10,30", help="training seconds, comma separated")
    parser.add_argument("--seed", type=int, default=1, help="AUTORL_SEED for training")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--bipedal", nargs="?", type=float, const=720.0, default=None, metavar="SECONDS",
                        help="also BipedalWalker-v3, on a host backend (default budget 720 s)")
    parser.add_argument("--out", help="keep artifacts and logs here (default: a temp dir)")
    parser.add_argument("--json", help="also write all figures here")
    parser.add_argument("--against", metavar="COMMIT",
                        help="compare the host path's sps with COMMIT's train.py instead (default envs: Pendulum-v1)")
    parser.add_argument("--repeats", type=int, default=3, help="with --against: interleaved runs per side")
    parser.add_argument("--profile-env", help=argparse.SUPPRESS)  # internal: the env share, in a fresh process
    args = parser.parse_args(argv)
    if args.profile_env:
        print(json.dumps(profile_in_this_process(args.profile_env)))
        return 0

    work = Path(args.out or tempfile.mkdtemp(prefix="autorl-train-paths-"))
    if args.against:
        envs = args.envs.split(",") if args.envs != ",".join(DEFAULT_ENVS) else ["Pendulum-v1"]
        rows = host_against(args.against, envs, [float(b) for b in args.budgets.split(",")], args.repeats,
                            args.seed, work)
        print(f"\n| env | budget | this train.py: median sps | {args.against}: median sps | ratio |\n|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['env_id']} | {r['budget']:g} s | {r['median_sps']['this']:,.0f} | "
                  f"{r['median_sps'][args.against]:,.0f} | {r['ratio']:.2f}x |")
        print(f"\n{args.repeats} interleaved runs per side, host path, seed {args.seed}; logs in {work}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        return 0
    unverified, verified = work / "cache-empty", work / "cache-verified"
    budgets = [float(b) for b in args.budgets.split(",")]
    rows = []
    for env_id in [e for e in args.envs.split(",") if e]:
        print(f"{env_id}: verifying the translation ...", flush=True)
        verify(env_id, verified)
        prof = profile(env_id, verified)
        print(f"{env_id}: env share {prof['env_share']:.1%} (update {prof['update_ms']:.2f} ms, "
              f"env alone {prof['env_ms']:.2f} ms for {prof['num_envs']}x{prof['num_steps']} steps)", flush=True)
        for budget in budgets:
            tag = f"{env_id}-{budget:g}s"
            host = train_and_score(env_id, budget, unverified, work / f"{tag}-host", args)
            e2e = train_and_score(env_id, budget, verified, work / f"{tag}-e2e", args)
            assert host["path"] == "jax-host" and e2e["path"] == "jax-e2e", (host["path"], e2e["path"])
            rows.append({"env_id": env_id, "budget": budget, "host": host, "e2e": e2e, "profile": prof})
            print(f"{tag}: host {host['env_steps']:,} steps, eval {host['eval_mean']:.1f}; jax-e2e "
                  f"{e2e['env_steps']:,} steps (compile {e2e['compile_seconds']:.1f} s), eval {e2e['eval_mean']:.1f}",
                  flush=True)
    if args.bipedal:
        host = train_and_score("BipedalWalker-v3", args.bipedal, unverified, work / "BipedalWalker-v3-host", args)
        rows.append({"env_id": "BipedalWalker-v3", "budget": args.bipedal, "host": host})
    print()
    print(table(rows, args.episodes))
    print(f"\nseed {args.seed}, eval seed {args.eval_seed}; artifacts and logs in {work}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
