"""`python -m orchestrator create`: a new environment `envs/<name>/` from a plain-English description.

One create experiment with repair rounds, like a translate experiment: the agent writes
`envs/<name>/` in a worktree of its own (`runs/create-<name>/` on branch `autorl/create-<name>`,
from the checkout's HEAD); each round is a commit there, checked in a sandboxed process by the
daemon's copy of orchestrator/envcheck.py plus the "written paths" check; a failed report goes
back to the agent for the next round. Only when every check passes is one commit adding
`envs/<name>/` fast-forwarded onto the checkout's branch; otherwise the checkout is untouched and
the command exits 1. Every round's prompt or transcript, diff and check report stay in
`results/create-<name>/round-K/` (an earlier attempt's folder is moved aside, never overwritten).
"""
from __future__ import annotations

import json
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from . import envcheck, processes
from .agents import CREATE_AGENT_KINDS as CREATE_AGENTS
from .agents.base import AgentContext, NoMoreProposals
from .config import RunError
from .daemon import RunLock, lock_holder, log, setup_logging
from .envcheck import Check, CheckReport
from .envfolder import ENVS, NAME_PATTERN, env_id_for
from .results import read_json, utc_now
from .sandbox import Sandbox, Walls, agent_walls_problem
from .workspace import Workspace, WorkspaceError, disallowed, repo_root

PROMPT_FILE = "create.md"             # the protocol and the checks, program-style (the human may edit it)
CHECK_TIMEOUT_S = 600.0
WRITTEN_PATHS = "written paths"


@dataclass
class CreateRequest:
    """A parsed `create` command."""
    name: str
    description: str
    agent_args: object                  # the argparse namespace, for the agent factory
    repair_rounds: int = 3
    repo: Optional[Path] = None
    sandbox: str = "auto"


class CreateFolder:
    """results/create-<name>/: what a create leaves behind, by name."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.record = self.path / "create.json"
        self.description = self.path / "description.md"
        self.notes = self.path / "notes.md"

    def round(self, k: int) -> Path:
        return self.path / f"round-{k}"

    def start(self) -> Optional[Path]:
        """A fresh folder; an earlier attempt's is moved aside (returned) so nothing is lost."""
        moved = None
        if self.path.exists():
            record = read_json(self.record)
            moved = self.path.with_name(f"{self.path.name}.{(record.get('started') or utc_now()).replace(':', '')}")
            while moved.exists():
                moved = moved.with_name(moved.name + "_")
            self.path.rename(moved)
        self.path.mkdir(parents=True)
        return moved

    def write_record(self, **fields) -> None:
        data = {**read_json(self.record), **fields}
        tmp = self.record.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self.record)


def read_description(describe: Optional[str], spec: Optional[str]) -> str:
    """The description from --describe TEXT or --spec FILE (argparse makes them exclusive)."""
    if spec is not None:
        try:
            text = Path(spec).read_text()
        except OSError as exc:
            raise RunError(f"--spec {spec}: {exc.strerror or exc}") from None
    else:
        text = describe or ""
    if not text.strip():
        raise RunError("the description is empty: say in plain English what the environment is")
    return text.strip()


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name or "") or name in ("env", "tasks"):
        raise RunError(f"bad --name {name!r}: lowercase letters, digits and '_', starting with a letter "
                       "(it names envs/<name>/ and the module envs/<name>/<name>.py)")
    return name


def create(request: CreateRequest, agent_factory: Callable, environ: dict) -> int:
    """The exit code: 0 when envs/<name>/ was committed, 1 when the create failed (RunError for bad input)."""
    name = check_name(request.name)
    root = repo_root(request.repo or Path.cwd())
    workspace = Workspace(root, f"create-{name}")
    _refuse_bad_start(root, workspace, name)
    agent_name = _agent_name(request.agent_args, environ)
    folder = CreateFolder(root / "results" / f"create-{name}")
    try:
        agent = agent_factory(request.agent_args, folder.path)
    except Exception as exc:
        raise RunError(f"cannot start the {agent_name} agent: {exc}") from None
    walls_problem = agent_walls_problem(request.sandbox, agent_name)
    if walls_problem:
        raise RunError(walls_problem)
    prompt = _prompt_text(root, name, request.description)
    running = lock_holder(folder.path)
    if running:
        raise RunError(f"a create of envs/{name}/ is running (pid {running})")
    moved = folder.start()
    lock = RunLock(folder.path)
    lock.acquire()
    try:
        setup_logging(folder.path)
        if moved:
            log.info("an earlier attempt's folder was moved to %s", moved)
        folder.description.write_text(request.description + "\n")
        if workspace.exists():  # left by a create that was killed: every round of it is in its results folder
            log.warning("removing the leftover worktree %s of an interrupted create", workspace.path)
            workspace.remove()
        base = workspace.create()
        folder.write_record(name=name, env_id=env_id_for(name), agent=agent_name, status="running", started=utc_now(),
                            base_commit=base, repair_rounds=request.repair_rounds)
        log.info("create envs/%s/ with the %s agent from %s (%d repair round(s) at most)", name, agent_name,
                 base[:7], request.repair_rounds)
        try:
            return _create_in(request, agent, agent_name, workspace, folder, base, prompt)
        finally:
            workspace.remove()
            shutil.rmtree(_snapshots(workspace), ignore_errors=True)
    finally:
        lock.release()


