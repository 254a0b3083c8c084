"""Where an experiment's work runs: `local` (process groups on this machine) or `modal`
(containers on Modal). See base.py for the seam every runner implements; `make_runner` builds
the one a run's configuration names."""
from __future__ import annotations

from ..config import RunConfig
from ..daemon import StopControl
from ..inflight import InFlight
from ..results import RunFolder
from ..workspace import Workspace
from .base import (EvalOutcome, Measurement, Runner, RunnerSettings, Slot, TrainOutcome, VerifyOutcome)

RUNNER_KINDS = ("local", "modal")

__all__ = ["RUNNER_KINDS", "EvalOutcome", "Measurement", "Runner", "RunnerSettings", "Slot", "TrainOutcome",
           "VerifyOutcome", "cancel_handle", "make_runner"]


def make_runner(config: RunConfig, folder: RunFolder, workspace: Workspace, stop: StopControl, journal: InFlight,
                harness_bytes: bytes) -> Runner:
    """The runner `config.runner` names, for the run in `folder` (a test passes its own factory
    with this signature as Options.runner_factory)."""
    settings = RunnerSettings(config, folder)
    if config.runner == "modal":
        from .modal.runner import ModalRunner

        return ModalRunner.from_options(settings, workspace, stop.requested, journal, harness_bytes)
    from .local import LocalRunner  # (envs_fast's Rust toolchain and the sandbox load only when a runner is built)

    return LocalRunner(settings, workspace, stop.requested, journal, harness_bytes)


def cancel_handle(handle: dict, runner: Runner) -> bool:
    """Cancel a handle recorded by any session. Every runner cancels local process groups (a Modal
    run's verify and bench run locally); a Modal call left by an earlier session of a run that now
    runs locally is cancelled through Modal directly."""
    if handle.get("kind") == "modal" and runner.name != "modal":
        from .modal.runner import cancel_call

        return cancel_call(handle)
    return runner.cancel(handle)
