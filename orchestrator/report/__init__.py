"""The morning report of a run: a terminal summary, `progress.png` and a self-contained `report.html`.

The baseline-to-best gain carries a 95% bootstrap CI of the difference of mean episode returns,
computed from the per-episode returns of the trusted harness. `refresh(run_dir)` rewrites the
files; it never raises (the loop calls it after every row).

  statistics  iqm, seed_ci
  night       Night: a run folder read once (rows, samples, noise)
  text        the terminal summary
  charts      progress, return distributions, throughput and cost, learning curves
  curves      each experiment's learning curve, from its train.log
  tensorboard results/<tag>/tensorboard/exp-NNNN/: the curves, score, status and description
  html        the page
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

from ..daemon import log
from ..results import RunFolder
from .charts import curves_png, distributions_png, kept_curves_png, night_png, progress_png
from .curves import incumbent_of, night_curves
from .tensorboard import write_events
from .html import html_page
from .night import Night, Sample, load
from .statistics import iqm, seed_ci
from .text import summary_text

__all__ = ["Night", "Sample", "iqm", "latest_run", "load", "refresh", "seed_ci", "summary_text", "write"]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write(run_dir: Path) -> Night:
    """Write progress.png and report.html of a run; returns what they were made from."""
    night = load(run_dir)
    progress = progress_png(night)
    curves = night_curves(night.run_dir, night.rows)
    page = html_page(night, progress, distributions_png(night), night_png(night), curves_png(night, curves),
                     kept_curves_png(curves, incumbent_of))
    folder = night.folder
    write_events(folder, night.rows, curves)
    _write_atomic(folder.progress_png, progress)
    _write_atomic(folder.report_html, page.encode("utf-8"))
    return night


def refresh(run_dir: Path) -> None:
    """Rewrite the report (after every row, at the end of a run); never raises."""
    try:
        started = time.monotonic()
        write(Path(run_dir))
        elapsed = time.monotonic() - started
        if elapsed > 2.0:
            log.info("report rewritten in %.1fs", elapsed)
    except Exception as exc:  # the night goes on without a fresh report
        log.warning("could not write the report of %s: %s: %s", Path(run_dir).name, type(exc).__name__, exc)


def latest_run(results_root: Path) -> Optional[Path]:
    """The run folder whose results.tsv (or run.json) changed last."""
    candidates = []
    for config in Path(results_root).glob(f"*/{RunFolder.CONFIG}"):
        results = config.parent / RunFolder.RESULTS
        candidates.append(((results if results.exists() else config).stat().st_mtime, config.parent))
    return max(candidates)[1] if candidates else None