def _create_in(request: CreateRequest, agent, agent_name: str, workspace: Workspace, folder: CreateFolder,
               base: str, prompt: str) -> int:
    name, commit, report, cost = request.name, base, None, 0.0
    for round_ in range(request.repair_rounds + 1):
        label = f"round {round_}" + (" (repair)" if round_ else "")
        round_dir = folder.round(round_)
        round_dir.mkdir()
        ctx = AgentContext(
            phase="create", exp=1, env_id=env_id_for(name), worktree=workspace.path, run_dir=folder.path,
            exp_dir=round_dir, program=prompt, allowed_paths=[f"{ENVS}/{name}/*"],
            last_failure=report.text() if report else None, repair_round=round_, notes_path=folder.notes,
            sandbox=request.sandbox, main_root=workspace.main_root)
        log.info("%s: the agent writes envs/%s/", label, name)
        try:
            proposal = agent.propose(ctx)
        except NoMoreProposals:
            return _failed(folder, round_, cost, "the agent has no more proposals" + (
                f"; the last check failed: {', '.join(report.failed())}" if report else ""))
        except Exception as exc:
            return _failed(folder, round_, cost, f"the agent failed: {type(exc).__name__}: {exc}")
        cost += proposal.cost_usd
        if not workspace.changed_paths(commit):
            return _failed(folder, round_, cost, f"{label} changed nothing" + (
                f"; the last check failed: {', '.join(report.failed())}" if report else ""))
        commit = workspace.commit(f"create envs/{name}/, {label}: {proposal.description}")
        (round_dir / "diff.patch").write_text(workspace.diff(base, commit))
        report = check_round(workspace, commit, base, name, round_dir, request.sandbox)
        (round_dir / "check.txt").write_text(report.text() + "\n")
        (round_dir / "check.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        log.info("%s: %s", label, report.summary())
        if report.passed:
            return _land(request, agent_name, workspace, folder, base, commit, round_, cost)
    return _failed(folder, request.repair_rounds, cost, f"checks failed after {request.repair_rounds} repair "
                                                        f"round(s): {', '.join(report.failed())}")


def check_round(workspace: Workspace, commit: str, base: str, name: str, round_dir: Path,
                sandbox: str) -> CheckReport:
    """The written-paths check, then envcheck over the commit's envs/<name>/ in a walled process."""
    written = workspace.changed_between(base, commit)
    outside = disallowed(written, [f"{ENVS}/{name}/*"])
    paths = Check(WRITTEN_PATHS, not outside,
                  f"wrote outside envs/{name}/: {', '.join(outside)} (remove these changes)" if outside
                  else f"{len(written)} file(s), all under envs/{name}/")
    scratch = _snapshots(workspace) / f"{round_dir.name}-{uuid.uuid4().hex[:6]}"
    try:
        source = workspace.extract(commit, scratch / "root", [f"{ENVS}/{name}"])
        checker, out = scratch / "envcheck.py", scratch / "out"
        shutil.copyfile(envcheck.__file__, checker)  # the daemon's copy: the commit cannot change the checks
        out.mkdir()
        env = processes.scrubbed_env({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"})
        env.pop("PYTHONPATH", None)
        result = processes.run_group(
            [sys.executable, str(checker), "--root", str(source), "--name", name, "--json", str(out / "check.json")],
            out, env, round_dir / "check.log", CHECK_TIMEOUT_S, should_stop=lambda: False,
            walls=Walls(cwd=out, read_only=[source, checker], writable=[out],
                        hidden=[workspace.main_root, round_dir.parent]),
            sandbox=Sandbox(sandbox))
        data = read_json(out / "check.json")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if data.get("checks"):
        report = CheckReport.from_dict(data)
    else:
        why = f"timed out after {CHECK_TIMEOUT_S:.0f}s" if result.timed_out else f"exited with {result.returncode}"
        log_path = round_dir / "check.log"
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        report = CheckReport(name, [Check("checks ran", False, f"the checks {why} without a report:\n{tail}")])
    report.checks.insert(0, paths)
    return report


def _land(request: CreateRequest, agent_name: str, workspace: Workspace, folder: CreateFolder, base: str,
          commit: str, round_: int, cost: float) -> int:
    name = request.name
    message = (f"envs/{name}/: the {name} environment, created from a description "
               f"({agent_name} agent, {round_} repair round(s), every check passed)\n\n{request.description}\n\n"
               f"Train it: python -m orchestrator run --env {env_id_for(name)}\n"
               f"Made by python -m orchestrator create; its rounds are in results/create-{name}/.")
    try:
        landed = workspace.land(base, commit, message, f"refs/autorl/create-{name}/result")
    except WorkspaceError as exc:
        return _failed(folder, round_, cost, f"every check passed but it could not be committed: {exc}")
    branch = workspace.main.active_branch.name
    folder.write_record(status="created", commit=landed, rounds=round_ + 1, cost_usd=round(cost, 6), ended=utc_now())
    log.info("created envs/%s/: commit %s on %s after %d repair round(s)", name, landed[:7], branch, round_)
    print(f"created envs/{name}/ (commit {landed[:7]} on {branch}); train it with:\n"
          f"  python -m orchestrator run --env {env_id_for(name)}", flush=True)
    return 0


def _failed(folder: CreateFolder, round_: int, cost: float, reason: str) -> int:
    folder.write_record(status="failed", reason=reason, rounds=round_ + 1, cost_usd=round(cost, 6), ended=utc_now())
    log.error("create failed: %s", reason)
    print(f"create failed: {reason}\nthe checkout is untouched; every round is in {folder.path}", file=sys.stderr,
          flush=True)
    return 1


# ---------------------------------------------------------------- before anything is created
def _refuse_bad_start(root: Path, workspace: Workspace, name: str) -> None:
    main = workspace.main
    if not main.head.is_valid():
        raise RunError(f"{root} has no commit yet; commit your files first")
    if main.head.is_detached:
        raise RunError("the checkout is on a detached HEAD: check out the branch envs/ should be committed on")
    if (root / ENVS / name).exists() or workspace.has_path("HEAD", f"{ENVS}/{name}"):
        raise RunError(f"envs/{name}/ exists already: choose another --name (nothing was changed)")
    dirty = workspace.dirty_paths()
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise RunError(f"the checkout has uncommitted changes ({shown}): commit or stash them first "
                       f"(create commits envs/{name}/ on {main.active_branch.name})")


def _agent_name(args, environ: dict) -> str:
    name = getattr(args, "agent", None)
    if name is None:
        if not environ.get("ANTHROPIC_API_KEY"):
            raise RunError("create needs an agent that writes code: --agent anthropic (with ANTHROPIC_API_KEY), "
                           "command (--agent-cmd TEMPLATE) or replay (--replay-dir DIR)")
        name = "anthropic"
    if name not in CREATE_AGENTS:
        raise RunError(f"--agent {name} cannot create an environment; choose one of {', '.join(CREATE_AGENTS)}")
    args.agent = name
    return name


def _prompt_text(root: Path, name: str, description: str) -> str:
    """create.md (the checkout's, else the one beside this package) with the name and the description."""
    for candidate in (root / PROMPT_FILE, Path(__file__).resolve().parents[1] / PROMPT_FILE):
        if candidate.is_file():
            text = candidate.read_text()
            break
    else:
        raise RunError(f"{root / PROMPT_FILE} is missing: it holds the protocol the agent follows")
    return (text.replace("<name>", name).rstrip()
            + f"\n\n## The environment to create: envs/{name}/\n\nThe description, as the human wrote it:\n\n"
            + "\n".join(f"> {line}" if line else ">" for line in description.splitlines()) + "\n")


def _snapshots(workspace: Workspace) -> Path:
    return workspace.main_root / "runs" / ".snapshots" / workspace.tag

