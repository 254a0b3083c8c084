"""Argument parsing only: `python -m orchestrator run|create|export|status|stop|report|transfer|schedule|pull|...`."""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

from .agents import AGENT_KINDS, CREATE_AGENT_KINDS, add_agent_arguments
from .config import BASELINE_RUNS

USAGE_EXAMPLE = "python -m orchestrator run --env CartPole-v1 --budget 30 --max-experiments 3"
# Below this no train.py can start Python, import torch and export a policy: such a budget is a slip
# (minutes or hours typed as seconds), refused before a run folder exists.
MIN_BUDGET_S = 2.0


class OneLineErrorParser(argparse.ArgumentParser):
    """A wrong option or value costs one line on stderr (exit 2), with the closest valid choice,
    rather than a screen of usage in which the error is the last line."""

    def error(self, message: str):
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            close = difflib.get_close_matches(wrong.group(1), choices, n=1, cutoff=0.5)
            if close:
                message += f"; did you mean {close[0]!r}?"
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def _budget(text: str) -> float:
    value = _positive_float(text)
    if value < MIN_BUDGET_S:
        raise argparse.ArgumentTypeError(
            f"{text} s is too short to train at all (start-up and the policy's export alone take about "
            f"{MIN_BUDGET_S:g} s); the budget is seconds of training per experiment, e.g. 720")
    return value


