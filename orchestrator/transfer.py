"""`python -m orchestrator transfer`: does the night's train.py transfer to other environments?

The run's starting train.py (its base commit) and its best (the branch tip) are each trained on
every given env with the same budget and seeds, through the same runner as the run's
experiments (`setup.make_runner`, so on Modal when the run used Modal), and scored by the
run's trusted harness copy with its held-out seed. One row per cell goes to
`results/<tag>/transfer.tsv` as it finishes (fsynced); `transfer.png` shows baseline vs best
per env with 95% CIs. Finished cells are never retrained: a second call picks up where the
first stopped (a cell is identified by env, which, seed, commit and budget).

Each cell's files (train.log, eval.json, policy) are in `results/<tag>/transfer/<env>/<which>-seed<N>/`;
the transfer's own journal, lock and stop file are in `results/<tag>/transfer/`, never touching
those of the run.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .config import RunConfig, RunError
from .daemon import LockHeld, RunLock, StopControl, lock_holder, log
from .inflight import InFlight, recorded
from .results import RunFolder, utc_now
from .runners import Slot, cancel_handle
from .workspace import Workspace

COLUMNS = ("env", "which", "seed", "commit", "budget_s", "status", "score", "se", "iqm", "env_steps", "sps",
           "wall_s", "time")
WHICH = ("baseline", "best")          # the run's starting train.py, its best train.py


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


# ---------------------------------------------------------------- transfer.tsv
def read_rows(path: Path) -> list[dict]:
    """The finished cells (a torn last line, from a kill mid-write, is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")[:-1]
    if not lines:
        return []
    rows = []
    for record in csv.DictReader(lines, delimiter="\t"):
        if None in record.values() or set(record) != set(COLUMNS):
            continue
        try:
            record["seed"], record["budget_s"] = int(record["seed"]), float(record["budget_s"])
        except ValueError:
            continue
        rows.append(record)
    return rows


def row_key(row: dict) -> tuple:
    return row["env"], row["which"], int(row["seed"]), row["commit"], float(row["budget_s"])


def append_row(path: Path, row: dict) -> None:
    path = Path(path)
    text = ("" if path.exists() and path.stat().st_size else "\t".join(COLUMNS) + "\n")
    text += "\t".join(_cell_text(row.get(c)) for c in COLUMNS) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _cell_text(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:.0f}"
    return " ".join(str(value).split())


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

    from .setup import make_runner

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
                    grace = config.grace_s if budget == config.budget_s else max(30.0, 0.1 * budget)
                    cfg = dataclasses.replace(config, env_id=cell.env, budget_s=budget, grace_s=grace)
                    runner = runners[cell.env] = factory(cfg, folder, workspace, stop, journal, harness_bytes)
                    for record in leftovers:  # what a killed transfer left running
                        for handle in record.get("handles", []):
                            cancel_handle(handle, runner)
                    leftovers = []
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
        say(f"{label}: score {m.score:.2f} (se {result.get('se', float('nan')):.2f})")
    return row


# ---------------------------------------------------------------- the table and the chart
def load_frame(path: Path):
    import pandas as pd

    rows = read_rows(path)
    if not rows:
        return None
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for column in ("score", "se", "iqm", "env_steps", "sps", "wall_s"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def seed_ci(scores, se_of_one: Optional[float] = None) -> tuple[float, float]:
    """95% CI of the mean over seeds: a percentile bootstrap over seeds (as rliable does) with two
    or more, else +-1.96 se of the one run's evaluation episodes."""
    from scipy.stats import bootstrap

    scores = np.asarray(scores, dtype=float)
    if scores.size >= 2:
        if np.ptp(scores) == 0:
            return float(scores[0]), float(scores[0])
        ci = bootstrap((scores,), np.mean, method="percentile", n_resamples=10_000,
                       rng=np.random.default_rng(0)).confidence_interval
        return float(ci.low), float(ci.high)
    if scores.size == 1 and se_of_one is not None and se_of_one == se_of_one:
        return float(scores[0] - 1.96 * se_of_one), float(scores[0] + 1.96 * se_of_one)
    return math.nan, math.nan


def summary(frame):
    """Per env: baseline and best mean score over seeds with a 95% CI (`seed_ci`), and the change.
    The latest row of each (env, which, seed) counts."""
    import pandas as pd

    latest = frame.drop_duplicates(["env", "which", "seed"], keep="last")
    out = []
    for env in dict.fromkeys(latest.env):
        record = {"env": env}
        for which in WHICH:
            part = latest[(latest.env == env) & (latest.which == which)]
            scored = part[part.score.notna()]
            low, high = seed_ci(scored.score, float(scored.se.iloc[0]) if len(scored) == 1 else None)
            record[which] = float(scored.score.mean()) if len(scored) else math.nan
            record[f"{which}_low"], record[f"{which}_high"] = low, high
            record[f"{which}_seeds"] = len(scored)
            record[f"{which}_failed"] = int((part.status != "ok").sum())
        base = record["baseline"]
        record["change"] = record["best"] - base
        record["change_pct"] = 100 * record["change"] / abs(base) if base and base == base else math.nan
        out.append(record)
    return pd.DataFrame(out)


def summary_text(frame) -> str:
    table = summary(frame)
    lines = [f"{'env':<18} {'baseline [95% CI]':>26} {'best [95% CI]':>26} {'change':>16}  seeds"]
    for r in table.itertuples():
        failed = r.baseline_failed + r.best_failed
        lines.append(f"{r.env:<18} {_ci(r.baseline, r.baseline_low, r.baseline_high):>26} "
                     f"{_ci(r.best, r.best_low, r.best_high):>26} {_signed(r.change):>9} {_pct(r.change_pct):>6}  "
                     f"{r.baseline_seeds}/{r.best_seeds}" + (f"  ({failed} failed)" if failed else ""))
    return "\n".join(lines)


def _ci(value: float, low: float, high: float) -> str:
    if value != value:
        return "-"
    return f"{value:.1f}" + (f" [{low:.1f}, {high:.1f}]" if low == low else "")


def _signed(value: float) -> str:
    return "-" if value != value else f"{value:+.1f}"


def _pct(value: float) -> str:
    return "" if value != value else f"({value:+.0f}%)"


def transfer_png(frame, title: str = "transfer") -> bytes:
    """One panel per env: baseline vs best, mean over seeds with a 95% CI, each seed a dot."""
    import io

    from matplotlib.figure import Figure

    table = summary(frame)
    latest = frame.drop_duplicates(["env", "which", "seed"], keep="last")
    n = len(table)
    cols = min(4, max(1, n))
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(2.9 * cols + 0.4, 3.1 * rows + 0.5), dpi=110)
    fig.subplots_adjust(left=0.1 if cols > 1 else 0.2, right=0.97, top=1 - 0.75 / (3.1 * rows + 0.5),
                        bottom=0.08 / rows, wspace=0.45, hspace=0.55)
    colors = {"baseline": "#4575b4", "best": "#1a9850"}
    for i, r in enumerate(table.itertuples()):
        ax = fig.add_subplot(rows, cols, i + 1)
        for x, which in enumerate(WHICH):
            mean, low, high = getattr(r, which), getattr(r, f"{which}_low"), getattr(r, f"{which}_high")
            if mean == mean:
                yerr = [[mean - low], [high - mean]] if low == low else None
                ax.bar(x, mean, width=0.6, color=colors[which], alpha=0.85, yerr=yerr, capsize=5,
                       error_kw={"lw": 1.2})
            seeds = latest[(latest.env == r.env) & (latest.which == which)].score.dropna()
            ax.scatter(np.full(len(seeds), x) + np.linspace(-0.12, 0.12, len(seeds)), seeds, s=12, color="black",
                       zorder=3)
        ax.axhline(0, color="#444", lw=0.6)
        ax.set_xticks([0, 1], ["baseline", "best"])
        ax.set_title(r.env, fontsize=9.5, loc="left")
        if r.change_pct == r.change_pct:
            ax.set_title(f"{r.change_pct:+.0f}%", fontsize=9.5, loc="right",
                         color="#1a7f37" if r.change_pct > 0 else "#cf222e" if r.change_pct < 0 else "#444")
        ax.grid(axis="y", alpha=0.25)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(labelsize=8)
    fig.suptitle(f"{title}: mean eval return of the starting vs the best train.py\n"
                 "(whiskers: 95% CI, bootstrap over seeds; one seed: over episodes. dots: seeds)", fontsize=9, x=0.01,
                 ha="left")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
