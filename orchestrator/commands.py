"""What each command of `python -m orchestrator` does, once cli.py has parsed its arguments: a
function per command, each turning the library's errors into one `autorl: error:` line and an exit code."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def delegate(command: str, argv: list[str]) -> int:
    import importlib

    try:
        module = importlib.import_module(f"envs_fast.{command}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("envs_fast", f"envs_fast.{command}"):
            raise
        print(f"autorl: error: `{command}` needs envs_fast/{command}.py, which this checkout does not have",
              file=sys.stderr)
        return 1
    return int(module.main(argv) or 0)


def run(args) -> int:
    from .agents import make_agent
    from .config import Limits, Options, RunError, parse_until
    from .setup import start
    from .workspace import WorkspaceError

    try:
        deadlines = []
        if args.until:
            deadlines.append(parse_until(args.until))
        if args.max_hours:
            deadlines.append(time.time() + args.max_hours * 3600)
        limits = Limits(max_experiments=args.max_experiments, deadline=min(deadlines) if deadlines else None,
                        max_cost=args.max_cost, backoff_base_s=args.backoff)
        options = Options(
            env_id=args.env_id, tag=args.tag, agent=args.agent, resume=args.resume, budget_s=args.budget_s,
            grace_s=args.grace, export_margin_s=args.export_margin, eval_episodes=args.eval_episodes, eval_timeout_s=args.eval_timeout,
            eval_workers=args.eval_workers, phases=args.phases, schedule=args.schedule, limits=limits,
            repair_rounds=args.repair_rounds, target_speedup=args.target_speedup,
            translate_patience=args.translate_patience, translate_lang=args.translate_lang,
            bench_seconds=args.bench_seconds, setup_verify=args.setup_verify, runner=args.runner,
            parallel=args.parallel, runner_options=_runner_options(args), screen=args.screen, baselines=args.baselines,
            sandbox=args.sandbox, max_output_mb=args.max_output_mb, rescore_seeds=max(0, args.rescore),
            repo=args.repo, agent_args=args)
        return start(options, make_agent, dict(os.environ), from_ref=args.from_ref)
    except (RunError, WorkspaceError) as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1


def create(args) -> int:
    from .agents import make_agent
    from .config import RunError
    from .create import CreateRequest, create as create_environment, read_description
    from .workspace import WorkspaceError

    try:
        request = CreateRequest(name=args.name, description=read_description(args.describe, args.spec),
                                agent_args=args, repair_rounds=args.repair_rounds, repo=args.repo,
                                sandbox=args.sandbox)
        return create_environment(request, make_agent, dict(os.environ))
    except (RunError, WorkspaceError) as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1


def _runner_options(args) -> dict:
    given = {"gpu": args.modal_gpu, "cpu": args.modal_cpu,
             "price_table": str(Path(args.modal_price_table).resolve()) if args.modal_price_table else None}
    return {name: value for name, value in given.items() if value is not None}


def pull(args) -> int:
    from .runners.modal.pull import PullError, pull as pull_run
    from .workspace import WorkspaceError, repo_root

    try:
        path = pull_run(args.tag, repo_root(args.repo or Path.cwd()))
    except (PullError, WorkspaceError) as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.tag}: results in {path}; branch autorl/{args.tag} fetched")
    return 0


def _results_root(args) -> Path:
    from .workspace import repo_root

    return repo_root(args.repo or Path.cwd()) / "results"


def status(args) -> int:
    from .status import render_status
    from .workspace import WorkspaceError

    try:
        text, code = render_status(_results_root(args), args.tag)
    except WorkspaceError as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1
    print(text)
    return code


def _run_dir(args) -> Path:
    """results/<tag> of --tag, else of the latest run."""
    from .report import latest_run

    root = _results_root(args)
    if args.tag:
        if not (root / args.tag / "run.json").exists():
            raise LookupError(f"no run {args.tag!r} under {root}")
        return root / args.tag
    latest = latest_run(root)
    if latest is None:
        raise LookupError(f"no runs under {root}")
    return latest


def report(args) -> int:
    from . import report as morning_report
    from .workspace import WorkspaceError

    try:
        run_dir = _run_dir(args)
    except (LookupError, WorkspaceError) as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1
    if args.rescore:
        from .config import RunError
        from .setup import rescore_run

        try:
            if rescore_run(args.repo, run_dir.name, args.rescore) is None:
                print("autorl: nothing to rescore: the start is still the best", file=sys.stderr)
        except (RunError, WorkspaceError) as exc:
            print(f"autorl: error: {exc}", file=sys.stderr)
            return 1
    try:
        night = morning_report.write(run_dir)
    except (OSError, ValueError, KeyError) as exc:
        print(f"autorl: error: cannot read the run in {run_dir}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(morning_report.summary_text(night))
    print(f"  report: {night.folder.report_html}\n  chart:  {night.folder.progress_png}")
    if args.open:
        import webbrowser

        webbrowser.open(night.folder.report_html.resolve().as_uri())
    return 0


def transfer(args) -> int:
    from . import report as morning_report
    from .transfer import TransferError, run_transfer
    from .transfer_table import load_frame, summary_text
    from .workspace import WorkspaceError

    try:
        run_dir = _run_dir(args)
        envs = [e.strip() for e in args.envs.split(",") if e.strip()]
        stats = run_transfer(run_dir, envs, budget_s=args.budget_s, seeds=args.seeds,
                             say=lambda text: print(text, flush=True))
    except (LookupError, TransferError, WorkspaceError) as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1
    morning_report.refresh(run_dir)
    frame = load_frame(run_dir / "transfer.tsv")
    if frame is not None:
        print(summary_text(frame))
    print(f"trained {stats['trained']}, already done {stats['skipped']}"
          + ("; stopped before the end (run it again to go on)" if stats["stopped"] else ""))
    print(f"results: {run_dir / 'transfer.tsv'}, {run_dir / 'transfer.png'}, {run_dir / 'report.html'}")
    return 1 if stats["stopped"] else 0


def schedule(parser: argparse.ArgumentParser, args, run_args: list[str]) -> int:
    from .config import RunError
    from .schedule import Nights, serve
    from .workspace import WorkspaceError, repo_root

    run = parser.parse_args(["run", *run_args])  # exits with the usual message on a bad run option
    for flag, given in (("--tag", run.tag), ("--resume", run.resume), ("--until", run.until)):
        if given:
            parser.error(f"schedule: {flag} is the scheduler's to set (each night is tagged <slug>-<mon><day>)")
    if not run.env_id:
        parser.error("schedule: --env ENV_ID is required")
    passed = list(run_args)
    if run.from_ref:  # the first night's start; later nights start from the previous night's best
        i = passed.index("--from") if "--from" in passed else None
        passed = passed[:i] + passed[i + 2:] if i is not None else [a for a in passed if not a.startswith("--from=")]
    try:
        root = repo_root(args.repo or Path.cwd())
        nights = Nights(root, run.env_id, args.until, passed, first_from=run.from_ref)
        return serve(nights, args.at, every_s=args.every, stop_wait_s=args.stop_wait)
    except (RunError, WorkspaceError) as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1


def stop(args) -> int:
    from .daemon import lock_holder, request_stop
    from .workspace import WorkspaceError

    try:
        root = _results_root(args)
    except WorkspaceError as exc:
        print(f"autorl: error: {exc}", file=sys.stderr)
        return 1
    if args.tag:
        if not (root / args.tag / "run.json").exists():
            print(f"autorl: error: no run {args.tag!r} under {root}", file=sys.stderr)
            return 1
        tags = [args.tag]
    else:
        tags = sorted(p.parent.name for p in root.glob("*/run.json") if lock_holder(p.parent))
    if not tags or all(lock_holder(root / t) is None for t in tags):
        print("no running run" + (f" {args.tag!r}" if args.tag else ""))
        return 1
    code = 0
    for tag in tags:
        print(f"stopping {tag} (pid {lock_holder(root / tag)}) ...", flush=True)
        pid, stopped = request_stop(root / tag, wait_s=args.wait)
        if stopped:
            print(f"{tag}: stopped; branch autorl/{tag} is at the best commit")
        else:
            print(f"{tag}: pid {pid} still running after {args.wait:.0f}s (it finishes the step in flight)")
            code = 1
    return code
