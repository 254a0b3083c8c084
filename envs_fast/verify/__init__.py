"""Hierarchical verification of a fast backend against its gymnasium reference.

    python -m envs_fast.verify --env ENV_ID --backend SPEC [--levels 1,2,3,4] [--json FILE]

SPEC: a translation file path (.py for JAX, .rs for Rust), "jax"/"translation" (envs_fast/translations/<slug>.py),
"rust" (envs_fast/translations/<slug>.rs), "mujoco_batch" (MuJoCo v5 envs on mujoco.batch), "mjx" (the same envs on
MJX, functional JAX), "envpool", "gymnax" or
"reference". Exit 0 when every requested level
passes, 1 when one fails (a Rust translation that does not build fails L1 "builds"), 2 for bad input
(including "protocol incomplete": a translation that cannot sync state, JAX or Rust, is refused).

One module per level, each `run(ctx) -> LevelReport` over a `Context` built once per call:
L1 `properties` (spaces, dtypes, shapes, bounds, reset distribution, determinism under a key/seed);
L2 `interactions` (one step from a synced state, compared field by field, over thousands of states
from real rollouts plus states found near every termination and clipping boundary);
L3 `rollouts` (whole action sequences from a synced start; for stochastic envs, or without state
sync (third-party backends only, reported as "statistical only"), return distributions under a fixed
policy compared by TOST);
L4 `transfer` (a linear policy trained by the cross-entropy method on the backend scores
equivalently on the reference, by TOST; a translation declaring TRANSFER_PPO: PPO trained on it for
the declared env steps scores on the reference within a margin of PPO trained there, `ppo_transfer`).
The backend is driven only through `protocol.BatchedBackend` (JAX: `jax_batched.JaxBatched`).
A translation may declare what its verification should look at (`declarations.py`: policies to
gather L2 states under and roll out in L3, kinds of state L2 must cover, whether it is chaotic,
episode outcomes): a chaotic scene's synced L3 trajectories are compared up to each one's measured
predictable horizon, then its episode return, length and outcome rates by TOST; with a state sync,
L1 also compares the reset state's distribution per writable field. A float32 backend whose reference
computes in float64 (mjx over C MuJoCo) has a float64 twin (`jax_batched.Float64Twin`): L2 and L3 hold
the twin to the tolerances (the algorithm) and report the float32 backend's departure from it (rounding);
L1 and L4 run the float32 backend itself.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

from envs_fast import cache
from envs_fast.protocol import BackendError, BuildError, resolve_spec
from envs_fast.verify.report import LEVEL_TITLES, PROGRESS_PREFIX, LevelReport, Report
from envs_fast.verify import interactions, properties, rollouts, transfer
from envs_fast.verify.context import Context, Settings, SyncStatus

__all__ = ["verify", "Settings", "main", "build_parser", "Context", "SyncStatus", "LEVELS"]

LEVELS = {1: properties.run, 2: interactions.run, 3: rollouts.run, 4: transfer.run}


def verify(env_id: str, spec: str, levels=(1, 2, 3), settings: Settings | None = None, root=None,
           use_cache: bool = True, progress: Callable[[str], None] | None = None) -> Report:
    """Verify backend SPEC for `env_id` at the given levels and return the report.

    Raises BackendError for bad input (unknown env id, file that does not import, protocol function
    missing). A translation that does not build (BuildError) is a failed report: L1 check "builds"
    with the compiler's message. A passing verdict over at least L1-L3 is cached for
    `envs_fast.choose_backend`. `progress` is told when each level starts and ends (a physics port's
    L1-L3 take an hour on CPU; the CLI prints these lines to stderr).
    """
    progress = progress or (lambda line: None)
    settings = settings or Settings()
    levels = sorted(set(int(level) for level in levels))
    unknown = [level for level in levels if level not in LEVELS]
    if unknown or not levels:
        raise BackendError(f"levels must be among 1,2,3,4; got {levels}")
    started = time.perf_counter()
    report = Report(env_id, resolve_spec(spec, env_id, root))
    try:
        ctx = Context.open(env_id, spec, settings, root)
    except BuildError as exc:
        ctx = None
        failed = LevelReport(1)
        failed.add("builds", False, str(exc))
        report.levels.append(failed)
    if ctx is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                for level in levels:
                    if level == 4 and use_cache and {1, 2, 3} <= set(levels) and report.passed:
                        # L4 may train on the backend, which training accepts only with a passing verdict
                        cache.store_verdict(report.backend, env_id, [1, 2, 3], True,
                                            report.to_text().splitlines()[0])
                    if level == 4 and report.levels:  # the levels so far, before L4's hours of training
                        for line in report.to_text().splitlines():
                            progress(f"before L4: {line}")
                    level_started = time.perf_counter()
                    progress(f"{LEVEL_TITLES[level]}: started")
                    report.levels.append(LEVELS[level](ctx))
                    done = report.levels[-1]
                    progress(f"{LEVEL_TITLES[level]}: {done.status} in {time.perf_counter() - level_started:.0f} s "
                             f"({done.figures()})")
        finally:
            ctx.close()
    report.seconds = time.perf_counter() - started
    if use_cache and {1, 2, 3} <= set(levels):
        cache.store_verdict(report.backend, env_id, levels, report.passed, report.verdict_line())
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verify", description="Verify a fast backend against its gymnasium reference.")
    parser.add_argument("--env", required=True, help="gymnasium env id, e.g. CartPole-v1")
    parser.add_argument("--backend", required=True,
                        help="translation file path (.py or .rs), jax/translation (envs_fast/translations/<slug>.py), "
                             "rust (envs_fast/translations/<slug>.rs), mujoco_batch, mjx, envpool, gymnax or reference")
    parser.add_argument("--levels", default="1,2,3", help="comma-separated levels among 1,2,3,4 (default 1,2,3)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=Settings.episodes, help="episodes per side for statistical checks")
    parser.add_argument("--horizon", type=int, default=Settings.horizon, help="steps per episode for statistical checks")
    parser.add_argument("--l4-env-steps", type=int, help="L4 of a translation declaring TRANSFER_PPO: env steps per "
                        "training run instead of the declared ones (a quicker, weaker check)")
    parser.add_argument("--l4-seeds", type=int, help="L4 of a translation declaring TRANSFER_PPO: seeds per side")
    parser.add_argument("--l4-dir", help="L4 of a translation declaring TRANSFER_PPO: keep each training run here; "
                        "a run already finished there is not trained again, and one stopped midway goes on from "
                        "its checkpoint (resumes a stopped check)")
    parser.add_argument("--l4-jobs", type=int, default=1, help="L4 of a translation declaring TRANSFER_PPO: training "
                        "runs side by side (default 1; 2 on 2 cores trains the JAX BipedalWalker port's two ~1.5-3 h "
                        "runs ~1.6x as fast as one after the other)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    try:
        levels = [int(part) for part in args.levels.split(",") if part.strip()]
    except ValueError:
        print(f"error: --levels must be comma-separated integers, got {args.levels!r}", file=sys.stderr)
        return 2
    settings = Settings(seed=args.seed, episodes=args.episodes, horizon=args.horizon,
                        extra={"l4_env_steps": args.l4_env_steps, "l4_seeds": args.l4_seeds, "l4_dir": args.l4_dir,
                               "l4_jobs": args.l4_jobs})
    try:
        report = verify(args.env, args.backend, levels, settings,
                        progress=lambda line: print(PROGRESS_PREFIX + line, file=sys.stderr, flush=True))
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(report.to_text(), flush=True)
    except BrokenPipeError:  # e.g. piped into `head`; the exit code still tells the verdict
        sys.stdout = None
    if args.json:
        Path(args.json).write_text(report.to_json())
    return 0 if report.passed else 1
