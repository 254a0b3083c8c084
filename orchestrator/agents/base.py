"""The one interface every agent kind implements (Optuna-style: small and stable).

The loop builds an `AgentContext` for each experiment (and each repair round), calls
`agent.propose(ctx)`, and judges only the edits left in the worktree. After the experiment is
scored it calls `agent.tell(ctx, outcome)` so agents that learn from results (optuna) can.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol


@dataclass
class AgentContext:
    phase: str                      # "train", "translate" or "create"
    exp: int                        # experiment number (1, 2, ...)
    env_id: str
    worktree: Path                  # the run's git worktree (runs/<tag>/)
    run_dir: Path                   # results/<tag>/
    exp_dir: Path                   # results/<tag>/exp-NNNN/ (exists; write transcripts here)
    program: str                    # program.md text
    allowed_paths: list[str]        # repo-relative paths the agent may write in this phase
    results_table: str = ""         # compact table of the results so far
    last_failure: Optional[str] = None  # train log tail, or the verification report
    repair_round: int = 0           # translate phase: 0 = first proposal, K = repair round K
    notes_path: Optional[Path] = None   # results/<tag>/notes.md, the agent's own notes
    round_peers: list[str] = field(default_factory=list)  # --parallel: what the others of the round try
    sandbox: str = "auto"           # --sandbox: walls for the commands the agent runs
    main_root: Optional[Path] = None    # the user's checkout (hidden from the agent's commands)


@dataclass
class Proposal:
    description: str                # one line, goes to results.tsv
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    transcript: Optional[Path] = None   # e.g. exp_dir / "agent.jsonl"
    extra: dict = field(default_factory=dict)


@dataclass
class Outcome:
    status: str                     # baseline keep discard crash timeout invalid interrupted screened
    score: Optional[float]          # mean eval return, None when there is none
    best: Optional[float]


class NoMoreProposals(Exception):
    """Raised by an agent that has nothing left to propose (replay at its end): the run ends normally."""


class AgentError(Exception):
    """A transient or agent-side failure: the loop logs it, backs off and goes on."""


class Agent(Protocol):
    name: str

    def propose(self, ctx: AgentContext) -> Proposal:
        """Edit files in ctx.worktree; return the description and usage."""

    def tell(self, ctx: AgentContext, outcome: Outcome) -> None:
        """Learn the outcome of the experiment proposed for ctx (may do nothing)."""
