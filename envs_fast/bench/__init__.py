"""Throughput of a backend against its gymnasium reference, measured in the same run.

    python -m envs_fast.bench --env ENV_ID --backend SPEC [--num-envs N] [--seconds S] [--json FILE]

Figures (steps per second; measured in interleaved rounds so that all see the same machine load):
  backend_sps        the backend itself: for JAX backends a jitted lax.scan rollout of random actions
                     over num_envs envs with auto-reset and time limit (no host round trips); for Rust
                     backends `autorl_step` called in a loop over num_envs envs (auto-reset through the
                     resets array, actions drawn beforehand); envpool and mujoco_batch: their vector env
                     at num_envs
  reference_sps      one gymnasium env (gym.make), stepped in Python
  reference_vec_sps  gymnasium's own vector env (gym.make_vec) at the adapter's num_envs
  adapter_sps        the backend through the gymnasium VectorEnv adapter at the num_envs a train.py
                     uses (its NUM_ENVS), actions sampled on the host as a PPO would send them
  e2e_sps            JAX backends only, when candidate/train.py trains them end to end (its block has
                     JAX_NUM_ENVS): the rollout half of that path as train.py runs it, a jitted
                     lax.scan of JAX_NUM_STEPS steps over JAX_NUM_ENVS envs, each step an MLP policy
                     (two tanh layers of HIDDEN_SIZE, random weights) sampling the actions from the
                     observations, then the backend's step with auto-reset and time limit. The PPO
                     update is left out: it costs the same whatever the backend. None otherwise.
  host_sps           backends train.py steps from a Python loop (envpool, reference, mujoco_batch, a
                     Rust translation, or a JAX one with END_TO_END = False), as its jax-host path does
                     (train_path below): the adapter at NUM_ENVS (x JAX_HOST_ENVS_FACTOR from a budget
                     of JAX_HOST_BIG_BATCH_BUDGET, the budget being AUTORL_TIME_BUDGET, default 720 s),
                     each step's actions from a compiled JAX MLP policy. Like e2e_sps, the PPO update is
                     left out. None otherwise.
  train_sps          the figure that says how fast training will go on this backend: e2e_sps where
                     train.py trains the backend end to end, host_sps where it steps it from a Python
                     loop. Both include the policy, so a host backend is not ranked above an
                     end-to-end one for stepping faster without one.
                     The translate phase compares this one, and it is the figure cached for `auto`
                     (envs_fast.choose_backend ranks verified backends by it).
  ratio              backend_sps / reference_sps

`--figures train` measures only train_sps and reference_sps (the others are null): what ranking
verified backends needs, at a fraction of the cost. With several `--backend`s it measures their
train_sps side by side in one process, against one reference (the daemon's setup).

train.py's constants are read from its hyperparameter block as text: no candidate code is imported.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from pathlib import Path

import gymnasium as gym

from envs_fast import cache
from envs_fast.protocol import BackendError, check_env_id, is_rust_spec, resolve_spec
from envs_fast.bench.throughput import (e2e_runner, jax_host_runner, jax_runner, measure, reference_runner,
                                  rust_runner, vector_runner)

DEFAULT_NUM_ENVS = 65536  # JAX backends: large batches amortise the per-step dispatch
# Rust backends: one C call steps them all, whose overhead 1024 envs amortise (CartPole: ~20 us of
# stepping per call); 65536 BipedalWalker envs took 70 s per timed call, 5.5 min per bench.
DEFAULT_RUST_NUM_ENVS = 1024
DEFAULT_VECTOR_NUM_ENVS = 64  # envpool/reference: one process, threads per core
DEFAULT_ADAPTER_NUM_ENVS = 8
# Vector backends that are not JAX: their backend figure is their VectorEnv, and train.py steps them from a
# Python loop (mujoco_batch: many MuJoCo simulations per call on mujoco.batch's threads)
HOST_VECTOR_SPECS = ("envpool", "reference", "mujoco_batch")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _train_py(root: Path) -> str:
    """candidate/train.py's text ("" when there is none): read, never imported."""
    try:
        return (Path(root) / "candidate" / "train.py").read_text()
    except OSError:
        return ""