def _at_least_two(text: str) -> int:
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text}: at least 2 (one pair of runs is the least that measures noise)")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text} must be below 1 (a fraction of the budget)")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m orchestrator",
        description="autorl: an overnight autoresearch daemon for reinforcement learning.",
        epilog=f"first run: {USAGE_EXAMPLE}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{run,create,export,status,stop,report,transfer,schedule,pull,verify,bench}")

    run = sub.add_parser("run", help="start (or --resume) a run; loops until a limit or `stop`",
                         description="Train, score with the fixed harness, keep or revert, repeat.")
    run.add_argument("--env", dest="env_id", metavar="ENV_ID", help="gymnasium env id, e.g. BipedalWalker-v3")
    run.add_argument("--tag", help="run name (default: <env slug>-<mon><day>, e.g. bipedalwalker_v3-nov21)")
    run.add_argument("--agent", choices=AGENT_KINDS,
                     help="default: anthropic when ANTHROPIC_API_KEY is set, else optuna (offline)")
    run.add_argument("--budget", dest="budget_s", type=_budget, metavar="SECONDS",
                     help="training wall-clock budget per experiment (default: evaluate.TIME_BUDGET)")
    run.add_argument("--baselines", type=_at_least_two, metavar="N",
                     help=f"train the start commit N times before the first experiment (default {BASELINE_RUNS}): the best "
                          "to beat is their mean and they are the first measure of the seed noise; each one "
                          "more costs a budget once and makes every keep decision sharper; a start whose runs "
                          "spread significantly wider than its candidates' is trained again, up to 2N")
    run.add_argument("--max-experiments", type=_non_negative_int, metavar="N",
                     help="stop after N experiments (after the baseline, whole run)")
    run.add_argument("--until", metavar="HH:MM", help="stop before this local time")
    run.add_argument("--max-hours", type=_positive_float, metavar="H", help="stop after H hours")
    run.add_argument("--max-cost", type=_positive_float, metavar="USD",
                     help="stop once the run's cost (the agent's, and compute on Modal) reaches this")
    run.add_argument("--resume", action="store_true", help="continue an existing run (after a stop or crash)")
    run.add_argument("--from", dest="from_ref", metavar="REF",
                     help="a new run's branch starts from REF (e.g. autorl/<tag>: an earlier run's best) "
                          "instead of the checkout's HEAD")
    where = run.add_argument_group("where experiments run")
    where.add_argument("--runner", choices=("local", "modal"),
                       help="local process groups (default) or Modal containers (needs `modal token new`)")
    where.add_argument("--parallel", type=_positive_int, metavar="K",
                       help="train K candidates at once per round, from the same best commit (default 1)")
    where.add_argument("--screen", type=_fraction, metavar="F",
                       help="train each candidate first for F x the budget (0 < F < 1, e.g. 0.25) beside the "
                            "best commit at the same F and seed; only one that screens at least as well is "
                            "trained at the full budget, and only full-budget runs are ever kept (default off)")
    where.add_argument("--modal-gpu", metavar="GPU", help="modal: GPU of a training container (default H100)")
    where.add_argument("--modal-cpu", type=_positive_float, metavar="CORES",
                       help="modal: CPU cores of a training container, for env stepping (default 8)")
    where.add_argument("--modal-price-table", metavar="FILE.json",
                       help="modal: a JSON file of USD per hour per GPU type and per CPU core (\"cpu_core\"), e.g. "
                            "{\"H100\": 3.95, \"cpu_core\": 0.047}; it overrides the built-in table")
    run.add_argument("--rescore", type=int, default=2, metavar="K",
                     help="at the end, train the start and the best again on K fresh seeds and lead the summary with "
                          "that out-of-sample gain (default 2; 0: none)")
    walls = run.add_argument_group("walls around candidate code")
    walls.add_argument("--sandbox", choices=("auto", "require", "off"),
                       help="bubblewrap sandbox for train/eval/verify/bench and the agent's run tool: auto (default; "
                            "used where available), require (refuse to run without), off (debugging; recorded)")
    walls.add_argument("--max-output-mb", type=_positive_float, metavar="MB",
                       help="what one experiment may write into AUTORL_OUTPUT_DIR (default 1024); past it: crash")
    add_agent_arguments(run)
    phases = run.add_argument_group("phases")
    phases.add_argument("--phases", help="phases to run: translate,train (default for the anthropic and command "
                                         "agents), train (optuna); replay follows its folders' files")
    phases.add_argument("--schedule", help="alternation pattern (default translate:1,train:4 when both phases run)")
    phases.add_argument("--repair-rounds", type=_non_negative_int, default=3, metavar="N",
                        help="translate: repair rounds from the verifier's report per experiment (default 3)")
    phases.add_argument("--target-speedup", type=_positive_float, default=100.0, metavar="X",
                        help="translate: stop translating once the backend is X times the reference (default 100)")
    phases.add_argument("--translate-patience", type=_positive_int, default=3, metavar="N",
                        help="translate: stop after N translate experiments without a gain (default 3)")
    phases.add_argument("--translate-lang", choices=("jax", "rust", "auto"),
                        help="translate: the backend's language; auto (default) lets the agent choose, "
                             "JAX only when rustc is not on PATH")
    phases.add_argument("--bench-seconds", type=_positive_float, default=2.0, help=argparse.SUPPRESS)
    phases.add_argument("--no-setup-verify", dest="setup_verify", action="store_false",
                        help="a new run skips verifying (L1-L3) and benchmarking the backends its commit ships "
                             "(envs_fast/translations/<slug>.py/.rs, gymnax): the baseline trains on what is already verified")
    adv = run.add_argument_group("advanced (mainly for tests)")
    adv.add_argument("--eval-episodes", type=_positive_int, metavar="N",
                     help="evaluation episodes (default: evaluate.NUM_EVAL_EPISODES)")
    adv.add_argument("--eval-workers", type=_positive_int, metavar="N",
                     help="evaluation processes (default: evaluate.py's choice)")
    adv.add_argument("--eval-timeout", type=_positive_float, default=1800.0, metavar="SECONDS")
    adv.add_argument("--grace", type=_positive_float, metavar="SECONDS",
                     help="the kill deadline past the budget for a run that hangs (default max(10, 5%% of budget)); "
                          "the artifact itself is due --export-margin past the budget")
    adv.add_argument("--export-margin", type=_positive_float, metavar="SECONDS",
                     help="how long past the budget train.py's artifact may still be completed (default 3); "
                          "later is invalid: the budget is exact")
    adv.add_argument("--backoff", type=_positive_float, default=5.0, metavar="SECONDS",
                     help="first retry delay after an agent error (doubles, capped at 300 s)")
    adv.add_argument("--repo", type=Path, help="the checkout (default: the git repository around cwd)")

    create = sub.add_parser(
        "create", help="a new environment envs/<name>/ from a plain-English description",
        description="The agent writes envs/<name>/ (a stdlib-only domain, a gymnasium Env, a README); the daemon "
                    "checks it and shows failures to the agent for --repair-rounds repairs. It is committed on the "
                    "checkout's branch only when every check passes (else exit 1, nothing changed); every round "
                    "is kept in results/create-<name>/. Then: run --env envs.<name>.env:Env.")
    create.add_argument("--name", required=True, help="the folder envs/<name>/ (lowercase, digits, '_')")
    what = create.add_mutually_exclusive_group(required=True)
    what.add_argument("--describe", metavar="TEXT", help="the environment in plain English")
    what.add_argument("--spec", metavar="FILE", help="a file holding the description")
    create.add_argument("--agent", choices=CREATE_AGENT_KINDS,
                        help="default: anthropic when ANTHROPIC_API_KEY is set")
    create.add_argument("--repair-rounds", type=_non_negative_int, default=3, metavar="N",
                        help="repair rounds from the check report (default 3)")
    create.add_argument("--sandbox", choices=("auto", "require", "off"), default="auto",
                        help="walls around the checks, which run the agent's code (default auto)")
    add_agent_arguments(create, CREATE_AGENT_KINDS)
    create.add_argument("--repo", type=Path, help=argparse.SUPPRESS)

    from . import export

    export.add_arguments(sub.add_parser(
        "export", help="envs/<name>/ as thin OpenEnv, OpenReward, verifiers and NeMo Gym variants (--smoke: try each)",
        description=export.__doc__.splitlines()[0]))

    status = sub.add_parser("status", help="what each run is doing and its best so far")
    status.add_argument("--tag", help="one run (default: all runs under results/)")
    status.add_argument("--repo", type=Path, help=argparse.SUPPRESS)

    stop = sub.add_parser("stop", help="abort the experiment in flight and end a run cleanly")
    stop.add_argument("--tag", help="the run to stop (default: every running run)")
    stop.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                      help="how long to wait for the daemon to finish (default %(default)s)")
    stop.add_argument("--repo", type=Path, help=argparse.SUPPRESS)

    report = sub.add_parser("report", help="the morning report: summary, progress.png, report.html",
                            description="Write results/<tag>/progress.png and report.html and print the summary.")
    report.add_argument("--tag", help="the run (default: the latest)")
    report.add_argument("--open", action="store_true", help="open report.html in a browser")
    report.add_argument("--rescore", type=int, metavar="K",
                        help="first train the start and the best again on K fresh seeds (a finished run: its "
                             "runner, harness and verdicts); the summary leads with that out-of-sample gain")
    report.add_argument("--repo", type=Path, help=argparse.SUPPRESS)

    transfer = sub.add_parser(
        "transfer", help="train the run's starting and best train.py on other envs (transfer.tsv/png)",
        description="Train the run's starting train.py and its best on each env with the same budget and seeds, "
                    "through the run's runner; score with its harness. Before an env's first cell, the backends "
                    "the start commit ships for it are verified (L1-L3) and benchmarked as at setup, so it trains "
                    "on its fastest verified one. Finished cells are not retrained.")
    transfer.add_argument("--tag", help="the run (default: the latest)")
    transfer.add_argument("--envs", required=True, metavar="ENV,ENV",
                          help="comma-separated env ids, e.g. Hopper-v5,Walker2d-v5,HalfCheetah-v5,Ant-v5")
    transfer.add_argument("--budget", dest="budget_s", type=_budget, metavar="SECONDS",
                          help="training budget per cell (default: the run's)")
    transfer.add_argument("--seeds", type=_positive_int, default=1, metavar="N", help="seeds 1..N (default 1)")
    transfer.add_argument("--repo", type=Path, help=argparse.SUPPRESS)

    schedule = sub.add_parser(
        "schedule", help="start a run every night at --at until --until (foreground; fit for nohup)",
        description="Every night at --at, `run [run options] --tag <slug>-<mon><day> --until HH:MM`, from the "
                    "previous scheduled night's best (--from autorl/<its tag>). SIGTERM stops it and the run in "
                    "flight. Any `run` option may follow (--env is required; not --tag, --resume, --until).",
        usage="python -m orchestrator schedule --at HH:MM --until HH:MM --env ENV_ID [run options]")
    schedule.add_argument("--at", required=True, metavar="HH:MM", help="local time a night's run starts")
    schedule.add_argument("--until", required=True, metavar="HH:MM", help="local time a night's run ends")
    schedule.add_argument("--every", type=_positive_float, help=argparse.SUPPRESS)  # tests: seconds apart
    schedule.add_argument("--stop-wait", type=_positive_float, default=300.0, help=argparse.SUPPRESS)
    schedule.add_argument("--repo", type=Path, help=argparse.SUPPRESS)

    pull = sub.add_parser("pull", help="bring a night run on Modal home: results/<tag>/ and its branch")
    pull.add_argument("--tag", required=True, help="the run's tag")
    pull.add_argument("--repo", type=Path, help=argparse.SUPPRESS)

    sub.add_parser("verify", help="verify a fast env backend (see `verify --help`)", add_help=False)
    sub.add_parser("bench", help="benchmark env backends (see `bench --help`)", add_help=False)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from . import commands

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("verify", "bench"):  # they own their arguments
        return commands.delegate(argv[0], argv[1:])
    parser = build_parser()
    if argv and argv[0] == "schedule":  # the rest are `run` options, passed on to each night's run
        args, run_args = parser.parse_known_args(argv)
        return commands.schedule(parser, args, run_args)
    args = parser.parse_args(argv)
    if args.command == "export":
        from . import export

        return export.run(args)
    return getattr(commands, args.command)(args)


