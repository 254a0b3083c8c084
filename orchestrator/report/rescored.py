"""A night's out-of-sample figure, as results/<tag>/rescore.json holds it: the start and the best
trained again on the same fresh seeds (orchestrator/rescore.py trains them) and the Welch t interval
of their difference, the seeds as units. The summary and report.html lead with it when it exists."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

FILE = "rescore.json"


@dataclass
class Rescore:
    """The start and the best, each trained on the same fresh seeds and scored by the harness."""
    start_commit: str
    best_commit: str
    seeds: list
    start_scores: list                     # one per seed that trained and scored (None where it failed)
    best_scores: list
    time: str = ""

    @property
    def complete(self) -> bool:
        return None not in self.start_scores + self.best_scores and len(self.seeds) >= 2

    @property
    def gain(self) -> float:
        return _mean(self.best_scores) - _mean(self.start_scores)

    @property
    def interval(self) -> tuple[float, float]:
        """95% Welch t interval of best minus start, the seeds as units (nan without two of each)."""
        best, start = _scored(self.best_scores), _scored(self.start_scores)
        if len(best) < 2 or len(start) < 2:
            return math.nan, math.nan
        from scipy import stats

        vb, vs = _var(best) / len(best), _var(start) / len(start)
        se = math.sqrt(vb + vs)
        if se == 0:
            return self.gain, self.gain
        df = (vb + vs) ** 2 / ((vb ** 2 / (len(best) - 1) if vb else 0) + (vs ** 2 / (len(start) - 1) if vs else 0))
        half = float(stats.t.ppf(0.975, df)) * se
        return self.gain - half, self.gain + half

    def line(self) -> str:
        """The summary's lead: the gain on fresh seeds with its interval."""
        low, high = self.interval
        return (f"{self.gain:+.2f}, 95% CI [{low:+.2f}, {high:+.2f}] on {len(self.seeds)} fresh training seeds "
                f"(start {_listed(self.start_scores)}, best {_listed(self.best_scores)})")

    def save(self, run_dir: Path) -> None:
        (Path(run_dir) / FILE).write_text(json.dumps({**asdict(self), "gain": self.gain,
                                                    "interval": list(self.interval)}, indent=1) + "\n")


def load(run_dir: Path) -> Optional[Rescore]:
    try:
        data = json.loads((Path(run_dir) / FILE).read_text())
        return Rescore(data["start_commit"], data["best_commit"], data["seeds"], data["start_scores"],
                       data["best_scores"], data.get("time", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _scored(values: list) -> list[float]:
    return [float(v) for v in values if v is not None]


def _mean(values: list) -> float:
    scored = _scored(values)
    return sum(scored) / len(scored) if scored else math.nan


def _var(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def _listed(values: list) -> str:
    return ", ".join("failed" if v is None else f"{v:.1f}" for v in values)
