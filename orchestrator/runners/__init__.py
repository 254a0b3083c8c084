"""Where an experiment's work runs: `local` (process groups on this machine) or `modal`
(containers on Modal). See base.py for the seam every runner implements."""
from __future__ import annotations

from .base import (EvalOutcome, Measurement, Runner, RunnerSettings, Slot, TrainOutcome, VerifyOutcome)

RUNNER_KINDS = ("local", "modal")

__all__ = ["RUNNER_KINDS", "EvalOutcome", "Measurement", "Runner", "RunnerSettings", "Slot", "TrainOutcome",
           "VerifyOutcome", "cancel_handle"]


def cancel_handle(handle: dict, runner: Runner) -> bool:
    """Cancel a handle recorded by any session. Every runner cancels local process groups (a Modal
    run's verify and bench run locally); a Modal call left by an earlier session of a run that now
    runs locally is cancelled through Modal directly."""
    if handle.get("kind") == "modal" and runner.name != "modal":
        from .modal import cancel_call

        return cancel_call(handle)
    return runner.cancel(handle)