def train_constant(name: str, root: Path = REPO_ROOT) -> int | None:
    """An integer constant `NAME = 123` of candidate/train.py."""
    match = re.search(rf"^{name}\s*=\s*(\d+)", _train_py(root), re.MULTILINE)
    return int(match.group(1)) if match else None


def train_setting(name: str, root: Path = REPO_ROOT) -> str | None:
    """A constant `NAME = "text"`, `NAME = 1.5` or `NAME = True` of candidate/train.py, as its text."""
    text = _train_py(root)
    match = re.search(rf"^{name}\s*=\s*(?:[\"']([^\"']*)[\"']|([0-9.eE+-]+|True|False)\b)", text, re.MULTILINE)
    return (match.group(1) if match.group(1) is not None else match.group(2)) if match else None


# train.py's budget when AUTORL_TIME_BUDGET is unset (evaluate.py's TIME_BUDGET): a bench that the
# daemon runs is given the run's budget, which decides how many envs train.py's jax-host path steps.
DEFAULT_TRAIN_BUDGET = 720.0


def train_path(spec: str, root: Path = REPO_ROOT) -> tuple[str, int]:
    """(path, envs): how train.py feeds its learner `spec` (its main's rule, read from its constants)
    and over how many envs the jax-host path steps: "jax-e2e" for a functional JAX backend when
    train.py has the end-to-end constants and END_TO_END is not False; else "jax-host" over NUM_ENVS
    envs (x JAX_HOST_ENVS_FACTOR from a budget of JAX_HOST_BIG_BATCH_BUDGET)."""
    envs = train_num_envs(root)
    functional = spec not in HOST_VECTOR_SPECS and not is_rust_spec(spec)
    if functional and e2e_shape(root) and train_setting("END_TO_END", root) != "False":
        return "jax-e2e", envs
    budget = float(os.environ.get("AUTORL_TIME_BUDGET") or DEFAULT_TRAIN_BUDGET)
    big = budget >= float(train_setting("JAX_HOST_BIG_BATCH_BUDGET", root) or "inf")
    return "jax-host", envs * (int(train_setting("JAX_HOST_ENVS_FACTOR", root) or 1) if big else 1)


def train_num_envs(root: Path = REPO_ROOT) -> int:
    """NUM_ENVS from the hyperparameter block of candidate/train.py, else a typical PPO value."""
    return train_constant("NUM_ENVS", root) or DEFAULT_ADAPTER_NUM_ENVS


def e2e_shape(root: Path = REPO_ROOT) -> tuple[int, int, int] | None:
    """(JAX_NUM_ENVS, JAX_NUM_STEPS, HIDDEN_SIZE) when train.py trains JAX backends end to end, else None."""
    envs, steps = train_constant("JAX_NUM_ENVS", root), train_constant("JAX_NUM_STEPS", root)
    if not envs or not steps:
        return None
    return envs, steps, train_constant("HIDDEN_SIZE", root) or 64


FIGURES = ("all", "train")


