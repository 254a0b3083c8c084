"""results.tsv (the schema, a durable append, a reader that tolerates a torn last line) and the
names of every file in a run folder `results/<tag>/` and an experiment folder `exp-NNNN/`."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

COLUMNS = ("exp", "time", "phase", "commit", "status", "score", "best",
           "env_steps", "sps", "wall_s", "cost_usd", "budget_s", "description")
HEADER = "\t".join(COLUMNS) + "\n"
# screened: a train candidate that stopped at its screen (--screen F: trained at F x the budget and
# not promising); its score is at that shorter budget, so nothing is ever kept on it
STATUSES = ("baseline", "keep", "discard", "crash", "timeout", "invalid", "interrupted", "screened")


@dataclass
class Row:
    exp: int
    phase: str
    status: str
    commit: str = ""
    score: Optional[float] = None
    best: Optional[float] = None
    env_steps: Optional[int] = None
    sps: Optional[float] = None
    wall_s: Optional[float] = None
    cost_usd: float = 0.0
    description: str = ""
    time: str = ""
    budget_s: Optional[float] = None      # the training budget the score was measured at (none: not trained)

    @classmethod
    def of(cls, exp: int, phase: str, status: str, measured, commit: str = "", best: Optional[float] = None,
           wall_s: Optional[float] = None, cost_usd: float = 0.0, description: str = "") -> "Row":
        """The row of an experiment from what its runner measured (anything with score, env_steps,
        sps and budget_s: a runner's Measurement), with the status and description its judge gave it."""
        return cls(exp=exp, phase=phase, status=status, commit=commit, score=measured.score, best=best,
                   env_steps=measured.env_steps, sps=measured.sps, wall_s=wall_s, cost_usd=cost_usd,
                   budget_s=getattr(measured, "budget_s", None),
                   description=description)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {', '.join(STATUSES)}")
        if not self.time:
            self.time = utc_now()

    def to_line(self) -> str:
        values = {
            "exp": str(self.exp),
            "time": self.time,
            "phase": self.phase,
            "commit": self.commit,
            "status": self.status,
            "score": _fmt(self.score, ".3f"),
            "best": _fmt(self.best, ".3f"),
            "env_steps": _fmt(self.env_steps, "d"),
            "sps": _fmt(self.sps, ".0f"),
            "wall_s": _fmt(self.wall_s, ".1f"),
            "cost_usd": _fmt(self.cost_usd, ".4f"),
            "budget_s": _fmt(self.budget_s, "g"),
            "description": one_line(self.description),
        }
        return "\t".join(values[c] for c in COLUMNS) + "\n"

    @classmethod
    def from_fields(cls, parts: list[str], columns=COLUMNS) -> "Row":
        raw = dict(zip(columns, parts))
        return cls(
            exp=int(raw["exp"]), time=raw["time"], phase=raw["phase"], commit=raw["commit"],
            status=raw["status"], score=_float(raw["score"]), best=_float(raw["best"]),
            env_steps=_int(raw["env_steps"]), sps=_float(raw["sps"]), wall_s=_float(raw["wall_s"]),
            cost_usd=_float(raw["cost_usd"]) or 0.0, budget_s=_float(raw.get("budget_s", "")),
            description=raw["description"],
        )


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def one_line(text: str) -> str:
    """Tabs and newlines would break the TSV; descriptions are one line by contract."""
    return " ".join(str(text).split())


def _fmt(value, spec: str) -> str:
    if value is None:
        return ""
    if spec == "d":
        return str(int(value))
    return format(float(value), spec)


def _float(text: str) -> Optional[float]:
    return float(text) if text.strip() else None


def _int(text: str) -> Optional[int]:
    return int(float(text)) if text.strip() else None


class ResultsFile:
    """One run's results.tsv. Appends are fsynced so a row, once logged, survives a power cut."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def create(self) -> None:
        if not self.path.exists():
            self._write_durably(HEADER)

    def read(self) -> list[Row]:
        """All complete rows. A last line without its newline is a torn write and is ignored."""
        if not self.path.exists():
            return []
        text = self.path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        complete = lines[:-1]  # the piece after the last newline is empty or torn
        columns = tuple(complete[0].split("\t")) if complete else COLUMNS  # (a run from before budget_s)
        rows = []
        for line in complete[1:]:
            parts = line.split("\t")
            if len(parts) != len(columns):
                continue
            try:
                rows.append(Row.from_fields(parts, columns))
            except (ValueError, KeyError):
                continue
        return rows

    def upgrade(self) -> bool:
        """Rewrite a results.tsv of an older schema (no budget_s) in today's, its rows unchanged,
        before a resumed run appends to it (atomically: a crash leaves the old file or the new)."""
        if not self.path.exists():
            return False
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            if handle.readline() == HEADER:
                return False
        rows = self.read()
        tmp = self.path.with_suffix(".tsv.upgrading")
        tmp.write_text(HEADER + "".join(row.to_line() for row in rows), encoding="utf-8")
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        tmp.replace(self.path)
        return True

    def repair_torn_tail(self) -> Optional[str]:
        """Cut a torn last line (so the next append starts on a fresh line); return what was cut."""
        if not self.path.exists():
            return None
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return None
        cut = data.rfind(b"\n") + 1
        with open(self.path, "r+b") as handle:
            handle.truncate(cut)
            handle.flush()
            os.fsync(handle.fileno())
        return data[cut:].decode("utf-8", errors="replace")

    def append(self, row: Row) -> None:
        self._write_durably(row.to_line())

    def _write_durably(self, text: str) -> None:
        """Append all of `text` or nothing: a write cut short (a full disk) is truncated away."""
        data = text.encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            before = os.fstat(fd).st_size
            try:
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, before)
                raise
        finally:
            os.close(fd)


def summarize(rows: list[Row]) -> dict:
    """What status and the agents want to know about a run: baseline, best, counts, cost."""
    baseline = [r.score for r in rows if r.status == "baseline" and r.score is not None]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    best_row = None
    for row in rows:
        if row.status in ("baseline", "keep"):
            best_row = row
    best = next((r.best for r in reversed(rows) if r.best is not None), None)
    return {
        "baseline_scores": baseline,
        "best": best,
        "best_commit": best_row.commit if best_row else "",
        "best_exp": best_row.exp if best_row else None,
        "experiments": len({r.exp for r in rows if r.exp > 0}),
        "counts": counts,
        "cost_usd": sum(r.cost_usd for r in rows),
    }


def compact_table(rows: list[Row], last: int = 40) -> str:
    """The results so far, as the agent sees them: one short line per experiment."""
    lines = ["exp\tstatus\tscore\tbest\tdescription"]
    for row in rows[-last:]:
        lines.append("\t".join([str(row.exp), row.status, _fmt(row.score, ".2f"),
                                _fmt(row.best, ".2f"), row.description]))
    return "\n".join(lines)


# ---------------------------------------------------------------- the files of a run folder
class RunFolder:
    """`results/<tag>/`: what the daemon writes for a run (candidate code never sees it)."""

    RESULTS = "results.tsv"
    CONFIG = "run.json"            # configuration, held-out seed, harness hash
    STATE = "state.json"           # the experiments in flight and their runner handles
    LOG = "daemon.log"
    LOCK = "daemon.lock"
    STOP = "STOP"                  # written by `stop`
    HARNESS = "evaluate.py"        # the trusted copy of the harness
    OPTUNA = "optuna.db"
    NOTES = "notes.md"             # the LLM agent's own notes
    VERIFY_CACHE = "verify-cache"  # verdicts and throughput of this run's backends
    JAX_CACHE = "jax-cache"        # jax-cache/<commit>-<n>/: the JAX compilation cache of one train run (gone after it)
    REPORT_HTML = "report.html"    # the morning report, rewritten after every experiment
    PROGRESS_PNG = "progress.png"  # every experiment, the running best, the kept ones annotated
    TRANSFER_TSV = "transfer.tsv"  # `transfer`: the starting and the best train.py on other envs
    TRANSFER_PNG = "transfer.png"
    TRANSFER = "transfer"          # `transfer`'s cells (ExpFolders), its journal, lock and log
    SCREEN = "screen"              # --screen: screen/<commit>/, the best commit's run at the screen's budget
    MODAL_ENVIRONMENT = "modal-environment.json"  # --runner modal: what its containers run (names its records)

    def __init__(self, path: Path):
        self.path = Path(path)

    def __getattr__(self, name: str) -> Path:  # folder.results -> path / "results.tsv"
        upper = name.upper()
        if upper != name and upper in type(self).__dict__:
            return self.path / type(self).__dict__[upper]
        raise AttributeError(name)

    def exp(self, exp: int) -> "ExpFolder":
        return ExpFolder(self.path / f"exp-{exp:04d}")

    def transfer_env(self, env_id: str) -> Path:
        """`transfer`'s folder of one env: transfer/Hopper-v5/ (its cells, its setup/ and backend.json)."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in env_id)
        return self.path / self.TRANSFER / safe

    def transfer_cell(self, env_id: str, which: str, seed: int) -> "ExpFolder":
        """One train-and-score of `transfer`: e.g. transfer/Hopper-v5/best-seed1/."""
        return ExpFolder(self.transfer_env(env_id) / f"{which}-seed{seed}")


class ExpFolder:
    """`results/<tag>/exp-NNNN/`: everything about one experiment besides its row."""

    TRAIN_LOG = "train.log"
    EVAL_JSON = "eval.json"        # the harness's result: mean, se, per-episode returns
    EVAL_LOG = "eval.log"
    OUT = "out"                    # AUTORL_OUTPUT_DIR: the policy artifact
    DIFF = "diff.patch"
    FAILURE = "failure.txt"        # what the agent is shown next time
    CONFIRM = "confirm"            # the first confirmation run, an ExpFolder of its own (confirm-2/, ... the next)
    DECISION = "decision.json"     # a train experiment's keep rule evidence: noise, pairs, thresholds
    TRANSLATE = "translate.json"   # a translate experiment's benchmark record
    BENCH = "bench.json"
    BENCH_INCUMBENT = "bench-incumbent.json"
    BENCH_PAIR = "bench-pair.json"  # the candidate and the incumbent side by side: what the keep decision reads
    VERIFY = "verify.json"         # the last verification round's full report
    SCREEN = "screen"              # --screen: the candidate's run at the screen's budget (an ExpFolder)
    TRANSCRIPT = "agent.jsonl"
    PROMPT = "prompt.md"
    AGENT_LOG = "agent.log"
    AGENT_ERR = "agent.err.log"

    def __init__(self, path: Path):
        self.path = Path(path)

    def __getattr__(self, name: str) -> Path:
        upper = name.upper()
        if upper != name and upper in type(self).__dict__:
            return self.path / type(self).__dict__[upper]
        raise AttributeError(name)

    def run(self, index: int) -> "ExpFolder":
        """Baseline run N (N >= 2) lives in a subfolder of experiment 0's."""
        return self if index <= 1 else ExpFolder(self.path / f"run-{index}")

    def confirmation(self, k: int) -> "ExpFolder":
        """Confirmation run k (1, 2, ...) of a train experiment."""
        return ExpFolder(self.path / (self.CONFIRM if k <= 1 else f"{self.CONFIRM}-{k}"))

    def confirmations(self) -> list["ExpFolder"]:
        """The confirmation runs this experiment has, in order (they are made one after another)."""
        found, k = [], 1
        while self.confirmation(k).path.is_dir():
            found.append(self.confirmation(k))
            k += 1
        return found

    def verify_round(self, round_: int) -> tuple[Path, Path]:
        return self.path / f"verify.r{round_}.json", self.path / f"verify.r{round_}.log"


class ScheduleFolder:
    """`results/_schedule/` (a name no tag can take): the `schedule` process's state (its nights,
    the next start), log and lock."""

    NAME = "_schedule"
    STATE = "schedule.json"
    LOG = "schedule.log"
    LOCK = "daemon.lock"

    def __init__(self, results_root: Path):
        self.path = Path(results_root) / self.NAME

    def __getattr__(self, name: str) -> Path:
        upper = name.upper()
        if upper != name and upper in type(self).__dict__:
            return self.path / type(self).__dict__[upper]
        raise AttributeError(name)


__all__ = ["RunFolder", "ExpFolder", "ScheduleFolder", "COLUMNS", "HEADER", "STATUSES", "Row", "ResultsFile",
           "summarize", "compact_table",
           "utc_now", "one_line"]


def read_json(path: Path) -> dict:
    """A run-folder JSON file as a dict; {} when it is missing, torn or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
