"""The Modal objects of autorl: the image, the app `autorl`, the results volume, and the functions
(train_experiment and check_backend on a GPU, evaluate_policy on CPUs, night_daemon for a whole night),
with `configured` / `session`, through which ModalRunner and modal_app.py's entrypoints get them.

GPU type and CPU count of the train containers: AUTORL_MODAL_GPU (default H100) and
AUTORL_MODAL_CPU (default 8), read at import (also AUTORL_MODAL_EVAL_CPU, AUTORL_MODAL_TIMEOUT);
per call, `configured(gpu="A100", cpu=4)` returns the functions with those options
(`Function.with_options`): this is what the daemon's --modal-gpu/--modal-cpu go through.

Importing this module makes no network call. The functions' work is plain Python in
experiment.py and night.py; the image carries this package, so a container imports
this module by its name.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import NamedTuple, Optional

import modal

from ...lockfile import read_lock
from .doctor import DOCTOR_BUDGET_S, diagnose
from .experiment import EVAL_TIMEOUT_S, check_archive, score_policy, train_archive
from .night import DEFAULT_IDENTITY, FUNCTION_IDS_ENV, run_night
from .support import VOLUME_NAME, eval_cpu

ROOT = Path(__file__).resolve().parents[3]  # the checkout this package is part of: the image is built from it
IMAGE_FILES = ("pyproject.toml", "evaluate.py", "constraints.txt")
LOCK_IN_IMAGE = "/root/constraints.txt"
PIP_LOCKED = f"-c {LOCK_IN_IMAGE}"  # every pip step of the image installs the tested versions (as make install)
TORCH_SPEC = f"torch=={read_lock(ROOT / 'constraints.txt')['torch']}"  # PyPI's Linux wheel of torch is the CUDA build
# The CUDA major PyPI's Linux wheel of each pinned torch is built for (its metadata requires
# cuda-toolkit==13.0.3 and nvidia-cudnn-cu13): JAX's CUDA plugin must be built for the same one, so
# that the image holds one CUDA stack (jax-cuda13-plugin's nvidia-*-cu13 requirements are met by
# torch's), and the GPU's driver must support it (CUDA 13: driver >= 580; `doctor` prints it).
TORCH_CUDA_MAJORS = {"2.13.0": 13}
CUDA_MAJOR = TORCH_CUDA_MAJORS[TORCH_SPEC.split("==")[1]]
JAX_CUDA_SPEC = f"jax[cuda{CUDA_MAJOR}]"  # the CUDA plugin of the jax pyproject.toml installed

# swig + compilers: Box2D; bubblewrap: the night container walls candidate code (verify, bench, the
# agent's commands) as a local run does, away from the night's secret and the volume's held-out seeds;
# curl: rustup
APT_PACKAGES = ("swig", "build-essential", "git", "tzdata", "bubblewrap", "curl", "ca-certificates")
# The Rust toolchain the Rust ports are built with in the containers (the one they are tested with:
# `rustc --version` on the development machines). Without it setup would ship a Rust port to
# containers that cannot build it; the containers report their rustc, and setup asks them.
RUST_TOOLCHAIN = "1.95.0"
RUST_HOME = {"RUSTUP_HOME": "/usr/local/rustup", "CARGO_HOME": "/usr/local/cargo",
             "PATH": "/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

TRAIN_GPU = os.environ.get("AUTORL_MODAL_GPU", "H100")
# Modal may run an "H100" request on an H200, and an "A100" one on an A100-80GB. A night's verdicts
# and figures are keyed by the GPU they were reached on, so a mixed pool would make its training
# calls stale one by one: the containers are asked for exactly the type named.
EXACT_GPU = {"H100": "H100!", "A100": "A100-40GB"}


def exact_gpu(gpu: str) -> str:
    """The Modal GPU request for `gpu` ("H100", "a100:2", ...) that no upgrade can change."""
    name, colon, count = gpu.partition(":")
    return EXACT_GPU.get(name.upper(), name) + colon + count


TRAIN_CPU = float(os.environ.get("AUTORL_MODAL_CPU", 8))
EVAL_CPU = eval_cpu()
NIGHT_CPU = 2.0
TRAIN_TIMEOUT_S = int(os.environ.get("AUTORL_MODAL_TIMEOUT", 4 * 3600))  # a cap: run_group kills at budget + grace
CHECK_TIMEOUT_S = 2 * 3600                                                # a cap: run_group kills at --verify-timeout
NIGHT_TIMEOUT_S = 24 * 3600                                               # Modal's longest
RESULTS_MOUNT = "/autorl-results"

image = (
    modal.Image.debian_slim(python_version="3.11")
    .apt_install(*APT_PACKAGES)
    .env(RUST_HOME)
    .run_commands("curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --no-modify-path "
                  f"--profile minimal --default-toolchain {RUST_TOOLCHAIN}")
    .add_local_file(ROOT / "constraints.txt", LOCK_IN_IMAGE, copy=True)
    .pip_install(TORCH_SPEC, extra_options=PIP_LOCKED)
    .pip_install_from_pyproject(str(ROOT / "pyproject.toml"), extra_options=PIP_LOCKED)  # torch is then met
    .pip_install(JAX_CUDA_SPEC, extra_options=PIP_LOCKED)  # the CUDA plugin of the jax just installed
    .env({"PYTHONUNBUFFERED": "1"})
    .add_local_python_source("orchestrator", "envs_fast")
    .add_local_file(ROOT / "evaluate.py", "/root/evaluate.py")
)
app = modal.App("autorl", image=image)
results_volume = modal.Volume.from_name(VOLUME_NAME, create_if_missing=True)


# Where candidate code or a candidate's policy runs: no network, no Modal API, and a container of its own
# for each call (single-use), so nothing one run leaves in it (weights or a compile cache in /tmp, a
# patched package) reaches a later run: a confirmation cannot warm-start from its first run
CANDIDATE_CONTAINER = dict(block_network=True, restrict_modal_access=True, single_use_containers=True)


def image_problem() -> Optional[str]:
    """None when this checkout has the files the image is built from (read only when Modal builds
    it, so a missing one would fail after the run was created), else one line."""
    missing = [name for name in IMAGE_FILES if not (ROOT / name).is_file()]
    if missing:
        return f"--runner modal builds its image from {ROOT}, which has no {' and no '.join(missing)}"
    return None


@app.function(gpu=exact_gpu(TRAIN_GPU), cpu=TRAIN_CPU, timeout=TRAIN_TIMEOUT_S, **CANDIDATE_CONTAINER)
def train_experiment(archive: bytes, env_id: str, budget: float, seed: int, grace: float | None = None,
                     extra_env: dict | None = None, verdicts: dict | None = None, keyed_for: dict | None = None) -> dict:
    """Train a commit (`git archive --format=tar.gz COMMIT`) for `budget` seconds on a GPU, choosing
    among the run's verified backends (`verdicts`, keyed for the environment `keyed_for`). No secret,
    no harness and no held-out seed enter this container."""
    return train_archive(archive, env_id, budget, seed, grace, extra_env, verdicts=verdicts, keyed_for=keyed_for)


@app.function(gpu=exact_gpu(TRAIN_GPU), cpu=TRAIN_CPU, timeout=CHECK_TIMEOUT_S, **CANDIDATE_CONTAINER)
def check_backend(archive: bytes, env_id: str, stage: str, args: list, records: dict, timeout_s: float,
                  budget_s: float = 0.0) -> dict:
    """Verify or benchmark a backend of a commit in a train container (the GPU training will run
    on): its verdict and figures, keyed as this container keys them (experiment.check_archive)."""
    return check_archive(archive, env_id, stage, list(args), records, timeout_s, budget_s=budget_s)


@app.function(cpu=EVAL_CPU, timeout=EVAL_TIMEOUT_S + 300, **CANDIDATE_CONTAINER)
def evaluate_policy(harness: bytes, harness_sha256: str, policy: bytes, env_id: str, seed: int, episodes: int,
                    policy_name: str = "policy.pt") -> dict:
    """Score a policy artifact with the trusted harness (checked against its sha256) on CPUs."""
    return score_policy(harness, harness_sha256, policy, env_id, seed, episodes, policy_name,
                        workers=max(1, int(EVAL_CPU)))  # (the host's core count is not the container's share)


@app.function(gpu=exact_gpu(TRAIN_GPU), cpu=TRAIN_CPU, timeout=1800, **CANDIDATE_CONTAINER)
def gpu_doctor(archive: bytes, budget: float = DOCTOR_BUDGET_S) -> dict:
    """The driver, what torch and JAX see, the commit's train.py on CartPole on each path, and the
    speed of its JAX physics ports, in a train container (doctor.diagnose)."""
    return diagnose(archive, budget=budget)


@app.function(cpu=NIGHT_CPU, timeout=NIGHT_TIMEOUT_S, volumes={RESULTS_MOUNT: results_volume})
def night_daemon(bundle: bytes, env_id: str, tag: str, run_args: str = "", identity: tuple | None = None,
                 tz: str = "", settings: dict | None = None) -> int:
    """The daemon over a clone of `bundle`, its experiments on train_experiment/evaluate_policy of
    this running app (by id), its run saved to the volume after every experiment."""
    ids = {"train_experiment": train_experiment.object_id, "evaluate_policy": evaluate_policy.object_id,
           "check_backend": check_backend.object_id}
    return run_night(bundle, env_id, tag, run_args, Path(RESULTS_MOUNT), commit=results_volume.commit,
                     function_ids=ids, identity=tuple(identity or DEFAULT_IDENTITY), tz=tz, settings=settings)


class ModalFunctions(NamedTuple):
    train: modal.Function      # train_experiment(archive, env_id, budget, seed, grace, extra_env, verdicts, keyed_for)
    evaluate: modal.Function   # evaluate_policy(harness, harness_sha256, policy, env_id, seed, episodes, policy_name)
    check: modal.Function      # check_backend(archive, env_id, stage, args, records, timeout_s, budget_s)


def configured(gpu: str | None = None, cpu: float | None = None, timeout_s: int | None = None) -> ModalFunctions:
    """train_experiment and evaluate_policy, the train containers with GPU type `gpu` and `cpu`
    CPUs (None: AUTORL_MODAL_GPU / AUTORL_MODAL_CPU) and a `timeout_s` cap. Call inside a running
    app (`session()`, `app.run()`, a local entrypoint); in the night container (where
    AUTORL_MODAL_FUNCTIONS holds their ids) the running app's functions are looked up by id."""
    train, evaluate, check = train_experiment, evaluate_policy, check_backend
    ids = json.loads(os.environ.get(FUNCTION_IDS_ENV) or "{}")
    if ids:
        train = modal.Function.from_id(ids["train_experiment"])
        evaluate = modal.Function.from_id(ids["evaluate_policy"])
        check = modal.Function.from_id(ids["check_backend"])
    if gpu or cpu or timeout_s:
        # resources are replaced as a whole by with_options: always give both GPU and CPU; the
        # checks run on the GPU type training runs on (a CPU ranks backends wrongly for a GPU)
        train = train.with_options(gpu=exact_gpu(gpu or TRAIN_GPU), cpu=float(cpu or TRAIN_CPU), timeout=timeout_s)
        check = check.with_options(gpu=exact_gpu(gpu or TRAIN_GPU), cpu=float(cpu or TRAIN_CPU))
    return ModalFunctions(train, evaluate, check)


@contextlib.contextmanager
def session(gpu: str | None = None, cpu: float | None = None, timeout_s: int | None = None):
    """`with session(gpu, cpu) as fns: fns.train.spawn(...)`: the configured functions of a running
    app (a fresh `app.run()` for the block; in the night container, the night's own app)."""
    if os.environ.get(FUNCTION_IDS_ENV):
        yield configured(gpu, cpu, timeout_s)
        return
    # Modal's output on: the image build (minutes the first time) and a failed build's log are shown
    with modal.enable_output(), app.run():
        yield configured(gpu, cpu, timeout_s)
