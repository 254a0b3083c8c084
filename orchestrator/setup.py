"""Turning a `run` command into a run: a new run's configuration (worktree, harness copy,
held-out seed) or a resumed one's, the agent, the runner, then the loop.

Nothing here runs experiments; `start` hands a ready Run to the loop.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from envs_fast.cache import reading_from
from envs_fast.portability import engine_of, no_port_reason, shipped_port

from . import agents as agent_kinds
from . import shipped
from .artifacts import TRAIN_SCRIPT
from .config import (BASELINE_RUNS, EXPORT_MARGIN_S, FIRST_CONFIRM_SEED, Options, RunConfig, RunError, budget_allowance,
                     check_tag, default_tag)
from .daemon import LockHeld, RunLock, StopControl, log, progress, setup_logging
from .disk import NIGHT_OF_CAPS, free_mb
from .envfolder import content_sha256, env_folder
from .inflight import InFlight
from .loop import Run
from .phases import parse_schedule
from .preflight import (check_agent_walls, check_created_env, check_env_id, check_runner, check_sandbox,
                        check_translate_lang)
from .processes import scrubbed_env
from .report.rescored import Rescore
from .rescore import rescore
from .results import ResultsFile, RunFolder, summarize, utc_now
from .report import refresh as refresh_report
from .sandbox import Sandbox
from .runners import Runner, make_runner
from .workspace import Workspace, repo_root

HARNESS = RunFolder.HARNESS


def default_agent(environ: dict) -> tuple[str, str]:
    if environ.get("ANTHROPIC_API_KEY"):
        return "anthropic", "ANTHROPIC_API_KEY is set"
    return "optuna", "ANTHROPIC_API_KEY is not set, so the offline Optuna agent tunes hyperparameters"


def find_run_to_resume(results_root: Path, env_id: Optional[str]) -> Optional[str]:
    """The most recently active run (for env_id, when given)."""
    candidates = []
    for run_json in results_root.glob(f"*/{RunFolder.CONFIG}"):
        try:
            data = json.loads(run_json.read_text())
        except ValueError:
            continue
        if env_id is None or data.get("env_id") == env_id:
            candidates.append((run_json.parent.stat().st_mtime, run_json.parent.name))
    return max(candidates)[1] if candidates else None


def rescore_run(repo: Optional[Path], tag: str, k: int) -> Optional[Rescore]:
    """`report --rescore K`: train the start and the best of a finished run on K fresh seeds, with
    the run's own runner, harness and verdicts (the run must not be running)."""
    root = repo_root(repo or Path.cwd())
    folder = RunFolder(root / "results" / tag)
    if not folder.config.exists():
        raise RunError(f"--rescore: there is no run {tag!r} ({folder.config} is missing)")
    lock = RunLock(folder.path)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise RunError(f"run {tag!r} is running (pid {exc.pid}); rescore it once it has ended") from None
    runner = None
    try:
        setup_logging(folder.path)
        workspace = Workspace(root, tag)
        config, harness_bytes = _resume_config(Options(), folder, workspace)
        check_sandbox(config.sandbox)
        stop = StopControl(folder.path)
        stop.install()
        runner = make_runner(config, folder, workspace, stop, InFlight(folder.path), harness_bytes)
        best = summarize(ResultsFile(folder.results).read())["best_commit"] or config.base_commit
        with reading_from(folder.verify_cache):
            return rescore(runner, folder, config.base_commit, workspace.resolve(best), k, stop.requested)
    finally:
        if runner is not None:
            runner.close()
        lock.release()