def bench(env_id: str, spec: str, num_envs: int | None = None, seconds: float = 3.0,
          adapter_num_envs: int | None = None, seed: int = 0, root=None, figures: str = "all") -> dict:
    """Measure the figures described in the module docstring (`figures="train"`: train_sps and
    reference_sps only); cache train_sps for `auto`."""
    from envs_fast import make_vec_env

    check_env_id(env_id)
    adapter_num_envs = adapter_num_envs or train_num_envs()
    if spec == "auto":  # what make_vec_env(backend="auto") trains on in this checkout
        from envs_fast import choose_backend

        spec = choose_backend(env_id, adapter_num_envs, root)
    spec = resolve_spec(spec, env_id, root)
    vector_backend, rust = spec in HOST_VECTOR_SPECS, is_rust_spec(spec)
    num_envs = num_envs or (DEFAULT_VECTOR_NUM_ENVS if vector_backend else DEFAULT_RUST_NUM_ENVS if rust
                            else DEFAULT_NUM_ENVS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runners = {"reference": reference_runner(env_id, seed)}
        if figures == "all":
            runners["backend"] = (vector_runner(make_vec_env(spec, env_id, num_envs, seed, verified_only=False), seed) if vector_backend
                                  else rust_runner(spec, env_id, num_envs, seed) if rust
                                  else jax_runner(spec, env_id, num_envs, seed))
            runners["reference_vec"] = vector_runner(
                gym.make_vec(env_id, num_envs=adapter_num_envs, vectorization_mode="sync"), seed)
            runners["adapter"] = vector_runner(make_vec_env(spec, env_id, adapter_num_envs, seed, root, verified_only=False), seed)
        path, runners["train"] = _train_runner(spec, env_id, adapter_num_envs, seed, root)
        sps = measure(runners, seconds)
    return _result(env_id, spec, path, sps["train"], sps["reference"], seconds, adapter_num_envs, root, num_envs,
                   sps.get("backend"), sps.get("reference_vec"), sps.get("adapter"))


SINGLE_REFERENCE = "one gymnasium env"


def bench_side_by_side(env_id: str, specs: list[str], seconds: float = 3.0, seed: int = 0, root=None,
                       rounds: int = 4) -> list[dict]:
    """The `--figures train` result of each backend, all measured in one process in `rounds`
    interleaved rounds with one reference: what ranking backends needs (the daemon's setup), with
    their figures taken under the same load and without a start-up and a reference per backend.
    Each result's `round_train_sps` is its figure in every round, paired with the others' by round."""
    check_env_id(env_id)
    adapter_num_envs = train_num_envs()
    specs = [resolve_spec(spec, env_id, root) for spec in specs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # keyed apart from the specs: `--backend reference` (gymnasium's vector env) must not replace it
        runners, paths = {SINGLE_REFERENCE: reference_runner(env_id, seed)}, {}
        for spec in specs:
            paths[spec], runners[spec] = _train_runner(spec, env_id, adapter_num_envs, seed, root)
        per_round: dict[str, list[float]] = {}
        sps = measure(runners, seconds, rounds, per_round)
    return [{**_result(env_id, spec, paths[spec], sps[spec], sps[SINGLE_REFERENCE], seconds, adapter_num_envs, root),
             "round_train_sps": per_round[spec]} for spec in specs]


def _train_runner(spec: str, env_id: str, adapter_num_envs: int, seed: int, root):
    """((path, envs the jax-host path steps), its rollout) for train.py's path for `spec` (train_path's):
    "jax-e2e", its end-to-end rollout; "jax-host", a compiled JAX policy over the adapter."""
    from envs_fast import make_vec_env

    root_path = Path(root) if root is not None else REPO_ROOT
    path, envs = train_path(spec, root_path)
    if path == "jax-e2e":
        return (path, None), e2e_runner(spec, env_id, *e2e_shape(root_path), seed=seed)
    hidden = train_constant("HIDDEN_SIZE", root_path) or 64
    return (path, envs), jax_host_runner(make_vec_env(spec, env_id, envs, seed, root, verified_only=False), hidden, seed)


def _result(env_id: str, spec: str, path: tuple[str, int | None], train_sps: float, single: float, seconds: float, adapter_num_envs: int,
            root, num_envs: int | None = None, backend: float | None = None, reference_vec: float | None = None,
            adapter: float | None = None) -> dict:
    """One backend's figures as bench's JSON gives them; train_sps is cached for `auto`."""
    cache.store_throughput(spec, env_id, adapter_num_envs, train_sps)  # what "auto" compares: training speed
    path, host_num_envs = path
    e2e = e2e_shape(Path(root) if root is not None else REPO_ROOT) if path == "jax-e2e" else None
    return {
        "env_id": env_id,
        "backend": spec,
        "num_envs": num_envs,
        "adapter_num_envs": adapter_num_envs,
        "seconds": seconds,
        "backend_sps": backend,
        "reference_sps": single,
        "reference_vec_sps": reference_vec,
        "adapter_sps": adapter,
        "e2e_sps": train_sps if e2e else None,
        "e2e_num_envs": e2e[0] if e2e else None,
        "host_sps": None if e2e else train_sps,
        "host_num_envs": None if e2e else host_num_envs,
        "train_path": path,
        "train_sps": train_sps,
        "ratio": backend / single if backend is not None else None,
        "adapter_ratio": adapter / single if adapter is not None else None,
        "machine": cache.machine(),   # what the figures were measured on (CPU model and count, GPUs)
    }


def format_result(result: dict) -> str:
    lines = [
        ("backend_sps", f"  backend           {{:>14,.0f}} steps/s  ({result['num_envs']} envs)"),
        ("reference_sps", "  reference (1 env) {:>14,.0f} steps/s"),
        ("reference_vec_sps", f"  reference vector  {{:>14,.0f}} steps/s  ({result['adapter_num_envs']} envs, gym.make_vec)"),
        ("adapter_sps", f"  adapter           {{:>14,.0f}} steps/s  ({result['adapter_num_envs']} envs, VectorEnv)"),
        ("e2e_sps", f"  end to end        {{:>14,.0f}} steps/s  ({result['e2e_num_envs']} envs, "
                    f"train.py's jax-e2e rollout with a policy)"),
        ("host_sps", f"  host loop         {{:>14,.0f}} steps/s  ({result.get('host_num_envs')} envs, train.py's "
                     "jax-host rollout with a compiled JAX policy)"),
        ("train_sps", f"  training will see {{:>14,.0f}} steps/s  (train_sps: {result['train_path']} path)"),
        ("ratio", "  ratio             {:>14,.1f}x backend / reference (1 env)"),
    ]
    machine = result.get("machine") or {}
    on = f" on {machine.get('cpus')} x {machine.get('cpu')}" + (f", {machine['gpus']}" if machine.get("gpus") else "")
    return "\n".join([f"bench {result['env_id']} with backend {result['backend']}{on if machine else ''}"]
                     + [line.format(result[key]) for key, line in lines if result.get(key) is not None])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description="Steps per second of a backend and its reference.")
    parser.add_argument("--env", required=True)
    parser.add_argument("--backend", required=True, action="append",
                        help="translation file path (.py JAX, .rs Rust), jax/translation, rust, "
                             "envpool, gymnax, reference, or auto "
                             "(what make_vec_env(backend='auto') would train on here); given more than once "
                             "(with --figures train), the backends' train_sps are measured side by side in one "
                             "process and --json holds {\"side_by_side\": [one result per backend]}")
    parser.add_argument("--num-envs", type=int, default=None,
                        help=f"envs for the backend figure (default {DEFAULT_NUM_ENVS} for JAX backends, "
                             f"{DEFAULT_RUST_NUM_ENVS} for Rust ones, "
                             f"{DEFAULT_VECTOR_NUM_ENVS} for envpool/reference)")
    parser.add_argument("--adapter-num-envs", type=int, default=None, help="envs for the adapter figure (default: train.py's NUM_ENVS)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=4,
                        help="interleaved rounds the seconds are split into, side by side (default 4)")
    parser.add_argument("--figures", choices=FIGURES, default="all",
                        help="all (default), or train: only train_sps and the reference's, to rank backends")
    parser.add_argument("--json", metavar="FILE")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if ((args.num_envs is not None and args.num_envs < 1) or args.seconds <= 0 or args.rounds < 1
            or (args.adapter_num_envs is not None and args.adapter_num_envs < 1)):
        print("error: --num-envs/--adapter-num-envs/--rounds must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    several = len(args.backend) > 1
    if several and (args.figures != "train" or "auto" in args.backend or args.num_envs or args.adapter_num_envs):
        print("error: several --backend are measured side by side with --figures train only (no auto, "
              "--num-envs or --adapter-num-envs)", file=sys.stderr)
        return 2
    try:
        if several:
            results = bench_side_by_side(args.env, args.backend, args.seconds, rounds=args.rounds)
            output = {"side_by_side": results}
        else:
            results = [bench(args.env, args.backend[0], args.num_envs, args.seconds, args.adapter_num_envs,
                             figures=args.figures)]
            output = results[0]
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n\n".join(format_result(result) for result in results))
    if args.json:
        Path(args.json).write_text(json.dumps(output, indent=2))
    return 0
