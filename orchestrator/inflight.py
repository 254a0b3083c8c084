"""The experiments in flight: what `state.json` records so that `status` can show them and a
`--resume` after any crash can account for them and cancel what they left running.

One record per experiment (a round of `--parallel K` has K): its number, phase, stage, commit,
and the runner handles it started (a local process group, a Modal function call: waiting for a
container or running). Every change is written atomically before the step it announces, so a kill
at any instant leaves a record that is at worst one step behind.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Optional

from .daemon import read_state, write_state


class InFlight:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.session_started = time.time()
        self.records: dict[int, dict] = {}
        self.waiting: Optional[str] = None      # e.g. "waiting for disk space on /data"
        self._lock = threading.Lock()           # candidates of a round record handles concurrently

    def begin(self, exp: int, phase: str, stage: str, rows_before: int, commit: Optional[str] = None) -> None:
        with self._lock:
            self.records[exp] = {"exp": exp, "phase": phase, "stage": stage, "started": time.time(),
                                 "rows_before": rows_before, "commit": commit, "handles": []}
            self._save()

    def stage(self, exp: int, stage: str, commit: Optional[str] = None) -> None:
        with self._lock:
            record = self.records.get(exp)
            if record is None:
                return
            record["stage"] = stage
            if commit:
                record["commit"] = commit
            self._save()

    def add_handle(self, exp: int, handle: dict) -> None:
        """Record a runner handle before waiting on it, so a resume can cancel it."""
        with self._lock:
            record = self.records.get(exp)
            if record is None:
                return
            record["handles"].append(handle)
            record["stage"] = handle.get("stage", record["stage"])
            self._save()

    def update_handle(self, exp: int, call_id: str, **fields) -> None:
        """What a recorded Modal call is doing now (state: waiting for a GPU, running, ended), for `status`."""
        with self._lock:
            record = self.records.get(exp)
            handles = [h for h in (record or {}).get("handles", []) if h.get("call_id") == call_id]
            if not handles:
                return
            handles[-1].update(fields)
            self._save()

    def end(self, exp: int) -> None:
        with self._lock:
            self.records.pop(exp, None)
            self._save()

    def clear(self) -> None:
        with self._lock:
            self.records.clear()
            self._save()

    def set_waiting(self, text: Optional[str]) -> None:
        with self._lock:
            self.waiting = text
            self._save()

    def _save(self) -> None:
        write_state(self.run_dir, {"pid": os.getpid(), "session_started": self.session_started,
                                   "in_flight": sorted(self.records.values(), key=lambda r: r["exp"]),
                                   "waiting": self.waiting})


def recorded(run_dir: Path) -> list[dict]:
    """The records a previous daemon left (also the single-record form of older runs)."""
    state = read_state(run_dir).get("in_flight")
    if isinstance(state, dict):
        state = [state]
    records = list(state or [])
    for record in records:  # older runs recorded bare process group ids
        record.setdefault("handles", [{"kind": "local", "pgid": pgid} for pgid in record.pop("pgids", [])])
    return records