def start(options: Options, agent_factory: Callable, environ: dict, from_ref: Optional[str] = None) -> int:
    """`python -m orchestrator run`: returns the exit code. `from_ref` (`run --from REF`): a new
    run's branch starts from REF instead of the checkout's HEAD."""
    setup_logging(None)
    root = repo_root(options.repo or Path.cwd())
    results_root = root / "results"
    tag = options.tag
    if tag is None:
        if options.env_id is None and not options.resume:
            raise RunError("--env ENV_ID is required for a new run")
        tag = default_tag(options.env_id) if options.env_id else None
        if options.resume and (tag is None or not (results_root / tag / RunFolder.CONFIG).exists()):
            tag = find_run_to_resume(results_root, options.env_id)
            if tag is None:
                raise RunError("--resume: no run to resume" + (f" for {options.env_id}" if options.env_id else "")
                               + f" under {results_root}")
    check_tag(tag)
    folder = RunFolder(results_root / tag)
    workspace = Workspace(root, tag)
    existing = folder.config.exists()
    if existing and not options.resume:
        raise RunError(f"run {tag!r} already exists ({folder.path}); pass --resume to continue it, or --tag NAME "
                       "for a new run")
    if options.resume and not existing:
        raise RunError(f"--resume: there is no run {tag!r} ({folder.config} is missing)")
    if not existing and workspace.exists():
        raise RunError(f"branch {workspace.branch} or folder {workspace.path} already exists without a run "
                       f"folder; remove them (git worktree remove, git branch -D) or choose another --tag")
    if from_ref is not None and existing:
        raise RunError(f"--from: run {tag!r} already exists and keeps the commit it started from")
    if not existing:
        _check_new_run(options, root, workspace, from_ref)
        check_sandbox(options.sandbox or "auto")
        check_translate_lang(options.translate_lang or "auto")
        if options.runner_factory is None:  # a test's factory brings its own (fake) Modal
            check_runner(options.runner or "local", options.runner_options)
    created = not folder.path.exists()
    try:
        folder.path.mkdir(parents=True, exist_ok=True)
        if not os.access(folder.path, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as exc:
        raise RunError(f"cannot write the run folder {folder.path}: {exc.strerror or exc} "
                       f"({results_root} must be a folder you can write)") from None
    lock = RunLock(folder.path)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise RunError(f"run {tag!r} is already running (pid {exc.pid}); `python -m orchestrator stop --tag {tag}` "
                       "stops it") from None
    runner = None
    # The daemon's own envs_fast queries (setup's choice, the optuna agent's training path) read this
    # run's verdicts, as its train runs do.
    verdicts = contextlib.ExitStack()
    verdicts.enter_context(reading_from(folder.verify_cache))
    try:
        setup_logging(folder.path)
        stop = StopControl(folder.path)
        stop.install()
        if existing:
            config, harness_bytes = _resume_config(options, folder, workspace)
            check_sandbox(config.sandbox)
            check_translate_lang(config.translate_lang)
            if options.runner_factory is None:
                check_runner(config.runner, config.runner_options)
        if options.agent:
            agent_name, why = options.agent, "chosen with --agent"
        elif existing:
            agent_name, why = config.agent, "the agent this run started with"
            agent_kinds.restore_options(options.agent_args, config.agent_options)
        else:
            agent_name, why = default_agent(environ)
        options.agent_args.agent = agent_name
        # the optuna agent screens its constants only when the run screens candidates (--screen)
        options.agent_args.screen = config.screen if existing else options.screen
        try:  # before anything is created: a misconfigured agent leaves no half-made run behind
            agent = agent_factory(options.agent_args, folder.path)
        except Exception as exc:
            raise RunError(f"cannot start the {agent_name} agent: {exc}") from None
        check_agent_walls(config.sandbox if existing else (options.sandbox or "auto"), agent_name)
        if existing:
            log.info("resuming run %s (%s) in %s", tag, config.env_id, workspace.path)
        else:
            config, harness_bytes = _new_config(options, tag, root, folder, workspace, agent_name, from_ref)
            log.info("new run %s: %s, budget %ss, %d eval episodes; worktree %s on branch %s", tag,
                     config.env_id, config.budget_s, config.eval_episodes, workspace.path, workspace.branch)
        log.info("agent: %s (%s); runner: %s, %d candidate(s) per round", agent_name, why, config.runner,
                 config.parallel)
        log.info("%s", Sandbox(config.sandbox).describe())
        _warn_if_disk_is_short(folder, config)
        journal = InFlight(folder.path)
        factory = options.runner_factory or make_runner
        runner = factory(config, folder, workspace, stop, journal, harness_bytes)
        run = Run(config, folder, workspace, options.limits, stop, runner, journal, agent, harness_bytes)
        if existing:
            run.recover()
        prepare_backends(config, folder, workspace, runner, journal, stop, run.ledger.rows)
        if run.run_baseline():
            reason = run.loop()
        else:
            reason = f"stopped ({stop.reason})"
        run.workspace.reset_to(run.best_commit)
        log.info("run %s ended: %s; %s", tag, reason, run.summary_line())
        if not stop.requested():  # a stopped night ends now; `report --rescore K` rescores it later
            rescored = rescore(runner, folder, config.base_commit, run.best_commit, options.rescore_seeds, stop.requested)
            if rescored is not None:
                log.info("run %s out of sample: best - start = %s (the night's own gain is in-sample: biased up)",
                         tag, rescored.line())
        log.info("results: %s; branch %s is at the best commit", run.results.path, workspace.branch)
        return 0
    except BaseException:
        if created and not folder.config.exists():  # a new run that never started
            lock.release()
            shutil.rmtree(folder.path, ignore_errors=True)
        raise
    finally:
        progress.active = False
        if runner is not None:
            runner.close()
        lock.release()
        verdicts.close()
        if folder.config.exists():
            refresh_report(folder.path)  # its last version: the run has ended


def prepare_backends(config: RunConfig, folder: RunFolder, workspace: Workspace, runner: Runner, journal: InFlight,
                     stop: StopControl, rows: list) -> None:
    """Before the baseline: verify and benchmark the backends the start commit ships, so the baseline
    trains on the fastest verified one (orchestrator/shipped.py). Once per run: a resumed run reads
    the choice it made (backend.json); a run whose baseline began before setup verification existed
    keeps what it trained on."""
    saved = shipped.saved_choice(folder)
    if saved:
        log.info("%s (chosen at setup)", shipped.choice_line(saved))
    elif any(row.exp == 0 and row.status == "baseline" for row in rows):
        return
    elif not config.setup_verify:
        shipped.skipped(folder, "--no-setup-verify: the baseline trains on what this run's cache has verified "
                                "(nothing yet), as train.py's auto decides")
    else:  # on Modal too: verified and benchmarked in a container of the run's GPU type, where training runs
        try:
            shipped.verify_at_setup(config, folder, workspace, runner, journal, stop.requested)
        except Exception as exc:  # a bug or a broken cache costs speed, never the run
            log.exception("setup verification failed (%s); the baseline trains on what is verified already", exc)


# Agents that write code alternate translating the env and training; optuna only tunes train.py.
CODE_WRITING_AGENTS = ("anthropic", "command")
DEFAULT_PHASES, DEFAULT_SCHEDULE = "translate,train", "translate:1,train:4"


def schedule_for(options: Options, agent_name: Optional[str] = None) -> list[str]:
    return plan_schedule(options, agent_name)[0]


def plan_schedule(options: Options, agent_name: Optional[str] = None) -> tuple[list[str], str]:
    """The run's repeating pattern of phases, and why (for daemon.log). A code-writing agent
    alternates translating and training, unless the env steps a physics engine no translation can
    port (Box2D; MuJoCo without mujoco-mjx): then it only trains. --phases/--schedule decide alone."""
    phases, schedule = options.phases, options.schedule
    why = "chosen with --phases/--schedule"
    if not phases and not schedule:
        no_port = no_port_reason(options.env_id) if options.env_id else None
        if agent_name not in CODE_WRITING_AGENTS:
            why = f"the {agent_name or 'chosen'} agent tunes {TRAIN_SCRIPT} only"
        elif no_port:
            why = (f"train only: {no_port}, so no translation could pass verification "
                   f"(--phases translate,train translates anyway)")
        else:
            phases, schedule = DEFAULT_PHASES, DEFAULT_SCHEDULE
            why = f"a code-writing agent alternates translating the env and training ({DEFAULT_SCHEDULE})"
            engine, port = (engine_of(options.env_id), shipped_port(options.env_id)) if options.env_id else (None, None)
            if engine and port:
                why += (f"; {options.env_id}'s {engine} scene is ported in envs_fast/translations/{port.name}: translate "
                        f"experiments make the port faster")
    elif phases and not schedule and set(phases.replace(" ", "").split(",")) == {"translate", "train"}:
        schedule = DEFAULT_SCHEDULE
    try:
        return parse_schedule(phases, schedule), why
    except ValueError as exc:
        raise RunError(str(exc)) from None


def _check_new_run(options: Options, root: Path, workspace: Workspace, from_ref: Optional[str] = None) -> None:
    check_env_id(options.env_id)
    check_created_env(options, workspace, from_ref)
    if not (root / HARNESS).is_file():
        raise RunError(f"{root / HARNESS} is missing: the trusted harness is needed to score experiments")
    if from_ref is None:
        if not (root / TRAIN_SCRIPT).is_file():
            raise RunError(f"{root / TRAIN_SCRIPT} is missing: nothing to train")
        if workspace.main_is_dirty():  # the run would train the last commit, silently without the edits
            edited = sorted({d.a_path for d in workspace.main.index.diff(None)}
                            | {d.a_path for d in workspace.main.index.diff("HEAD")})
            raise RunError(f"uncommitted changes ({', '.join(edited[:3])}{', ...' if len(edited) > 3 else ''}): "
                           "a run trains the last commit, not them; commit them (git commit -am MESSAGE), or pass "
                           "--from HEAD to run the last commit as it is")
    else:
        commit = workspace.start_commit(from_ref)
        if not workspace.has_path(commit, TRAIN_SCRIPT):
            raise RunError(f"--from {from_ref}: commit {commit[:7]} has no {TRAIN_SCRIPT}: nothing to train")
    schedule_for(options)


def _new_config(options: Options, tag: str, root: Path, folder: RunFolder, workspace: Workspace,
                agent_name: str, from_ref: Optional[str] = None) -> tuple[RunConfig, bytes]:
    harness_budget, harness_episodes = _harness_defaults(root)
    budget = options.budget_s if options.budget_s is not None else harness_budget
    schedule, why = plan_schedule(options, agent_name)
    if not schedule_from_agent(options, agent_name):
        log.info("schedule: %s (%s)", ",".join(schedule), why)
    base = workspace.create(from_ref)
    if from_ref is not None:
        log.info("the run starts from %s (%s)", from_ref, base[:7])
    frozen = env_folder(options.env_id)
    env_sha256 = content_sha256(workspace.path / frozen) if frozen else None
    if frozen:
        log.info("%s/ is frozen for this run (sha256 %s): scoring refuses any other content", frozen, env_sha256[:12])
    harness_bytes = (root / HARNESS).read_bytes()
    folder.harness.write_bytes(harness_bytes)
    config = RunConfig(
        tag=tag, env_id=options.env_id, budget_s=budget,
        grace_s=options.grace_s if options.grace_s is not None else budget_allowance(budget),
        export_margin_s=options.export_margin_s if options.export_margin_s is not None else EXPORT_MARGIN_S,
        eval_episodes=options.eval_episodes or harness_episodes,
        eval_seed=secrets.randbelow(2**31 - 1_000_000),
        train_seeds=list(range(1, (options.baselines or BASELINE_RUNS) + 1)), confirm_seed=FIRST_CONFIRM_SEED,
        eval_timeout_s=options.eval_timeout_s, eval_workers=options.eval_workers, schedule=schedule,
        main_root=str(root), worktree=str(workspace.path), branch=workspace.branch, base_commit=base,
        harness_sha256=hashlib.sha256(harness_bytes).hexdigest(), created=utc_now(), agent=agent_name,
        agent_options=agent_kinds.given_options(options.agent_args),
        schedule_from_agent=schedule_from_agent(options, agent_name),
        runner=options.runner or "local", parallel=options.parallel or 1, runner_options=dict(options.runner_options),
        screen=options.screen,
        sandbox=options.sandbox or "auto",
        max_output_mb=options.max_output_mb if options.max_output_mb is not None else 1024.0,
        repair_rounds=options.repair_rounds, target_speedup=options.target_speedup,
        translate_patience=options.translate_patience, translate_lang=options.translate_lang or "auto",
        bench_seconds=options.bench_seconds, setup_verify=options.setup_verify, env_folder=frozen,
        env_sha256=env_sha256)
    config.save(folder.config)
    ResultsFile(folder.results).create()
    return config, harness_bytes


def schedule_from_agent(options: Options, agent_name: str) -> bool:
    """replay without --phases/--schedule: each replayed folder's files say its phase."""
    return agent_name == "replay" and not (options.phases or options.schedule)


def _warn_if_disk_is_short(folder: RunFolder, config: RunConfig) -> None:
    need = NIGHT_OF_CAPS * config.max_output_mb
    free = free_mb(folder.path)
    if free < need:
        log.warning("only %.0f MB free on %s: a night needs room for a few experiments' outputs (%d x "
                    "--max-output-mb %g = %.0f MB); the daemon waits whenever the disk is full", free, folder.path,
                    NIGHT_OF_CAPS, config.max_output_mb, need)


def _harness_defaults(root: Path) -> tuple[float, int]:
    """evaluate.py's TIME_BUDGET and NUM_EVAL_EPISODES, read in a separate process."""
    code = "import evaluate; print(evaluate.TIME_BUDGET, evaluate.NUM_EVAL_EPISODES)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env=scrubbed_env(), timeout=120)
    try:
        budget, episodes = proc.stdout.split()[-2:]
        return float(budget), int(episodes)
    except ValueError:
        raise RunError(f"cannot read TIME_BUDGET from {root / HARNESS}: {proc.stderr.strip()[-300:]}") from None


def _resume_config(options: Options, folder: RunFolder, workspace: Workspace) -> tuple[RunConfig, bytes]:
    config = RunConfig.load(folder.config)
    for flag, given, kept in (("--env", options.env_id, config.env_id),
                              ("--budget", options.budget_s, config.budget_s),
                              ("--eval-episodes", options.eval_episodes, config.eval_episodes),
                              ("--baselines", options.baselines, len(config.train_seeds))):
        if given is not None and given != kept:
            raise RunError(f"run {config.tag!r} was started with {flag} {kept}; a resumed run keeps it so its "
                           f"scores stay comparable (start a new --tag to change it)")
    harness_bytes = folder.harness.read_bytes()
    if hashlib.sha256(harness_bytes).hexdigest() != config.harness_sha256:
        raise RunError(f"{folder.harness} no longer matches the hash recorded in run.json; the run's "
                       "scores cannot be trusted to continue (start a new --tag)")
    changed = False
    if options.phases or options.schedule:
        config.schedule, changed = schedule_for(options), True
    if options.parallel and options.parallel != config.parallel:
        config.parallel, changed = options.parallel, True
    if options.runner and options.runner != config.runner:
        config.runner, changed = options.runner, True
    if options.runner_options:
        config.runner_options, changed = {**config.runner_options, **options.runner_options}, True
    for name in ("sandbox", "max_output_mb", "screen"):
        given = getattr(options, name)
        if given is not None and given != getattr(config, name):
            setattr(config, name, given)
            changed = True
    if changed:
        config.save(folder.config)
    workspace.ensure()
    return config, harness_bytes
