"""ModalRunner: each experiment's training in a GPU container on Modal, its scoring in a
separate CPU container, results written to the same `exp-NNNN/` layout as LocalRunner's.

The training container gets the commit as `git archive` bytes and nothing else: no secret, no
harness, no held-out seed. The scoring container gets the trusted harness copy, its hash (it
refuses another) and the policy bytes. Each call is recorded (its function-call id) in the
InFlight journal before it is waited on, so `stop` and `--resume` cancel it. Verify and bench of
a translation run locally (in the daemon's machine or the night's container), as LocalRunner's.
The Modal functions it calls are declared in modal_functions.py, their work in modal_experiment.py.

Compute is billed as the seconds a call was waited on times the price table: a GPU's rate plus
its CPU cores' (`--modal-price-table FILE.json` overrides any entry, in USD per hour).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..daemon import log, progress
from ..inflight import InFlight
from ..modal_support import eval_cpu
from ..workspace import Workspace
from .base import (EvalOutcome, Measurement, RunnerSettings, Slot, StopCheck, TrainOutcome, VerifyOutcome,
                   add_evaluation, train_failure)
from .local import LocalRunner

# USD per hour, Modal's published on-demand rates; a JSON file with the same keys overrides them.
DEFAULT_PRICES_PER_HOUR = {"H100": 3.95, "H200": 4.54, "B200": 6.25, "A100-80GB": 2.50, "A100": 2.10,
                           "L40S": 1.95, "A10G": 1.10, "L4": 0.80, "T4": 0.59, "cpu_core": 0.047}
DEFAULT_GPU, DEFAULT_TRAIN_CPU = "H100", 8.0
# A container may wait for a GPU and pull its image before the budget starts counting.
STARTUP_ALLOWANCE_S = 900.0
POLL_S = 1.0


class ComputePrices:
    def __init__(self, per_hour: dict[str, float]):
        self.per_hour = {name.upper(): rate for name, rate in per_hour.items()}  # Modal upper-cases GPU names

    @classmethod
    def load(cls, path: Optional[str]) -> "ComputePrices":
        table = dict(DEFAULT_PRICES_PER_HOUR)
        if path:
            try:
                table.update({k: float(v) for k, v in json.loads(Path(path).read_text()).items()})
            except (OSError, ValueError, AttributeError) as exc:
                raise ValueError(f"--modal-price-table {path}: {exc}") from None
        return cls(table)

    def cost(self, seconds: float, gpu: Optional[str], cpu: float) -> float:
        """USD for `seconds` of a container with `gpu` ("H100", "a100-80gb", "H100:2": two of them)
        and `cpu` cores; a GPU type not in the table is billed at the H100 rate."""
        gpu_rate = 0.0
        if gpu:
            name, _, count = gpu.upper().partition(":")
            gpu_rate = self.per_hour.get(name, self.per_hour["H100"]) * (int(count) if count.isdigit() else 1)
        return seconds / 3600 * (gpu_rate + cpu * self.per_hour["CPU_CORE"])


class ModalRunner:
    """`functions` has `.train` and `.evaluate` with Modal's `spawn(...)` returning a call with
    `object_id`, `get(timeout=...)` (raising TimeoutError while it runs) and `cancel()`;
    `call_from_id(id)` finds a call again (modal.FunctionCall.from_id). Tests pass a fake."""

    name = "modal"

    def __init__(self, settings: RunnerSettings, workspace: Workspace, should_stop: StopCheck, journal: InFlight,
                 harness_bytes: bytes, functions: Any, call_from_id: Callable[[str], Any],
                 prices: Optional[ComputePrices] = None, gpu: str = DEFAULT_GPU, cpu: float = DEFAULT_TRAIN_CPU,
                 close: Callable[[], None] = lambda: None):
        self.settings = settings
        self.workspace = workspace
        self.should_stop = should_stop
        self.journal = journal
        self.harness_bytes = harness_bytes
        self.functions = functions
        self.call_from_id = call_from_id
        self.prices = prices or ComputePrices(dict(DEFAULT_PRICES_PER_HOUR))
        self.gpu, self.cpu = gpu, cpu
        self._close = close
        self.local = LocalRunner(settings, workspace, should_stop, journal, harness_bytes)

    @classmethod
    def from_options(cls, settings: RunnerSettings, workspace: Workspace, should_stop: StopCheck, journal: InFlight,
                     harness_bytes: bytes) -> "ModalRunner":
        """The real thing: the app of modal_functions.py, running for the whole session, with the
        run's --modal-* options (gpu, cpu, price table)."""
        import modal

        from . import modal_functions  # imports modal: only a Modal run pays for it

        options = settings.config.runner_options
        gpu = options.get("gpu") or modal_functions.TRAIN_GPU
        cpu = float(options.get("cpu") or modal_functions.TRAIN_CPU)
        session = modal_functions.session(gpu, cpu)
        functions = session.__enter__()
        return cls(settings, workspace, should_stop, journal, harness_bytes, functions, modal.FunctionCall.from_id,
                   ComputePrices.load(options.get("price_table")), gpu, cpu,
                   close=lambda: session.__exit__(None, None, None))

    # ------------------------------------------------------------ a call, waited on like a process
    def _wait(self, slot: Slot, stage: str, call, deadline_s: float, tick: str) -> tuple[Any, str, float]:
        """(value, how it ended: "ok" / "interrupted" / "timeout" / "error: ...", seconds waited)."""
        self.journal.add_handle(slot.exp, {"kind": "modal", "call_id": call.object_id, "stage": stage})
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            if self.should_stop():
                self._cancel(call)
                return None, "interrupted", elapsed
            if elapsed > deadline_s:
                self._cancel(call)
                return None, "timeout", elapsed
            try:
                return call.get(timeout=POLL_S), "ok", time.monotonic() - started
            except TimeoutError:
                progress.show(f"{slot.label}: {tick} on Modal {elapsed:.0f}s")
            except Exception as exc:  # the remote function raised, or its container was lost
                return None, f"error: {type(exc).__name__}: {exc}", time.monotonic() - started

    def _cancel(self, call) -> None:
        try:
            call.cancel()
        except Exception as exc:
            log.warning("could not cancel Modal call %s: %s", getattr(call, "object_id", "?"), exc)

    # ------------------------------------------------------------ measure
    def measure(self, slot: Slot, commit: str, seed: int, budget_s: Optional[float] = None) -> Measurement:
        c, folder = self.settings.config, slot.folder
        budget = budget_s or c.budget_s
        folder.path.mkdir(parents=True, exist_ok=True)
        for stale in (folder.train_log, folder.eval_json, folder.eval_log):
            stale.unlink(missing_ok=True)
        shutil.rmtree(folder.out, ignore_errors=True)
        folder.out.mkdir(parents=True)
        log.info("%s: training on Modal (%s, %g CPUs) with seed %d for %gs", slot.label, self.gpu, self.cpu, seed,
                 budget)
        # The container has none of this run's verdicts: make_vec_env("auto") picks envpool/gymnasium there.
        call = self.functions.train.spawn(self.workspace.archive(commit), c.env_id, budget, seed, c.grace_s)
        value, how, waited = self._wait(slot, "train", call, budget + c.grace_s + STARTUP_ALLOWANCE_S,
                                        f"training (budget {budget:.0f}s)")
        compute = self.prices.cost(waited, self.gpu, self.cpu)
        result = value or {}
        folder.train_log.write_text(result.get("log", "") + (f"\n[autorl] Modal call {call.object_id}: {how}\n"
                                                              if how != "ok" else ""))
        policy = None
        if result.get("policy"):
            policy = folder.out / (result.get("policy_name") or "policy.pt")
            policy.write_bytes(result["policy"])
        train = TrainOutcome(result.get("returncode"), float(result.get("wall_s", waited)),
                             timed_out=how == "timeout" or bool(result.get("timed_out")),
                             interrupted=how == "interrupted", metrics=result.get("metrics") or {}, policy=policy,
                             note=f"the Modal training call failed: {how[7:]}" if how.startswith("error") else "")
        m = train_failure(train, folder, c, budget)
        m.compute_usd = compute
        if m.status:
            return m
        evaluation = self.evaluate(slot, policy)
        m = add_evaluation(m, evaluation, folder)
        if m.score is not None:
            log.info("%s: score %.3f (se %.3f over %d episodes)", slot.label, m.score,
                     evaluation.result.get("se", float("nan")), evaluation.result.get("episodes", 0))
        return m

    def evaluate(self, slot: Slot, policy: Path) -> EvalOutcome:
        c, folder = self.settings.config, slot.folder
        call = self.functions.evaluate.spawn(self.harness_bytes, c.harness_sha256, policy.read_bytes(), c.env_id,
                                             c.eval_seed, c.eval_episodes, policy.name)
        value, how, waited = self._wait(slot, "eval", call, c.eval_timeout_s + STARTUP_ALLOWANCE_S,
                                        f"evaluating {c.eval_episodes} episodes")
        folder.eval_log.write_text(f"Modal call {call.object_id}: {how} after {waited:.1f}s\n")
        outcome = EvalOutcome(False, wall_s=waited, compute_usd=self.prices.cost(waited, None, eval_cpu()))
        if how == "interrupted":
            outcome.error, outcome.interrupted = "interrupted", True
        elif how == "timeout":
            outcome.error, outcome.timed_out = f"evaluation took longer than {c.eval_timeout_s:.0f}s", True
        elif how.startswith("error: HarnessRefused"):  # the harness did not match its hash: nothing was scored
            outcome.error, outcome.tampered = how[7:], True
        elif how != "ok":
            outcome.error = how[7:]
        else:
            folder.eval_json.write_text(json.dumps(value, indent=1))
            outcome.ok, outcome.result = True, value
        return outcome

    # ------------------------------------------------------------ verify and bench run where the daemon runs
    def verify(self, slot: Slot, commit: str, backend: str, round_: int) -> VerifyOutcome:
        return self.local.verify(slot, commit, backend, round_)

    def bench(self, slot: Slot, commit: str, spec: str, json_path: Path, figures: str = "all") -> Optional[dict]:
        return self.local.bench(slot, commit, spec, json_path, figures)

    def bench_side_by_side(self, slot: Slot, commit: str, specs: list[str], json_path: Path,
                           seconds: float) -> Optional[list[dict]]:
        return self.local.bench_side_by_side(slot, commit, specs, json_path, seconds)

    # ------------------------------------------------------------ cancel
    def cancel(self, handle: dict) -> bool:
        if handle.get("kind") != "modal":
            return self.local.cancel(handle)
        try:
            self.call_from_id(handle["call_id"]).cancel()
        except Exception as exc:
            log.warning("could not cancel Modal call %s: %s", handle.get("call_id"), exc)
            return False
        log.warning("cancelled Modal call %s (%s) left by the previous daemon", handle["call_id"],
                    handle.get("stage", "?"))
        return True

    def close(self) -> None:
        self.local.close()
        self._close()


def cancel_call(handle: dict) -> bool:
    """Cancel a recorded Modal call from a session that runs locally now."""
    try:
        import modal

        modal.FunctionCall.from_id(handle["call_id"]).cancel()
        return True
    except Exception as exc:
        log.warning("could not cancel Modal call %s: %s", handle.get("call_id"), exc)
        return False
