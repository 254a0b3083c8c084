"""The ledger of a night: results.tsv read once, then kept in memory as each row is appended.

The loop asks it what the night has done (the best so far, the next experiment number, the
baselines, the cost); only `reload` (after a resume repairs a torn last line) reads the file
again. Appending writes the row to results.tsv first (fsynced, a whole line or nothing) and
only then to memory, so the two never disagree.
"""
from __future__ import annotations

from typing import Optional

from .results import ResultsFile, Row, summarize


class Ledger:
    def __init__(self, results: ResultsFile):
        self.file = results
        results.upgrade()  # a run resumed from before a schema change appends today's rows
        self.rows: list[Row] = results.read()

    def reload(self) -> None:
        self.rows = self.file.read()

    def write(self, row: Row) -> None:
        """Append one row (raises OSError, e.g. on a full disk, with nothing recorded)."""
        self.file.append(row)
        self.rows.append(row)

    # ------------------------------------------------------------ what the night has done
    def summary(self) -> dict:
        return summarize(self.rows)

    def next_exp(self) -> int:
        return max([r.exp for r in self.rows] + [0]) + 1

    def experiments_done(self) -> int:
        return len({r.exp for r in self.rows if r.exp > 0})

    def cost(self) -> float:
        return sum(r.cost_usd for r in self.rows)

    def baselines(self) -> list[Row]:
        """The scored baseline runs of exp 0."""
        return [r for r in self.rows if r.exp == 0 and r.status == "baseline"]

    def kept_translation(self) -> Optional[Row]:
        """The last kept translate experiment, if any."""
        kept = [r for r in self.rows if r.phase == "translate" and r.status == "keep"]
        return kept[-1] if kept else None

    def needs_rebaseline(self) -> bool:
        """A translation was kept and the incumbent train.py has not been retrained on it yet."""
        kept = [i for i, r in enumerate(self.rows) if r.phase == "translate" and r.status == "keep"]
        return bool(kept) and not any(r.phase == "train" and r.status != "interrupted"
                                      for r in self.rows[kept[-1] + 1:])

    def last_best(self) -> Optional[float]:
        scored = [r.best for r in self.rows if r.best is not None]
        return scored[-1] if scored else None

    def summary_line(self) -> str:
        s = self.summary()
        counts = " ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
        return (f"best {s['best']:.3f} at {s['best_commit']} (exp {s['best_exp']}); {s['experiments']} "
                f"experiments ({counts}); cost ${s['cost_usd']:.2f}" if s["best"] is not None
                else f"no score yet; {counts}")
