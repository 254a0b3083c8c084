"""The agent's turn: what it is shown, its edits checked and committed, its failures backed off,
and its repair rounds of a translation.

Each candidate is committed on a ref (refs/autorl/<tag>/exp-NNNN), since the branch stays at the
best commit until the round is judged. What a failed turn cost is carried to the next row.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .agents.base import AgentContext, NoMoreProposals, Proposal
from .config import Limits, RunConfig
from .daemon import StopControl, StopRequested, log
from .inflight import InFlight
from .ledger import Ledger
from .phases import Phase, Repair, Verdict
from .results import ExpFolder, RunFolder, compact_table
from .workspace import Workspace


@dataclass
class Candidate:
    """One experiment of a round, from the agent's turn to its row."""
    exp: int
    folder: ExpFolder
    ctx: AgentContext
    started: float
    description: str = ""
    cost_usd: float = 0.0
    commit: Optional[str] = None
    verdict: Optional[Verdict] = None     # set early when it never reaches the runner


class AgentTurns:
    def __init__(self, config: RunConfig, folder: RunFolder, workspace: Workspace, ledger: Ledger,
                 journal: InFlight, stop: StopControl, limits: Limits, agent):
        self.config = config
        self.folder = folder
        self.workspace = workspace
        self.ledger = ledger
        self.journal = journal
        self.stop = stop
        self.limits = limits
        self.agent = agent
        self.pending_cost = 0.0          # spent by agent turns that failed before a row
        self.failures = 0                # in a row: the backoff grows with them
        self.last_failure: Optional[str] = None   # what the agent is shown next time

    def context(self, exp: int, phase: Phase, folder: ExpFolder, repair_round: int = 0,
                peers: Optional[list[str]] = None) -> AgentContext:
        program = Path(self.config.main_root) / "program.md"  # the human steers by editing it
        if not program.exists():
            program = self.workspace.path / "program.md"
        return AgentContext(
            phase=phase.name, exp=exp, env_id=self.config.env_id, worktree=self.workspace.path,
            run_dir=self.folder.path, exp_dir=folder.path,
            program=program.read_text() if program.exists() else "",
            allowed_paths=phase.allowed_paths(self.config.env_id), results_table=compact_table(self.ledger.rows),
            last_failure=self.last_failure, repair_round=repair_round,
            notes_path=self.folder.notes, round_peers=list(peers or []), sandbox=self.config.sandbox,
            main_root=Path(self.config.main_root))

    def propose(self, ctx: AgentContext) -> Proposal:
        """The agent's turn; a stop request interrupts it (StopRequested)."""
        with self.stop.interruptible():
            return self.agent.propose(ctx)

    def candidate(self, exp: int, phase: Phase, peers: list[str], best_commit: str) -> Optional[Candidate]:
        """Ask the agent for one candidate from `best_commit` and commit it. None when the agent
        failed (retried with backoff)."""
        folder = self.folder.exp(exp)
        shutil.rmtree(folder.path, ignore_errors=True)  # a retried attempt starts clean
        folder.path.mkdir(parents=True)
        self.workspace.reset_to(best_commit)
        self.journal.begin(exp, phase.name, "agent", len(self.ledger.rows))
        ctx = self.context(exp, phase, folder, peers=peers)
        c = Candidate(exp, folder, ctx, time.monotonic())
        log.info("exp %d (%s): asking the %s agent", exp, phase.name, self.agent.name)
        try:
            proposal = self.propose(ctx)
        except NoMoreProposals:
            self.journal.end(exp)
            raise
        except StopRequested:
            c.commit = self.commit_leftovers(exp, best_commit)
            c.verdict = Verdict("interrupted", note="stopped while the agent was working")
            return c
        except Exception as exc:
            self._failed(exp, exc, best_commit)
            return None
        self.failures = 0
        c.cost_usd, self.pending_cost = proposal.cost_usd + self.pending_cost, 0.0
        c.description = proposal.description
        changed = self.workspace.changed_paths(best_commit)
        if self.stop.requested():
            c.commit = self.commit(exp, c.description) if changed else None
            c.verdict = Verdict("interrupted", note="stopped before training")
            return c
        if not changed:
            c.verdict = Verdict("invalid", note="no change", failure="your last proposal changed nothing")
            return c
        c.commit = self.commit(exp, c.description)
        folder.diff.write_text(self.workspace.diff(best_commit, c.commit))
        problem = phase.check(self.workspace.path, self.config.env_id, changed)
        if problem:
            c.verdict = Verdict("invalid", note=problem, failure=f"the proposal was rejected: {problem}")
        return c

    def commit(self, exp: int, description: str) -> str:
        commit = self.workspace.commit(description)
        self.workspace.keep_ref(exp, commit)  # reachable while the branch goes back for the next candidate
        self.journal.stage(exp, "committed", commit=commit)
        return commit

    def commit_leftovers(self, exp: int, best_commit: str) -> Optional[str]:
        changed = self.workspace.changed_paths(best_commit)
        return self.commit(exp, f"exp {exp}: unfinished edits (stopped)") if changed else None

    def backoff_s(self) -> float:
        """How long to wait after the latest failure in a row (exponential, capped)."""
        self.failures += 1
        return min(self.limits.backoff_cap_s, self.limits.backoff_base_s * 2 ** (self.failures - 1))

    def _failed(self, exp: int, exc: Exception, best_commit: str) -> None:
        self.pending_cost += float(getattr(exc, "cost_usd", 0.0) or 0.0)
        delay = self.backoff_s()
        log.warning("exp %d: the agent failed (%s: %s); retrying in %.0fs (failure %d in a row)",
                    exp, type(exc).__name__, exc, delay, self.failures)
        self.workspace.reset_to(best_commit)
        self.journal.end(exp)
        self.stop.sleep(delay)

    def repair(self, c: Candidate, phase: Phase, failure: str, round_: int) -> Repair:
        """A repair round: the agent gets the verifier's report and edits the same file; a commit."""
        current = c.commit
        self.workspace.reset_to(current)
        ctx = self.context(c.exp, phase, c.folder, repair_round=round_)
        ctx.last_failure = failure
        try:
            proposal = self.propose(ctx)
        except NoMoreProposals:
            return Repair("no more")
        except StopRequested:
            return Repair("stopped")
        changed = self.workspace.changed_paths(current)
        if not changed:
            return Repair("unchanged", cost_usd=proposal.cost_usd)
        problem = phase.check(self.workspace.path, self.config.env_id, changed)
        commit = self.commit(c.exp, f"{proposal.description} (repair round {round_})")
        c.commit = commit
        self.journal.stage(c.exp, f"repair {round_}", commit=commit)
        return Repair("invalid" if problem else "ok", commit=commit, cost_usd=proposal.cost_usd, problem=problem or "")
