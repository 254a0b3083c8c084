"""ModalRunner: each experiment's training in a GPU container on Modal, its scoring in a
separate CPU container, results written to the same `exp-NNNN/` layout as LocalRunner's.

The training container gets the commit as `git archive` bytes and nothing else: no secret, no
harness, no held-out seed. The scoring container gets the trusted harness copy, its hash (it
refuses another) and the policy bytes. Each call is recorded (its function-call id, and whether
it waits for a container or runs) in the InFlight journal before it is waited on, so `status`
shows it and `stop` and `--resume` cancel it. Time spent waiting for a GPU is never the
candidate's (calls.py): a call that never starts, or that Modal loses, is spawned again
and at last recorded as the infrastructure's failure, not the code's.

Verified backends travel with the work. Verify and bench (setup's, and each translate
experiment's) run in a container of the run's GPU type (`check_backend`), where training runs: a
CPU ranks backends wrongly for a GPU, and a JAX verdict reached on a CPU says nothing of the same
code compiled for a GPU. Their records are named as that container names them (its
`environment()`, kept in the run folder) and go into the run's verdict cache; every training call
carries them all, so train.py in the container chooses among the run's verified backends, a
translation kept during the night included. A training container whose environment is another
(an image rebuilt with other packages) trains nothing and says so; the run's verdicts are then
verified again in such a container, and the call made again.
The Modal functions it calls are declared in functions.py, their work in experiment.py.

Compute is billed as the seconds a call was not seen queued times the price table: a GPU's rate
plus its CPU cores' (`--modal-price-table FILE.json` overrides any entry, in USD per hour). Every
call is billed: training and scoring in their experiment's row, the check calls (verify, bench, the
environment probe) in the next row written. With --max-cost, no call is launched once the ledger
plus what the calls since its last row cost reaches it: the run stops as a stop request stops it.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from envs_fast.protocol import TRANSLATIONS_DIR, is_file_spec, translation_files

from ...daemon import log
from ...inflight import InFlight
from ...results import ExpFolder, read_json
from ...workspace import Workspace
from ..base import (EvalOutcome, Measurement, RunnerSettings, Slot, StopCheck, TrainOutcome, VerifyOutcome,
                   add_evaluation, side_by_side_args, train_failure)
from ..local import VERDICT_EXITS, LocalRunner
from .calls import CallOutcome, CallPolicy, CallWatcher
from .support import eval_cpu

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

    def missing(self, gpu: str) -> Optional[str]:
        """Why `gpu` cannot be billed (no rate for it in the table), or None."""
        name = gpu.upper().partition(":")[0].rstrip("!")
        if name in self.per_hour:
            return None
        return (f"no price for the GPU {gpu!r} in the compute price table: give its USD per hour with "
                f"--modal-price-table FILE (JSON, e.g. {{\"{name}\": 4.0}}); known: "
                f"{', '.join(sorted(k for k in self.per_hour if k != 'CPU_CORE'))}")

    def hourly_line(self, gpu: str, cpu: float, eval_cpu: float, night_cpu: float) -> str:
        """What a night on these containers costs per hour, from this table (the one the rows are billed
        by): each training container, each scoring container, and a `::night`'s own container."""
        train, score, night = (self.cost(3600, gpu, cpu), self.cost(3600, None, eval_cpu),
                               self.cost(3600, None, night_cpu))
        return (f"a night costs ${train:.2f} per hour of each training container ({gpu} with {cpu:g} cores; "
                f"--parallel N runs N), ${score:.2f} per hour of scoring ({eval_cpu:g} cores), and in a ::night "
                f"${night:.2f} per hour for the daemon's container ({night_cpu:g} cores)")

    def cost(self, seconds: float, gpu: Optional[str], cpu: float) -> float:
        """USD for `seconds` of a container with `gpu` ("H100", "a100-80gb", "H100:2": two of them)
        and `cpu` cores. A GPU type not in the table is refused (`missing`), never billed at a guess."""
        gpu_rate = 0.0
        if gpu:
            problem = self.missing(gpu)
            if problem:
                raise ValueError(problem)
            name, _, count = gpu.upper().partition(":")
            gpu_rate = self.per_hour[name.rstrip("!")] * (int(count) if count.isdigit() else 1)
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
        self._environment: Optional[dict] = read_json(settings.folder.modal_environment) or None
        # what the calls cost since the loop's last row: all of them (not in the ledger yet: --max-cost
        # counts it before launching another), and the check calls (no measurement carries them)
        self._spending = threading.Lock()
        self._spent_since_row_usd = 0.0
        self._checks_unbilled_usd = 0.0
        self._over_limit: Callable[[float], Optional[str]] = lambda spent: None

    @classmethod
    def from_options(cls, settings: RunnerSettings, workspace: Workspace, should_stop: StopCheck, journal: InFlight,
                     harness_bytes: bytes) -> "ModalRunner":
        """The real thing: the app of functions.py, running for the whole session, with the
        run's --modal-* options (gpu, cpu, price table)."""
        import modal

        from . import functions  # imports modal: only a Modal run pays for it

        options = settings.config.runner_options
        gpu = options.get("gpu") or functions.TRAIN_GPU
        cpu = float(options.get("cpu") or functions.TRAIN_CPU)
        session = functions.session(gpu, cpu)
        functions = session.__enter__()
        in_night_container = bool(os.environ.get(functions.FUNCTION_IDS_ENV))
        return cls(settings, workspace, should_stop, journal, harness_bytes, functions, modal.FunctionCall.from_id,
                   ComputePrices.load(options.get("price_table")), gpu, cpu,
                   close=lambda: session.__exit__(None, None, None),
                   host_cpu=functions.NIGHT_CPU if in_night_container else 0.0)

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
        # train.py there chooses among the run's verified backends; it is killed at budget + grace
        # counted from its own start: the run limit is the same.
        compute_usd = 0.0
        for attempt in (1, 2):
            verdicts = self._records()
            keyed_for = self.environment(slot) if verdicts else None
            call, usd = self._paid_call(slot.exp, "train",
                                        lambda: self.functions.train.spawn(archive, c.env_id, budget, seed, c.grace_s,
                                                                           None, verdicts, keyed_for),
                                        budget + c.grace_s, f"a GPU ({self.gpu})", slot.label, f"budget {budget:.0f}s",
                                        gpu=self.gpu, cpu=self.cpu)
            compute_usd += usd
            stale = (call.value or {}).get("stale") if call.how == "ok" else None
            if not stale or attempt == 2 or not self._verify_again(slot, commit, stale, call.value["environment"]):
                break
        result = call.value or {}
        folder.train_log.write_text(result.get("log", "") + _call_note(call))
        if result.get("left_by_earlier_call"):  # a reused container, cleaned before training
            log.warning("%s: the training container had served an earlier call; removed what it left in /tmp: %s",
                        slot.label, ", ".join(result["left_by_earlier_call"][:5]))
        policy = None
        if result.get("policy"):
            policy = folder.out / (result.get("policy_name") or "policy.pt")
            policy.write_bytes(result["policy"])
        train = TrainOutcome(result.get("returncode"), float(result.get("wall_s", call.ran_s)),
                             timed_out=bool(result.get("timed_out")), interrupted=call.how == "interrupted",
                             metrics=result.get("metrics") or {}, policy=policy,
                             artifact_s=_float_or_none(result.get("artifact_s")),
                             note=f"the Modal training call failed: {call.detail}" if call.how == "error" else "",
                             infrastructure=call.detail if call.how == "infrastructure" else result.get("stale", ""))
        m = train_failure(train, folder, c, budget)
        m.compute_usd = compute_usd
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
        call, usd = self._paid_call(slot.exp, "eval",
                                    lambda: self.functions.evaluate.spawn(self.harness_bytes, c.harness_sha256,
                                                                          policy_bytes, c.env_id, c.eval_seed,
                                                                          c.eval_episodes, policy.name),
                                    c.eval_timeout_s, "a CPU container", slot.label, f"{c.eval_episodes} episodes",
                                    gpu=None, cpu=eval_cpu(), overrun="timeout")
        folder.eval_log.write_text(f"Modal call {call.call_id}: {call.how} after {call.waited_s:.1f}s"
                                   f"{_call_note(call)}\n")
        outcome = EvalOutcome(False, wall_s=call.waited_s, compute_usd=usd)
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

    # ------------------------------------------------------------ verify and bench where training runs
    def environment(self, slot: Optional[Slot] = None) -> dict:
        """The environment of this run's train containers, which names the run's records: from the run
        folder, else asked of a container once (a setup's first question). Its envs_fast is the run's
        worktree's, as the run's commits carry it to the containers, not the image's (built from the
        daemon's checkout: another commit with --from, or edited since)."""
        if self._environment is None:
            slot = slot or Slot(0, ExpFolder(self.settings.folder.path / "setup"), "setup")
            call = self._check(slot, b"", "environment", [], 600, "asking a container what it runs")
            if call.how != "ok" or not (call.value or {}).get("environment"):
                raise RuntimeError(f"could not learn what a Modal container runs ({call.how}: {call.detail})")
            self._remember({**call.value["environment"], **(self.local.record_environment() or {})})
        return self._environment

    def record_environment(self) -> Optional[dict]:
        return self.environment()

    def _remember(self, environment: dict) -> None:
        self._environment = environment
        self.settings.folder.modal_environment.write_text(json.dumps(environment, indent=1) + "\n")

    def _records(self) -> dict:
        """The run's verdicts and figures ({file name: bytes}): what every container call carries."""
        return {p.name: p.read_bytes() for p in sorted(self.settings.verify_cache.glob("*.json"))}

    def _check(self, slot: Slot, archive: bytes, stage: str, args: list[str], timeout_s: float, tick: str):
        """A check call (environment, verify, bench) in a train container; its cost goes into the next
        row (`unbilled_usd`): no measurement carries it."""
        c = self.settings.config
        call, usd = self._paid_call(slot.exp, stage,
                                    lambda: self.functions.check.spawn(archive, c.env_id, stage, args,
                                                                       self._records(), timeout_s, c.budget_s),
                                    timeout_s, f"a GPU ({self.gpu})", slot.label, tick, gpu=self.gpu, cpu=self.cpu)
        with self._spending:
            self._checks_unbilled_usd += usd
        return call

    def _paid_call(self, exp: int, stage: str, spawn: Callable[[], Any], limit_s: float, waiting_for: str,
                   label: str, tick: str, gpu: Optional[str], cpu: float, **options) -> tuple[CallOutcome, float]:
        """A call and what it cost, unless the run's spending limit is reached counting what the calls
        since the last row cost (then nothing is launched: interrupted)."""
        with self._spending:
            spent = self._spent_since_row_usd
        reason = self._over_limit(spent)
        if reason:
            log.warning("%s: %s not launched: %s", label, stage, reason)
            return CallOutcome("interrupted", detail=reason), 0.0
        call = self.calls.run(exp, stage, spawn, limit_s, waiting_for, label, tick, **options)
        usd = self.prices.cost(call.ran_s, gpu, cpu)
        with self._spending:
            self._spent_since_row_usd += usd
        return call, usd

    def _merge(self, commit: str, reply: dict, kind: str, specs: list[str]) -> None:
        """The records the daemon asked for (named in the container's environment, from `commit`'s
        files), out of a check's reply, into the run's verdict cache."""
        from envs_fast.cache import record_name

        environment, found = reply.get("environment") or self._environment, reply.get("records") or {}
        self._remember(environment)
        files = [f for spec in specs if is_file_spec(spec) for f in translation_files(spec)]
        snapshot = self.local._scratch("modal-merge")
        try:
            copy = self.workspace.extract(commit, snapshot / "commit", files) if files else snapshot
            for spec in specs:
                name = record_name(kind, str(copy / spec) if is_file_spec(spec) else spec, self.settings.config.env_id,
                                   environment)
                if name in found:
                    (self.settings.verify_cache / name).write_bytes(found[name])
                else:
                    log.warning("no %s record for %s in the container's reply", kind, spec)
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    def verify(self, slot: Slot, commit: str, backend: str, round_: int) -> VerifyOutcome:
        c, folder = self.settings.config, slot.folder
        json_path, log_path = folder.verify_round(round_)
        folder.path.mkdir(parents=True, exist_ok=True)
        call = self._check(slot, self.workspace.archive(commit), "verify", ["--backend", backend, "--levels", "1,2,3"],
                           c.verify_timeout_s, "verifying")
        reply = call.value or {}
        log_path.write_text(reply.get("log", "") + _call_note(call))
        if reply.get("json") is not None:
            json_path.write_text(json.dumps(reply["json"], indent=1))
            shutil.copyfile(json_path, folder.verify)
        if call.how == "interrupted":
            return VerifyOutcome(False, interrupted=True)
        if call.how != "ok":
            return VerifyOutcome(False, f"verification in a Modal container did not run to an end: {call.how}: "
                                        f"{call.detail}", returncode=3)
        if reply.get("timed_out"):
            return VerifyOutcome(False, f"verification timed out after {c.verify_timeout_s:.0f}s\n"
                                        f"{reply.get('log', '')[-4000:]}", returncode=3, timed_out=True)
        if reply.get("returncode") in VERDICT_EXITS:  # a failing verdict too: the same code is not verified again
            self._merge(commit, reply, "verdict", [backend])
        else:
            self._remember(reply.get("environment") or self._environment)
        return VerifyOutcome(reply.get("returncode") == 0, reply.get("log", "")[-12000:], returncode=reply.get("returncode"))

    def bench(self, slot: Slot, commit: str, spec: str, json_path: Path, figures: str = "all") -> Optional[dict]:
        args = ["--backend", spec, "--seconds", str(self.settings.config.bench_seconds)]
        results = self._bench(slot, commit, args + (["--figures", figures] if figures != "all" else []), json_path,
                              [spec])
        return results[0] if results else None

    def bench_side_by_side(self, slot: Slot, commit: str, specs: list[str], json_path: Path,
                           seconds: float, rounds: int = 4) -> Optional[list[dict]]:
        args = [arg for spec in specs for arg in ("--backend", spec)] + side_by_side_args(seconds, rounds)
        return self._bench(slot, commit, args, json_path, specs)

    def _bench(self, slot: Slot, commit: str, args: list[str], json_path: Path, specs: list[str]) -> Optional[list[dict]]:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        call = self._check(slot, self.workspace.archive(commit), "bench", args, self.settings.config.verify_timeout_s,
                           "benchmarking")
        reply = call.value or {}
        json_path.with_suffix(".log").write_text(reply.get("log", "") + _call_note(call))
        data = reply.get("json")
        if call.how != "ok" or reply.get("returncode") != 0 or not data:
            return None
        json_path.write_text(json.dumps(data, indent=1))
        self._merge(commit, reply, "bench", [spec for spec in specs if spec != "auto"])
        return data.get("side_by_side") or [data]

    def _verify_again(self, slot: Slot, commit: str, why: str, environment: dict) -> bool:
        """A training container runs elsewhere than the run's verdicts were reached: verify each passing
        one again in such a container (never trusted across package versions). True when done."""
        passing = reverify_specs(read_json(p) for p in self.settings.verify_cache.glob("verdict-*.json"))
        log.warning("%s: %s; verifying %s again in a container of this run's", slot.label, why,
                    ", ".join(passing) or "nothing")
        self._remember(environment)
        for spec in passing:
            outcome = self.verify(Slot(slot.exp, slot.folder, f"{slot.label} re-verify"), commit, spec, 0)
            if outcome.interrupted:
                return False
        return True

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

    def unbilled_usd(self, seconds: float) -> float:
        with self._spending:
            checks, self._checks_unbilled_usd, self._spent_since_row_usd = self._checks_unbilled_usd, 0.0, 0.0
        return self.prices.cost(seconds, None, self.host_cpu) + checks

    def limit_spending(self, over_limit: Callable[[float], Optional[str]]) -> None:
        self._over_limit = over_limit

    def close(self) -> None:
        self.local.close()
        self._close()


def reverify_specs(verdicts) -> list[str]:
    """The backends to verify again, as `envs_fast.verify --backend` takes them, from verdict records:
    each passing one's spec, a translation file's as the commit's `envs_fast/translations/<file>` (its record names
    the snapshot it was verified in), a built-in backend's (gymnax, mujoco_batch, mjx, envpool) as is."""
    specs = set()
    for record in verdicts:
        spec = str((record or {}).get("spec") or "")
        if spec and (record or {}).get("passed"):
            specs.add(f"envs_fast/{TRANSLATIONS_DIR}/{Path(spec).name}" if is_file_spec(spec) else spec)
    return sorted(specs)


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
