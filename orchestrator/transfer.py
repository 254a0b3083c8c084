"""`python -m orchestrator transfer`: does the night's train.py transfer to other environments?

The run's starting train.py (its base commit) and its best (the branch tip) are each trained on
every given env with the same budget and seeds, through the same runner as the run's
experiments (`runners.make_runner`, so on Modal when the run used Modal), and scored by the
run's trusted harness copy with its held-out seed. One row per cell goes to
`results/<tag>/transfer.tsv` as it finishes (fsynced); `transfer.png` shows baseline vs best
per env with 95% CIs. Finished cells are never retrained: a second call picks up where the
first stopped (a cell is identified by env, which, seed, commit and budget).

Before an env's first cell trains, the backends the run's start commit ships for that env are
verified (L1-L3) and benchmarked exactly as the run's setup did for its own env
(orchestrator/shipped.py: its translations, mujoco_batch for MuJoCo envs, mjx where training has a
GPU, gymnax; envpool benchmarked beside a MuJoCo env's), into the run's verdict cache, so that
train.py's BACKEND = "auto" trains on the fastest verified one; a verdict or figure an earlier run
made for the same content comes from the user cache instead. The choice, and why, is said per env
and kept in `results/<tag>/transfer/<env>/backend.json` (once per env: a second call reads it),
the verification reports under `transfer/<env>/setup/`. A run started with --no-setup-verify
transfers without verifying, as its baseline trained.

Each cell's files (train.log, eval.json, policy) are in `results/<tag>/transfer/<env>/<which>-seed<N>/`;
the transfer's own journal, lock, stop file and log (transfer.log) are in `results/<tag>/transfer/`,
never touching those of the run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from envs_fast.cache import reading_from

from .artifacts import parse_summary
from .config import RunConfig, RunError, budget_allowance
from .daemon import LockHeld, RunLock, StopControl, lock_holder, log, logging_into
from .inflight import InFlight, recorded
from .results import RunFolder, utc_now
from .runners import Runner, Slot, cancel_handle, make_runner
from .shipped import Stage, choice_line, verify_at_setup
from .transfer_table import WHICH, append_row, load_frame, read_rows, row_key
from .report.charts import transfer_png
from .workspace import Workspace

TRANSFER_LOG = "transfer.log"   # results/<tag>/transfer/transfer.log: the daemon's lines during a transfer


class TransferError(RunError):
    pass


@dataclass(frozen=True)
class Cell:
    env: str
    which: str
    seed: int
    commit: str
    budget_s: float

    def key(self) -> tuple:
        return self.env, self.which, self.seed, self.commit, float(self.budget_s)


# ---------------------------------------------------------------- the cells
def plan(envs: list[str], seeds: int, base: str, best: str, budget_s: float) -> list[Cell]:
    """Baseline and best side by side, seed by seed, env by env (a stopped transfer leaves pairs)."""
    return [Cell(env, which, seed, base if which == "baseline" else best, budget_s)
            for env in envs for seed in range(1, seeds + 1) for which in WHICH]


def check_envs(envs: list[str]) -> None:
    import gymnasium

    for env in envs:
        if ":" in env:
            continue
        try:
            gymnasium.spec(env)
        except gymnasium.error.Error as exc:
            raise TransferError(f"unknown environment {env!r}: {exc}") from None


def run_transfer(run_dir: Path, envs: list[str], budget_s: Optional[float] = None, seeds: int = 1,
                 runner_factory: Optional[Callable] = None, say: Callable[[str], None] = print) -> dict:
    """Train and score every missing cell; returns {"trained": n, "skipped": n, "stopped": bool}."""
    import hashlib

    folder = RunFolder(run_dir)
    if not folder.config.exists():
        raise TransferError(f"no run in {run_dir} ({folder.config} is missing)")
    config = RunConfig.load(folder.config)
    if not envs:
        raise TransferError("--envs needs at least one env id")
    check_envs(envs)
    pid = lock_holder(folder.path)
    if pid:
        raise TransferError(f"run {config.tag!r} is still running (pid {pid}); its best commit is not final and "
                            f"training beside it would slow both. Transfer once it has ended "
                            f"(`python -m orchestrator stop --tag {config.tag}`)")
    harness_bytes = folder.harness.read_bytes()
    if hashlib.sha256(harness_bytes).hexdigest() != config.harness_sha256:
        raise TransferError(f"{folder.harness} no longer matches the hash in run.json; its scores cannot be trusted")
    workspace = Workspace(Path(config.main_root), config.tag)
    base = config.base_commit
    try:
        best = workspace.main.commit(config.branch).hexsha
    except Exception as exc:
        raise TransferError(f"cannot find the run's branch {config.branch}: {exc}") from None
    budget = float(budget_s if budget_s is not None else config.budget_s)
    cells = plan(envs, seeds, base, best, budget)
    done = {row_key(r): r for r in read_rows(folder.transfer_tsv)}
    todo = [c for c in cells if c.key() not in done]
    say(f"transfer of {config.tag}: {len(cells)} cells ({', '.join(envs)} x {seeds} seed(s) x baseline/best, "
        f"budget {budget:g}s); {len(cells) - len(todo)} already done, {len(todo)} to train")
    if base == best:
        say("the run kept nothing: its best train.py is its starting one; each pair is trained once")
    stats = {"trained": 0, "skipped": len(cells) - len(todo), "stopped": False}
    if not todo:
        return stats

    home = folder.transfer
    home.mkdir(parents=True, exist_ok=True)
    lock = RunLock(home)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise TransferError(f"another transfer of {config.tag!r} is running (pid {exc.pid})") from None
    stop = StopControl(home)
    stop.install()
    journal = InFlight(home)
    leftovers = recorded(home)
    runners: dict = {}
    factory = runner_factory or make_runner
    try:
        with logging_into(home / TRANSFER_LOG), reading_from(folder.verify_cache):
            for index, cell in enumerate(todo, start=1):
                if stop.requested():
                    stats["stopped"] = True
                    break
                twin = Cell(cell.env, "baseline", cell.seed, cell.commit, cell.budget_s)
                if cell.which == "best" and base == best and twin.key() in done:
                    row = {**done[twin.key()], "which": "best", "time": utc_now()}  # the same commit, trained once
                else:
                    runner = runners.get(cell.env)
                    if runner is None:
                        grace = config.grace_s if budget == config.budget_s else budget_allowance(budget)
                        cfg = dataclasses.replace(config, env_id=cell.env, budget_s=budget, grace_s=grace)
                        runner = runners[cell.env] = factory(cfg, folder, workspace, stop, journal, harness_bytes)
                        for record in leftovers:  # what a killed transfer left running
                            for handle in record.get("handles", []):
                                cancel_handle(handle, runner)
                        leftovers = []
                        if not prepare_backends(cfg, folder, workspace, runner, journal, stop, say):
                            stats["stopped"] = True
                            break
                    row = _measure(runner, journal, folder, cell, index, len(todo), say)
                    if row is None:
                        stats["stopped"] = True
                        break
                    stats["trained"] += 1
                append_row(folder.transfer_tsv, row)
                done[cell.key()] = row
            journal.clear()
    finally:
        for runner in runners.values():
            runner.close()
        lock.release()
    frame = load_frame(folder.transfer_tsv)
    if frame is not None:
        png = transfer_png(frame, title=f"{config.tag} on other envs ({budget:g}s budget)")
        (folder.path / RunFolder.TRANSFER_PNG).write_bytes(png)
    return stats


# ---------------------------------------------------------------- an env's backend
def prepare_backends(config: RunConfig, folder: RunFolder, workspace: Workspace, runner: Runner, journal: InFlight,
                     stop: StopControl, say: Callable[[str], None]) -> bool:
    """Before the first cell of config.env_id: verify and benchmark the backends the start commit ships
    for it, as the run's setup did for its own env (shipped.verify_at_setup, through the env's runner,
    records from the user cache where they apply), so train.py's auto trains on the fastest verified
    one; say which and why. Once per env: a second transfer reads transfer/<env>/backend.json. False
    when stopped (the next call verifies what is left)."""
    env = config.env_id
    stage = Stage(f"transfer {env}", "by transfer", folder.transfer_env(env), before="earlier in this run")
    saved = stage.saved_choice()
    if saved:
        say(f"{env}: {choice_line(saved)} (chosen by an earlier transfer)")
        return True
    if not config.setup_verify:
        say(f"{env}: its backends are not verified (the run was started with --no-setup-verify): it trains on "
            f"what the run's cache has verified, as train.py's auto decides")
        return True
    stage.home.mkdir(parents=True, exist_ok=True)
    say(f"{env}: verifying (L1-L3) and benchmarking the backends {config.base_commit[:7]} ships for it "
        f"(reports in {stage.home / 'setup'})")
    journal.begin(0, "transfer", "verify", 0, commit=config.base_commit)  # its handles: cancelled after a kill
    try:
        choice = verify_at_setup(config, folder, workspace, runner, journal, stop.requested, stage)
    except Exception as exc:  # a bug or a broken cache costs speed, never the transfer
        log.exception("%s: verifying the backends failed", stage.name)
        say(f"{env}: verifying its backends failed ({type(exc).__name__}: {exc}); it trains on what is verified "
            f"already")
        return True
    finally:
        journal.end(0)
    if choice is None:
        say(f"{env}: stopped while verifying its backends (the next `transfer` goes on from there)")
        return False
    for backend in choice["backends"]:
        if backend["passed"] is False:
            say(f"{env}: {backend['backend']} FAILED verification, not trained on: {backend['how']} "
                f"(report {backend['report']})")
    say(f"{env}: {choice_line(choice)} [{choice['setup_seconds']:.0f}s to choose]")
    return True


# ---------------------------------------------------------------- a cell
def _measure(runner, journal: InFlight, folder: RunFolder, cell: Cell, index: int, total: int,
             say: Callable[[str], None]) -> Optional[dict]:
    """Train and score one cell; None when it was interrupted (it is then not recorded)."""
    label = f"transfer {index}/{total}: {cell.env} {cell.which} seed {cell.seed}"
    say(f"{label}: training {cell.commit[:7]} for {cell.budget_s:g}s")
    slot = Slot(index, folder.transfer_cell(cell.env, cell.which, cell.seed), label)
    journal.begin(index, "transfer", "train", 0, commit=cell.commit)
    try:
        m = runner.measure(slot, cell.commit, cell.seed)
    finally:
        journal.end(index)
    if m.status == "interrupted":
        say(f"{label}: interrupted (not recorded; the next `transfer` retrains it)")
        return None
    result = m.evaluation or {}
    row = {"env": cell.env, "which": cell.which, "seed": cell.seed, "commit": cell.commit, "budget_s": cell.budget_s,
           "status": m.status or "ok", "score": m.score, "se": result.get("se"), "iqm": result.get("iqm"),
           "env_steps": m.env_steps, "sps": m.sps, "wall_s": m.wall_s, "time": utc_now()}
    if m.status:
        say(f"{label}: {m.status} ({m.note}); see {slot.folder.train_log}")
        log.warning("%s: %s (%s)", label, m.status, m.note)
    else:
        se = result.get("se", float("nan"))
        say(f"{label}: score {m.score:.2f} (se {se:.2f}){_trained_on(slot.folder.train_log)}")
    return row


def _trained_on(train_log: Path) -> str:
    """`, trained on mujoco_batch (jax-host path)` from train.py's summary lines ("" when it says nothing)."""
    try:
        summary = parse_summary(train_log.read_text(errors="replace"))
    except OSError:
        return ""
    backend, path = summary.get("backend"), summary.get("path")
    return f", trained on {backend}" + (f" ({path} path)" if path else "") if backend else ""
