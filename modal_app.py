"""Runs autorl experiments, or a whole night, on Modal: the entrypoints of `modal run`.

One experiment of this checkout (`git archive HEAD`) trained on a GPU container, then scored by
this checkout's evaluate.py on a CPU container with a fresh random seed:

    modal run modal_app.py --env-id BipedalWalker-v3 [--budget S] [--seed N] [--episodes N] [--gpu A100] [--cpu 4]

The whole night as a Modal job: the daemon (`python -m orchestrator run --runner modal ...`) runs
in a small CPU container over a clone of this checkout, each experiment's training on a GPU
container; after every experiment results/<tag>/ and branch autorl/<tag> are saved to the volume
`autorl-results`, and `python -m orchestrator pull --tag TAG` brings them home:

    modal run --detach modal_app.py::night --env-id ENV [--tag TAG] [--run-args "--until 07:00 --agent optuna"]
                                            [--secret NAME] [--tz Europe/Paris] [--no-wait]

Before the first night, does a GPU container train on its GPU (the driver, what torch and JAX
see, the shipped train.py for 20 s on CartPole on each path and the device each used, every other
fast path's speed, what a night costs per hour)?

    modal run modal_app.py::doctor [--gpu H100] [--price-table FILE.json]

The image, the app and its functions are declared in orchestrator/runners/modal/functions.py
(AUTORL_MODAL_GPU / AUTORL_MODAL_CPU set the train containers); the work they do is plain Python
in orchestrator/runners/modal/experiment.py and night.py. Importing this module makes no
network call; nothing imports it.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import modal

from orchestrator.config import default_tag
from orchestrator.runners.modal.support import VOLUME_NAME, container_settings
from orchestrator.runners.modal.doctor import format_report
from orchestrator.runners.modal.experiment import git_archive, one_experiment
from orchestrator.runners.modal.runner import ComputePrices
from orchestrator.runners.modal.functions import (EVAL_CPU, NIGHT_CPU, TRAIN_CPU, TRAIN_GPU, app, configured,
                                                 exact_gpu, gpu_doctor, night_daemon)
from orchestrator.runners.modal.night import (BUILD_LOG_NAME, checkout_bundle, daemon_command, local_timezone,
                                              output_saved_to)

ROOT = Path(__file__).resolve().parent


@app.local_entrypoint()
def main(env_id: str = "CartPole-v1", budget: float = 0, seed: int = 1, episodes: int = 100, gpu: str = "",
         cpu: float = 0):
    """One experiment of this checkout's HEAD on Modal: train on a GPU, score with evaluate.py.
    --budget 0: evaluate.TIME_BUDGET. --gpu/--cpu: the train container (default AUTORL_MODAL_GPU/CPU)."""
    print(f"GPU {gpu or TRAIN_GPU}, {cpu or TRAIN_CPU:g} CPUs")
    if one_experiment(configured(gpu or None, cpu or None), ROOT, env_id, budget, seed, episodes)["score"] is None:
        raise SystemExit(1)


def start_night(env_id: str = "BipedalWalker-v3", tag: str = "", run_args: str = "", secret: str = "",
                tz: str = "", wait: bool = True):
    """A whole night on Modal: the daemon in a CPU container over this checkout (HEAD and branches,
    as a git bundle), experiments on GPU containers, the run saved to the volume after every
    experiment. --run-args: extra daemon options, e.g. "--until 07:00 --agent optuna --modal-gpu A100".
    --secret: a Modal Secret for the agent (e.g. one holding ANTHROPIC_API_KEY). The night goes on
    when this command ends or is interrupted; `python -m orchestrator pull --tag TAG` brings it home."""
    tag = tag or default_tag(env_id)
    daemon_command(env_id, tag, run_args)  # refuse bad run args before anything is created
    bundle, identity = checkout_bundle(ROOT)
    build_log = ROOT / "results" / tag / BUILD_LOG_NAME
    with contextlib.ExitStack() as night_app:
        with output_saved_to(build_log):  # the image build (minutes the first time) and its log, kept
            night_app.enter_context(app.run(name=f"autorl night {tag}", detach=True))  # detached: outlives us
            function = night_daemon.with_options(secrets=[modal.Secret.from_name(secret)]) if secret else night_daemon
            call = function.spawn(bundle, env_id, tag, run_args, identity, tz or local_timezone(), container_settings())
        print(f"the image build's output is in {build_log}")
        print(f"night {tag!r} started on Modal (function call {call.object_id}); results go to the volume "
              f"{VOLUME_NAME} after every experiment.\n"
              f"  bring them home:  python -m orchestrator pull --tag {tag}\n"
              f"  stop the night:   python -c \"import modal; modal.FunctionCall.from_id('{call.object_id}')"
              f".cancel()\"   (or modal app stop)")
        if wait:
            print("waiting for the night to end (Ctrl-C leaves it running) ...")
            print(f"night {tag!r} ended: the daemon exited with {call.get()}")


# `modal run modal_app.py::night` resolves to this one entrypoint ("night.start") of its own small
# app, so that plain `modal run modal_app.py` still has a single module-level entrypoint (main).
night = modal.App("autorl-night")
night.local_entrypoint(name="start")(start_night)


def check_gpu(gpu: str = "", budget: float = 20.0, price_table: str = ""):
    """Does a train container train on its GPU? Prints the driver, what torch and JAX see (and the
    CUDA major each is built for), the packages that differ from constraints.txt, this checkout's
    train.py (HEAD) trained on CartPole for --budget seconds on the jax-host and jax-e2e paths with
    the device each used, the speed of every other fast path (the JAX port, mjx, the Rust port built
    there), and what a night costs per hour by the price table the bill uses; exits 1 on any problem.
    --gpu: the GPU type (default AUTORL_MODAL_GPU). --price-table: as --modal-price-table."""
    prices = ComputePrices.load(price_table or None)
    function = gpu_doctor.with_options(gpu=exact_gpu(gpu or TRAIN_GPU), cpu=TRAIN_CPU)
    print(f"GPU {gpu or TRAIN_GPU}: building the image (minutes the first time), then a few minutes ...")
    with app.run():  # (modal run shows Modal's output: the image build and its log)
        report = function.remote(git_archive(ROOT), budget)
    print(format_report(report))
    print(f"cost:    {prices.hourly_line(gpu or TRAIN_GPU, TRAIN_CPU, EVAL_CPU, NIGHT_CPU)}")
    if report["problems"]:
        raise SystemExit(1)


# `modal run modal_app.py::doctor`: like night, one entrypoint of its own small app.
doctor = modal.App("autorl-doctor")
doctor.local_entrypoint(name="check")(check_gpu)
