"""What a run is: its configuration (run.json), its limits, the parsed `run` command, and names.

RunConfig fixes a run's scores and is kept across resumes; Options is what one `run` command
asked for; Limits say when this session stops.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Optional

BASELINE_RUNS = 4       # runs of the start commit (--baselines): the best's first mean and the noise's first
                        # measure; with 2, a 5%-per-night rule cannot confirm 3 sigma (bench/nights.py, README)
FIRST_CONFIRM_SEED = 10_000  # confirmation seeds from here on (keep_rule.first_confirmation_seed): far above
                             # every baseline and start re-measure seed (1 .. 2 x --baselines)


# How long past its budget an artifact may still be completed (--export-margin): train.py stops launching
# updates at the budget, then exports (a TorchScript save: well under a second), and the daemon looks at
# the file every 0.5 s. Later than this it trained on time it was not given.
EXPORT_MARGIN_S = 3.0


def budget_allowance(budget_s: float) -> float:
    """The default kill deadline past the budget (--grace), for a run that hangs after or instead of
    exporting: its artifact is due by EXPORT_MARGIN_S, and this leaves time for the export's check and
    the process's exit on a loaded machine. Small on purpose: a train.py that stretches its own budget
    (2.5x at 10 s) is killed and recorded `invalid`."""
    return max(10.0, 0.05 * budget_s)


class RunError(Exception):
    """A problem the user must fix before the run can go on (the message says what)."""


@dataclass
class RunConfig:
    """What fixes a run's scores; written to results/<tag>/run.json and kept across resumes."""
    tag: str
    env_id: str
    budget_s: float
    grace_s: float                        # the kill deadline past the budget, for a run that hangs
    eval_episodes: int
    eval_seed: int                        # held out: drawn at setup, kept only in run.json
    train_seeds: list[int]
    confirm_seed: int
    eval_timeout_s: float
    eval_workers: Optional[int]
    schedule: list[str]
    main_root: str
    worktree: str
    branch: str
    base_commit: str
    harness_sha256: str
    created: str
    agent: str                            # what a --resume without --agent uses again
    agent_options: dict = field(default_factory=dict)
    schedule_from_agent: bool = False     # replay: each folder's files say its phase
    # where and how many experiments run at once
    runner: str = "local"
    parallel: int = 1
    runner_options: dict = field(default_factory=dict)   # modal: gpu, cpu, price table
    screen: Optional[float] = None        # train candidates first at screen x budget (--screen; None: off)
    # walls around candidate code
    sandbox: str = "auto"                 # auto / require / off (recorded: a run with off says so)
    max_output_mb: float = 1024.0         # what an experiment may write into AUTORL_OUTPUT_DIR
    # the budget is exact: an artifact completed later than budget + this is invalid (--export-margin)
    export_margin_s: float = EXPORT_MARGIN_S
    # translate phase
    repair_rounds: int = 3
    target_speedup: float = 100.0
    translate_patience: int = 3
    translate_lang: str = "auto"          # jax / rust / auto (the agent chooses; JAX only without rustc)
    verify_timeout_s: float = 1800.0
    bench_seconds: float = 2.0
    setup_verify: bool = True             # setup verified and benchmarked the backends the start commit ships
    # a created environment (envs/<name>/): frozen during the run, checked by the harness
    env_folder: Optional[str] = None
    env_sha256: Optional[str] = None

    @classmethod
    def load(cls, path: Path) -> "RunConfig":
        data = json.loads(Path(path).read_text())
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def save(self, path: Path) -> None:
        path = Path(path)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        tmp.replace(path)  # never half-written


@dataclass
class Limits:
    """When this session stops (besides a stop request). None: no limit."""
    max_experiments: Optional[int] = None     # experiments after the baseline, in the whole run
    deadline: Optional[float] = None          # epoch seconds (--until, --max-hours)
    max_cost: Optional[float] = None          # USD, the whole run (agent and compute)
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0


@dataclass
class Options:
    """A parsed `run` command (the CLI builds it; tests may too)."""
    env_id: Optional[str] = None
    tag: Optional[str] = None
    agent: Optional[str] = None
    resume: bool = False
    budget_s: Optional[float] = None
    grace_s: Optional[float] = None
    export_margin_s: Optional[float] = None
    eval_episodes: Optional[int] = None
    eval_timeout_s: float = 1800.0
    eval_workers: Optional[int] = None
    phases: Optional[str] = None
    schedule: Optional[str] = None
    repair_rounds: int = 3
    target_speedup: float = 100.0
    translate_patience: int = 3
    translate_lang: Optional[str] = None      # jax / rust / auto (default)
    bench_seconds: float = 2.0
    setup_verify: bool = True                 # --no-setup-verify: False
    runner: Optional[str] = None              # local (default) or modal; a resume keeps the run's
    parallel: Optional[int] = None            # candidates per round (default 1)
    runner_options: dict = field(default_factory=dict)
    screen: Optional[float] = None            # --screen F (0 < F < 1); a resume keeps the run's unless given
    baselines: Optional[int] = None           # --baselines N (default BASELINE_RUNS); fixed for the run
    sandbox: Optional[str] = None             # auto (default) / require / off
    max_output_mb: Optional[float] = None     # default 1024
    limits: Limits = field(default_factory=Limits)
    rescore_seeds: int = 2                    # --rescore K: the start and the best on K fresh seeds at the end
    repo: Optional[Path] = None
    agent_args: object = None                 # the argparse namespace, for the agent factory
    runner_factory: Optional[Callable] = None  # tests: build the runner (e.g. Modal against a fake)


# ---------------------------------------------------------------- names
def env_slug(env_id: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", env_id.lower()).strip("_")


def default_tag(env_id: str, now: Optional[datetime] = None) -> str:
    """`bipedalwalker_v3-nov22`; a created env `envs.<name>.env:Env` is named by its folder."""
    now = now or datetime.now()
    created = re.match(r"^envs\.([a-z][a-z0-9_]*)\.", env_id)
    name = created[1] if created else env_slug(env_id)
    return f"{name}-{now.strftime('%b').lower()}{now.day}"


TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_tag(tag: str) -> str:
    if not TAG_PATTERN.match(tag) or ".." in tag or tag.endswith((".lock", ".")):
        raise RunError(f"bad tag {tag!r}: use letters, digits, '.', '_' and '-' (it names a git branch)")
    return tag


def parse_until(text: str, now: Optional[datetime] = None) -> float:
    """`--until HH:MM` (local time): the next time the clock shows it."""
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not match or int(match[1]) > 23 or int(match[2]) > 59:
        raise RunError(f"--until wants HH:MM (24-hour local time), got {text!r}")
    now = now or datetime.now()
    target = now.replace(hour=int(match[1]), minute=int(match[2]), second=0, microsecond=0)
    if target <= now:
        target += timedelta(days=1)
    return target.timestamp()
