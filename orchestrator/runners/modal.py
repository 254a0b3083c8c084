"""ModalRunner: each experiment's training in a GPU container on Modal, its scoring in a
separate CPU container, results written to the same `exp-NNNN/` layout as LocalRunner's.

The training container gets the commit as `git archive` bytes and nothing else: no secret, no
harness, no held-out seed. The scoring container gets the trusted harness copy, its hash (it
refuses another) and the policy bytes. Each call is recorded (its function-call id, and whether
it waits for a container or runs) in the InFlight journal before it is waited on, so `status`
shows it and `stop` and `--resume` cancel it. Time spent waiting for a GPU is never the
candidate's (modal_calls.py): a call that never starts, or that Modal loses, is spawned again
and at last recorded as the infrastructure's failure, not the code's. Verify and bench of
a translation run locally (in the daemon's machine or the night's container), as LocalRunner's.
The Modal functions it calls are declared in modal_functions.py, their work in modal_experiment.py.

Compute is billed as the seconds a call was not seen queued times the price table: a GPU's rate
plus its CPU cores' (`--modal-price-table FILE.json` overrides any entry, in USD per hour).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from ..daemon import log
from ..inflight import InFlight
from ..modal_support import eval_cpu
from ..workspace import Workspace
from .base import (EvalOutcome, Measurement, RunnerSettings, Slot, StopCheck, TrainOutcome, VerifyOutcome,
                   add_evaluation, train_failure)
from .local import LocalRunner
from .modal_calls import CallOutcome, CallPolicy, CallWatcher

# USD per hour, Modal's published on-demand rates; a JSON file with the same keys overrides them.
DEFAULT_PRICES_PER_HOUR = {"H100": 3.95, "H200": 4.54, "B200": 6.25, "A100-80GB": 2.50, "A100": 2.10,
                           "L40S": 1.95, "A10G": 1.10, "L4": 0.80, "T4": 0.59, "cpu_core": 0.047}
DEFAULT_GPU, DEFAULT_TRAIN_CPU = "H100", 8.0


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
    `object_id`, `get(timeout=...)` (raising TimeoutError while it runs), `get_call_graph()` and
    `cancel()`; `call_from_id(id)` finds a call again (modal.FunctionCall.from_id). Tests pass
    tests/fake_modal.py's, and a CallPolicy of seconds rather than minutes."""

    name = "modal"

    def __init__(self, settings: RunnerSettings, workspace: Workspace, should_stop: StopCheck, journal: InFlight,
                 harness_bytes: bytes, functions: Any, call_from_id: Callable[[str], Any],
                 prices: Optional[ComputePrices] = None, gpu: str = DEFAULT_GPU, cpu: float = DEFAULT_TRAIN_CPU,
                 close: Callable[[], None] = lambda: None, policy: CallPolicy = CallPolicy(), host_cpu: float = 0.0):
        self.settings = settings
        self.workspace = workspace
        self.should_stop = should_stop
        self.journal = journal
        self.harness_bytes = harness_bytes
        self.functions = functions
        self.call_from_id = call_from_id
        self.prices = prices or ComputePrices(dict(DEFAULT_PRICES_PER_HOUR))
        self.gpu, self.cpu = gpu, cpu
        self.host_cpu = host_cpu  # cores of the Modal container the daemon runs in (the night's); 0: not on Modal
        self._close = close
        self.calls = CallWatcher(journal, should_stop, policy)
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
        in_night_container = bool(os.environ.get(modal_functions.FUNCTION_IDS_ENV))
        return cls(settings, workspace, should_stop, journal, harness_bytes, functions, modal.FunctionCall.from_id,
                   ComputePrices.load(options.get("price_table")), gpu, cpu,
                   close=lambda: session.__exit__(None, None, None),
                   host_cpu=modal_functions.NIGHT_CPU if in_night_container else 0.0)

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
        archive = self.workspace.archive(commit)
        # The container has none of this run's verdicts: make_vec_env("auto") picks envpool/gymnasium there.
        # It kills train.py at budget + grace counted from train.py's start: the run limit is the same.
        call = self.calls.run(slot.exp, "train",
                              lambda: self.functions.train.spawn(archive, c.env_id, budget, seed, c.grace_s),
                              budget + c.grace_s, f"a GPU ({self.gpu})", slot.label, f"budget {budget:.0f}s")
        result = call.value or {}
        folder.train_log.write_text(result.get("log", "") + _call_note(call))
        policy = None
        if result.get("policy"):
            policy = folder.out / (result.get("policy_name") or "policy.pt")
            policy.write_bytes(result["policy"])
        train = TrainOutcome(result.get("returncode"), float(result.get("wall_s", call.ran_s)),
                             timed_out=bool(result.get("timed_out")), interrupted=call.how == "interrupted",
                             metrics=result.get("metrics") or {}, policy=policy,
                             artifact_s=_float_or_none(result.get("artifact_s")),
                             note=f"the Modal training call failed: {call.detail}" if call.how == "error" else "",
                             infrastructure=call.detail if call.how == "infrastructure" else "")
        m = train_failure(train, folder, c, budget)
        m.compute_usd = self.prices.cost(call.ran_s, self.gpu, self.cpu)
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
        policy_bytes = policy.read_bytes()
        call = self.calls.run(slot.exp, "eval",
                              lambda: self.functions.evaluate.spawn(self.harness_bytes, c.harness_sha256, policy_bytes,
                                                                    c.env_id, c.eval_seed, c.eval_episodes,
                                                                    policy.name),
                              c.eval_timeout_s, "a CPU container", slot.label, f"{c.eval_episodes} episodes",
                              overrun="timeout")
        folder.eval_log.write_text(f"Modal call {call.call_id}: {call.how} after {call.waited_s:.1f}s"
                                   f"{_call_note(call)}\n")
        outcome = EvalOutcome(False, wall_s=call.waited_s, compute_usd=self.prices.cost(call.ran_s, None, eval_cpu()))
        if call.how == "interrupted":
            outcome.error, outcome.interrupted = "interrupted", True
        elif call.how == "timeout":
            outcome.error, outcome.timed_out = f"evaluation took longer than {c.eval_timeout_s:.0f}s", True
        elif call.how == "infrastructure":
            outcome.error = outcome.infrastructure = call.detail
        elif call.detail.startswith("HarnessRefused"):  # the harness did not match its hash: nothing was scored
            outcome.error, outcome.tampered = call.detail, True
        elif call.how != "ok":
            outcome.error = call.detail
        else:
            folder.eval_json.write_text(json.dumps(call.value, indent=1))
            outcome.ok, outcome.result = True, call.value
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

    def hosting_usd(self, seconds: float) -> float:
        return self.prices.cost(seconds, None, self.host_cpu)

    def close(self) -> None:
        self.local.close()
        self._close()


def _call_note(call: CallOutcome) -> str:
    """The train log's last words on a call that did not simply answer: tries, queue, how it ended."""
    if call.how == "ok" and call.tries == 1 and call.queued_s < 10:
        return ""
    earlier = "".join(f"\n[autorl] Modal try {k}: {detail}" for k, detail in enumerate(call.earlier, 1))
    return (f"{earlier}\n[autorl] Modal call {call.call_id}: {call.how}{': ' + call.detail if call.detail else ''} "
            f"(try {call.tries}, {call.queued_s:.0f}s waiting for a container, {call.waited_s:.0f}s in all)\n")


def cancel_call(handle: dict) -> bool:
    """Cancel a recorded Modal call from a session that runs locally now."""
    try:
        import modal

        modal.FunctionCall.from_id(handle["call_id"]).cancel()
        return True
    except Exception as exc:
        log.warning("could not cancel Modal call %s: %s", handle.get("call_id"), exc)
        return False


def _float_or_none(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
