"""The fast paths on one GPU, in one command: raw env steps/s, the jax-e2e PPO, BipedalWalker at 120 s,
and the JAX port's setup verification, written as a table (markdown and JSON) as each figure comes.

    python -m bench.gpu_table OUT_DIR [--deadline 450] [--parts raw,train,verify] [--only ENV,...]  # on the GPU
    python -m bench.gpu_table OUT_DIR --quick                                        # CPU, tiny sizes (CI)
    python -m bench.gpu_table --download-wheels .whl                                 # what to carry there

What it measures (the full plan; --quick swaps in CartPole/Pendulum at 4 and 16 envs):
- raw: a jitted lax.scan of random-action steps (envs_fast.bench.throughput.jax_runner: autoreset and time
  limit included) at 1k, 4k and 16k envs, for the JAX BipedalWalker port, the JAX CartPole and Pendulum
  translations, and mjx HalfCheetah-v5 and Hopper-v5. Compile seconds: building the runner (the jit of
  reset and scan and their first calls), wall and this process's CPU.
- train: candidate/train.py as the daemon runs it (a fresh process, the budget counting imports and
  the compile, an empty compilation cache), each policy scored by evaluate.py on the reference env
  (100 episodes, on the CPU). BipedalWalker-v3 at 120 s on the JAX port with a GPU-sized batch (the
  shipped train.py's 32 envs leave a GPU idle), then CartPole-v1 and Pendulum-v1 at 20 s as shipped.
- verify: setup's verification (L1-L3) of the JAX BipedalWalker port, timed level by level.

Eight minutes on one H100 do not hold the port's L1-L3, fifteen compiles and a 120 s training one after
the other, so they overlap where they cannot disturb a figure. Whoever times on the GPU holds a file lock
(WORK/gpu.lock): a raw runner for its timed seconds, train.py for its whole budget. BipedalWalker trains
first; the raw runners compile beside it at nice 10 (its clock counts its own compile) and time in turn.
The verifications run in the background from the start and are stopped (SIGSTOP) whenever the lock is
held, so every speed figure has the GPU alone and a level's `active` seconds leave the pauses out.
CartPole and Pendulum train on their verdicts from this machine; BipedalWalker trains on a verdict this
script stores: the port's L1-L3 pass on CPU (bench/results/bipedal-jax-l1-l3-57457a6-2026-11-27.txt),
carried to this GPU and said so in its row, with this GPU's own verification reported beside it.

XLA_FLAGS and the other variables of the environment reach every process it starts (an experiment with
XLA's options is `XLA_FLAGS=... python -m bench.gpu_table ...`).

Every figure is printed as one line when it is known, and OUT_DIR/gpu_table.json and .md are rewritten
each time, so a run cut short still leaves what it measured. Nothing starts that cannot end before
--deadline; what is still running then is stopped and reported as far as it got.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from bench.bipedal_training import checkout  # noqa: E402
from bench.gpu_locking import GpuLock, Pausable  # noqa: E402
from bench.gpu_table_report import BIPEDAL, Table  # noqa: E402
from bench.train_paths import summary  # noqa: E402

SIZES = (1024, 4096, 16384)
CPU_VERDICT = "bench/results/bipedal-jax-l1-l3-57457a6-2026-11-27.txt"
# PureJaxRL's shape for a GPU: thousands of envs per rollout, minibatches of a few thousand steps
GPU_BATCH = {"JAX_NUM_ENVS": "2048", "JAX_NUM_STEPS": "64", "JAX_UPDATE_EPOCHS": "4", "JAX_NUM_MINIBATCHES": "32",
             "JAX_LEARNING_RATE": "3e-4"}
# What the GPU machine's image lacks, pinned to this venv's versions by --download-wheels
WHEELS = ("gymnasium", "farama-notifications", "Box2D", "pygame-ce", "mujoco", "mujoco-core", "mujoco-studio", "websockets",
          "glfw", "PyOpenGL", "mujoco-mjx", "trimesh")
# compiles and verifications beside a training: the training's clock counts its own compile
NICE = ("nice", "-n", "10") if shutil.which("nice") else ()
QUIET_JAX = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # several JAX processes share the GPU
             "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


@dataclass
class Raw:
    env_id: str
    spec: str  # a translation file, or "mjx"
    num_envs: int


@dataclass
class Training:
    env_id: str
    budget: float
    constants: dict = field(default_factory=dict)
    verdict: str = "verify"  # "verify": this run's verification first; "carry": the CPU verdict restated


@dataclass
class Verification:
    env_id: str
    spec: str
    feeds_training: bool  # its verdict goes to the training cache


@dataclass
class Plan:
    raw: list
    trainings: list
    verifications: list
    raw_seconds: float
    episodes: int
    parallel: int  # raw runners compiling at once
    scan_steps: int


def translation(env_id: str) -> str:
    from envs_fast import translation_path

    return str(translation_path(env_id))


def make_plan(quick: bool) -> Plan:
    if quick:
        small = ("CartPole-v1", "Pendulum-v1")
        return Plan(raw=[Raw(e, translation(e), n) for e in small for n in (4, 16)],
                    trainings=[Training("CartPole-v1", 25.0), Training("Pendulum-v1", 25.0, {"JAX_NUM_ENVS": "64"}, "carry")],
                    verifications=[Verification(e, translation(e), True) for e in small],
                    raw_seconds=0.3, episodes=5, parallel=2, scan_steps=8)
    raw = [Raw(BIPEDAL, translation(BIPEDAL), n) for n in SIZES]
    raw += [Raw(e, "mjx", n) for e in ("HalfCheetah-v5", "Hopper-v5") for n in SIZES]
    raw += [Raw(e, translation(e), n) for e in ("CartPole-v1", "Pendulum-v1") for n in SIZES]
    return Plan(raw=raw,
                trainings=[Training(BIPEDAL, 120.0, dict(GPU_BATCH), "carry"), Training("CartPole-v1", 20.0),
                           Training("Pendulum-v1", 20.0)],
                verifications=[Verification(e, translation(e), True) for e in ("CartPole-v1", "Pendulum-v1")]
                + [Verification(BIPEDAL, translation(BIPEDAL), False)],
                raw_seconds=2.0, episodes=100, parallel=6, scan_steps=32)


# ---------------------------------------------------------------- the parts
def child_env(**extra) -> dict:
    return {**os.environ, **QUIET_JAX, **{k: str(v) for k, v in extra.items()}}


def raw_worker(job: dict) -> dict:
    """In a process of its own: build one runner (timed), then time it holding the GPU lock."""
    import jax

    from envs_fast.bench.throughput import jax_runner, measure

    started, cpu = time.perf_counter(), time.process_time()
    runner = jax_runner(job["spec"], job["env_id"], job["num_envs"], scan_steps=job["scan_steps"])
    built = {"compile_wall_s": round(time.perf_counter() - started, 1), "compile_cpu_s": round(time.process_time() - cpu, 1)}
    with GpuLock(Path(job["lock"])):
        time.sleep(0.2)  # a paused verifier's kernels in flight drain first
        sps = measure({"raw": runner}, job["seconds"], rounds=2)["raw"]
    return {**built, "sps": round(sps), "device": str(jax.devices()[0].device_kind)}


def run_raw(plan: Plan, table: Table, lock_path: Path, deadline: float, logs: Path) -> None:
    def one(job: Raw) -> None:
        left = deadline - time.time()
        row = asdict(job)
        if left < 20:
            table.add("raw", {**row, "error": "skipped: no time left"}, f"raw {job.env_id} @{job.num_envs}: skipped")
            return
        payload = json.dumps({**row, "lock": str(lock_path), "seconds": plan.raw_seconds, "scan_steps": plan.scan_steps})
        try:
            proc = subprocess.run([*NICE, sys.executable, "-m", "bench.gpu_table", "--raw-worker", payload], cwd=REPO, env=child_env(),
                                  capture_output=True, text=True, timeout=left)
            result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else \
                {"error": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:200]}"}
            if proc.returncode != 0:
                (logs / f"raw-{job.env_id}-{job.num_envs}.log").write_text(proc.stdout + proc.stderr)
        except subprocess.TimeoutExpired:
            result = {"error": f"unfinished at the deadline ({left:.0f} s)"}
        figure = (f"{result['sps']:,} steps/s, compiled in {result['compile_wall_s']} s wall "
                  f"({result['compile_cpu_s']} s CPU) on {result['device']}") if "sps" in result else result["error"]
        table.add("raw", {**row, **result}, f"raw {job.env_id} {Path(job.spec).name} @{job.num_envs}: {figure}")

    with ThreadPoolExecutor(max_workers=plan.parallel) as pool:
        list(pool.map(one, plan.raw))


def training_root(work: Path, job: Training) -> Path:
    base = work / "base"
    if not base.exists():
        base.mkdir(parents=True)
        shutil.copy2(REPO / "evaluate.py", base / "evaluate.py")
        shutil.copytree(REPO / "envs_fast", base / "envs_fast", ignore=shutil.ignore_patterns("__pycache__", "target"))
    name = f"{job.env_id}-{int(job.budget)}s" + ("-" + "-".join(f"{k}{v}" for k, v in job.constants.items()) if job.constants else "")
    return checkout(work / re.sub(r"[^A-Za-z0-9_.-]", "_", name), base, "auto", job.constants)


def carry_verdict(env_id: str, cache_dir: Path) -> str:
    """Store the port's CPU verdict (L1-L3 pass) under this machine's key in the training cache."""
    from envs_fast import cache

    why = f"carried by bench/gpu_table.py: L1-L3 passed on CPU ({CPU_VERDICT}); this GPU's own: the verify rows"
    with cache.reading_from(cache_dir):
        cache.store_verdict(translation(env_id), env_id, [1, 2, 3], True, why)
    return "carried from CPU"


def train_one(job: Training, work: Path, cache_dir: Path, lock_path: Path, deadline: float) -> dict:
    root = training_root(work, job)
    out = work / "runs" / root.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = child_env(AUTORL_ENV_ID=job.env_id, AUTORL_TIME_BUDGET=job.budget, AUTORL_SEED=1, AUTORL_OUTPUT_DIR=out,
                    AUTORL_VERIFY_CACHE=cache_dir, AUTORL_JAX_CACHE_DIR=out / "jax-cache")  # compiles cold, as a night
    with GpuLock(lock_path):
        try:
            proc = subprocess.run([sys.executable, str(root / "candidate" / "train.py")], cwd=root, env=env,
                                  capture_output=True, text=True, timeout=max(1.0, min(job.budget + 60, deadline - time.time())))
        except subprocess.TimeoutExpired:
            return {"error": "train.py did not end before the deadline"}
    (out / "train.log").write_text(proc.stdout + proc.stderr)
    figures = summary(proc.stdout)
    if proc.returncode != 0 or "env_steps" not in figures:
        return {"error": f"train.py exit {proc.returncode}: {(proc.stdout + proc.stderr).strip().splitlines()[-1][:200]}"}
    keep = ("path", "backend", "device", "sps", "compile_seconds", "updates", "training_seconds", "wall_seconds")
    return {"env_steps": int(figures["env_steps"]), **{k: figures[k] for k in keep if k in figures},
            "policy": str(out / "policy.pt")}


def score(row: dict, env_id: str, episodes: int, deadline: float) -> dict:
    """evaluate.py on the reference env, on the CPU (the GPU stays with whoever times)."""
    result_file = Path(row["policy"]).with_name("eval.json")
    workers = max(1, min(8, (os.cpu_count() or 2) // 2))
    try:
        proc = subprocess.run([sys.executable, "evaluate.py", "--policy", row["policy"], "--env", env_id, "--episodes",
                               str(episodes), "--seed", "12345", "--out", str(result_file), "--workers", str(workers)],
                              cwd=REPO, env=child_env(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu"), capture_output=True,
                              text=True, timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        return {"eval_error": "evaluation unfinished at the deadline"}
    if proc.returncode != 0:
        return {"eval_error": f"evaluate.py exit {proc.returncode}: {proc.stderr.strip()[-200:]}"}
    result = json.loads(result_file.read_text())
    return {"eval_mean": round(result["mean"], 2), "eval_se": round(result["se"], 2), "eval_episodes": result["episodes"]}


VERIFY_LINE = re.compile(r"^verify: (L\d) \w+: (\w+)(?: in (\d+) s)?")


def start_verification(job: Verification, cache_dir: Path, table: Table, pauser: Pausable, logs: Path) -> threading.Thread:
    """envs_fast.verify in the background, paused while the GPU lock is held; a row per level. Its report
    goes to LOGS/verify-<env>.txt, its progress and errors to verify-<env>.log."""
    report = open(logs / f"verify-{job.env_id}.txt", "w")
    proc = subprocess.Popen([*NICE, sys.executable, "-m", "envs_fast.verify", "--env", job.env_id, "--backend", job.spec,
                             "--levels", "1,2,3"], cwd=REPO, env=child_env(AUTORL_VERIFY_CACHE=cache_dir),
                            stdout=report, stderr=subprocess.PIPE, text=True, start_new_session=True)
    report.close()
    pauser.add(proc)

    def follow():
        level_started = time.time()
        progress = open(logs / f"verify-{job.env_id}.log", "w")
        for line in proc.stderr:
            progress.write(line)
            progress.flush()
            match = VERIFY_LINE.match(line.strip())
            if not match:
                continue
            level, result, wall = match.groups()
            if result == "started":
                level_started = time.time()
                continue
            active = time.time() - level_started - pauser.paused_between(proc, level_started, time.time())
            table.add("verification", {"env_id": job.env_id, "spec": job.spec, "level": level, "result": result,
                                       "wall_s": int(wall or 0), "active_s": round(active)},
                      f"verify {job.env_id} {level}: {result} in {active:.0f} s active ({wall} s wall)")
        proc.wait()
        progress.close()
        pauser.remove(proc)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    thread.process, thread.started = proc, time.time()
    return thread


def stop(thread: threading.Thread, table: Table, job: Verification, pauser: Pausable) -> None:
    proc = thread.process
    if proc.poll() is None:
        wall = time.time() - thread.started
        active = wall - pauser.paused_between(proc, thread.started, time.time())
        pauser.remove(proc)
        os.killpg(proc.pid, signal.SIGKILL)
        table.add("verification", {"env_id": job.env_id, "spec": job.spec, "level": "rest", "result": "unfinished",
                                   "wall_s": round(wall), "active_s": round(active)},
                  f"verify {job.env_id}: stopped at the deadline after {active:.0f} s active ({wall:.0f} s wall)")
    thread.join(timeout=10)


def train_all(plan: Plan, table: Table, work: Path, lock_path: Path, deadline: float, verifying: dict) -> None:
    """The trainings in order, each holding the GPU lock; each policy scored on the CPU meanwhile."""
    train_cache = work / "train-cache"
    with ThreadPoolExecutor(max_workers=2) as scoring:
        evaluations = []
        for job in plan.trainings:
            row = {"env_id": job.env_id, "budget": job.budget, "constants": job.constants}
            if job.verdict == "carry":
                row["verdict"] = carry_verdict(job.env_id, train_cache)
            else:
                _, thread = verifying[job.env_id]
                thread.join(timeout=max(0.0, deadline - time.time() - job.budget - 40))
                row["verdict"] = "verified here" if thread.process.poll() == 0 else "not verified here: trains on the reference"
            if job.budget + 40 > deadline - time.time():
                table.add("training", {**row, "error": "skipped: not enough time left"}, f"train {job.env_id}: skipped")
                continue
            row.update(train_one(job, work, train_cache, lock_path, deadline))
            figure = (f"{row['env_steps']:,} env steps on {row.get('path')} ({row.get('sps')} sps, "
                      f"compile {row.get('compile_seconds')} s)") if "env_steps" in row else row["error"]
            table.add("training", row, f"train {job.env_id} {job.budget:g} s: {figure}")
            if "policy" in row:
                evaluations.append((row, scoring.submit(score, row, job.env_id, plan.episodes, deadline)))
        for row, future in evaluations:
            row.update(future.result())
            if "eval_mean" in row:
                table.note(f"eval {row['env_id']} {row['budget']:g} s: {row['eval_mean']} ± {row['eval_se']} over "
                           f"{row['eval_episodes']} episodes")
            else:
                table.note(f"eval {row['env_id']}: {row['eval_error']}")


def run(plan: Plan, out: Path, work: Path, deadline_s: float, parts: set[str]) -> int:
    """BipedalWalker trains first (the figure that needs the longest stretch of GPU) while the raw
    runners compile beside it, niced; they and the trainings then take turns on the GPU lock, and the
    verifications use the GPU whenever nobody times."""
    out.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    table = Table(out, plan, deadline_s)
    deadline = table.started + deadline_s
    lock_path = work / "gpu.lock"
    pauser = Pausable(lock_path)
    verifying = {}
    for job in plan.verifications:
        if ("train" if job.feeds_training else "verify") in parts:
            cache_dir = work / ("train-cache" if job.feeds_training else "verify-cache")
            verifying[job.env_id if job.feeds_training else job.env_id + " (timed)"] = (
                job, start_verification(job, cache_dir, table, pauser, work / "logs"))
    training = threading.Thread(target=train_all, args=(plan, table, work, lock_path, deadline, verifying))
    if "train" in parts:
        training.start()
    if "raw" in parts:
        time.sleep(2.0)  # the first training takes the lock before any runner can time
        run_raw(plan, table, lock_path, deadline, work / "logs")
    if "train" in parts:
        training.join()
    for job, thread in verifying.values():
        thread.join(timeout=max(0.0, deadline - time.time()))
        stop(thread, table, job, pauser)
    pauser.close()
    table.finish()
    print(f"table: {out / 'gpu_table.md'}", flush=True)
    return 0


def download_wheels(folder: Path) -> int:
    """pip download of WHEELS at this venv's versions, for the GPU machine's Python 3.12 (x86-64)."""
    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    platforms = [arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                 "manylinux2014_x86_64", "manylinux1_x86_64") for arg in ("--platform", tag)]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *platforms, "-d", str(folder), *pins]
    print(" ".join(command), flush=True)
    return subprocess.run(command).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, help="folder for gpu_table.md / .json and the runs")
    parser.add_argument("--quick", action="store_true", help="CPU-sized: CartPole/Pendulum at 4 and 16 envs (CI)")
    parser.add_argument("--deadline", type=float, help="seconds the whole table may take (default 450, --quick 300)")
    parser.add_argument("--work", type=Path, help="runs, caches and logs (default OUT_DIR/work)")
    parser.add_argument("--parts", default="raw,train,verify", help="which parts to run (a rerun of one part)")
    parser.add_argument("--sizes", help="comma-separated env counts for the raw rows instead of the plan's")
    parser.add_argument("--scan-steps", type=int, help="steps per timed call of a raw row (default 32, --quick 8)")
    parser.add_argument("--only", help="comma-separated env ids: the plan's rows of these envs alone (a rerun)")
    parser.add_argument("--download-wheels", type=Path, metavar="DIR", help="fetch the wheels to carry, then stop")
    parser.add_argument("--raw-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raw_worker:
        print(json.dumps(raw_worker(json.loads(args.raw_worker))), flush=True)
        return 0
    if args.download_wheels:
        return download_wheels(args.download_wheels)
    if args.out is None:
        parser.error("OUT_DIR is required")
    parts = set(args.parts.split(","))
    if parts - {"raw", "train", "verify"}:
        parser.error(f"--parts takes raw, train and verify, not {args.parts!r}")
    plan = make_plan(args.quick)
    if args.sizes:
        sizes = [int(n) for n in args.sizes.split(",")]
        plan.raw = [Raw(e, spec, n) for e, spec in dict.fromkeys((job.env_id, job.spec) for job in plan.raw) for n in sizes]
    if args.scan_steps:
        plan.scan_steps = args.scan_steps
    if args.only:
        keep = set(args.only.split(","))
        for name in ("raw", "trainings", "verifications"):
            setattr(plan, name, [job for job in getattr(plan, name) if job.env_id in keep])
    return run(plan, args.out, args.work or args.out / "work",
               args.deadline or (300.0 if args.quick else 450.0), parts)


if __name__ == "__main__":
    raise SystemExit(main())
