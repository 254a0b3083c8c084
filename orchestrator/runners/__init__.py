"""Where an experiment's work runs: `local` (process groups on this machine) or `modal`
(containers on Modal). See base.py for the seam every runner implements."""
from __future__ import annotations

from .base import (EvalOutcome, Measurement, Runner, RunnerSettings, Slot, TrainOutcome, VerifyOutcome)

RUNNER_KINDS = ("local", "modal")

__all__ = ["RUNNER_KINDS", "EvalOutcome", "Measurement", "Runner", "RunnerSettings", "Slot", "TrainOutcome",
           "VerifyOutcome", "cancel_handle"]


def cancel_handle(handle: dict, runner: Runner) -> bool:
    """Cancel a handle recorded by any session: the runner that made it knows how."""
    kind = handle.get("kind", "local")
    if kind == getattr(runner, "name", None):
        return runner.cancel(handle)
    if kind == "local":
        from .local import cancel_local

        return cancel_local(handle, [getattr(runner, "snapshots", None) or "/nonexistent"])
    if kind == "modal":
        from .modal import cancel_call

        return cancel_call(handle)
    return False
