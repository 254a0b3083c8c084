"""The replay agent: applies prepared file snapshots in order (tests, demos, reviewers).

`--replay-dir DIR`: folder `DIR/NNN/` (001, 002, ...) is experiment NNN. Its files, at
repository-relative paths (`DIR/001/candidate/train.py`), are copied over the worktree;
`DIR/NNN/DESCRIPTION` is the one-line description and an optional `DIR/NNN/COST_USD` the cost
to record (to replay a recorded LLM session). Repair round K of a translate experiment uses
`DIR/NNN.rK/`. When the folder for the next experiment does not exist, the run ends normally.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from .base import AgentContext, NoMoreProposals, Outcome, Proposal

META_FILES = {"DESCRIPTION", "COST_USD"}


class ReplayAgent:
    name = "replay"

    def __init__(self, replay_dir: Path):
        self.replay_dir = Path(replay_dir)
        if not self.replay_dir.is_dir():
            raise ValueError(f"--replay-dir {self.replay_dir} is not a directory")

    @classmethod
    def from_args(cls, args, run_dir: Path) -> "ReplayAgent":
        replay_dir = getattr(args, "replay_dir", None)
        if not replay_dir:
            raise ValueError("--agent replay needs --replay-dir DIR (folders 001/, 002/, ... of files)")
        return cls(Path(replay_dir).resolve())

    def folder(self, exp: int, repair_round: int = 0) -> Path:
        suffix = f".r{repair_round}" if repair_round else ""
        names = [f"{exp:03d}{suffix}", f"{exp:04d}{suffix}", f"{exp}{suffix}"]  # 001 is the documented form
        return next((self.replay_dir / n for n in names if (self.replay_dir / n).is_dir()),
                    self.replay_dir / names[0])

    def propose(self, ctx: AgentContext) -> Proposal:
        folder = self.folder(ctx.exp, ctx.repair_round)
        if not folder.is_dir():
            raise NoMoreProposals(f"no {folder}")
        for source in sorted(folder.rglob("*")):
            rel = source.relative_to(folder)
            if source.is_dir() or str(rel) in META_FILES:
                continue
            target = Path(ctx.worktree) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        description_file = folder / "DESCRIPTION"
        description = (description_file.read_text().strip().splitlines() or [""])[0] \
            if description_file.exists() else ""
        cost_file = folder / "COST_USD"
        cost = float(cost_file.read_text().strip()) if cost_file.exists() else 0.0
        return Proposal(description=description or f"replay {folder.name}", cost_usd=cost)

    def phase_hint(self, exp: int):
        """The phase experiment `exp`'s folder is for: translate when it holds envs_fast/ files."""
        folder = self.folder(exp)
        if not folder.is_dir():
            return None
        files = [p.relative_to(folder) for p in folder.rglob("*") if p.is_file()]
        return "translate" if any(f.parts[0] == "envs_fast" for f in files) else "train"

    def tell(self, ctx: AgentContext, outcome: Outcome) -> None:
        pass
