"""Disk space: what an experiment may leave behind, and waiting out a full disk.

A night must not stall because something filled the disk. What an experiment writes into its
output directory is capped while it runs (the runner kills it past `--max-output-mb`); after it,
`prune` keeps only what the run needs (the policy artifact, eval.json, logs cut to their last
LOG_CAP_MB). When the disk is full for any other reason, `DiskSpace.wait` says so once in the
log and in `status`, writes nothing, and returns when space is back (or a stop arrives).
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Callable, Optional

from .artifacts import POLICY_NAMES
from .daemon import log
from .results import ExpFolder

LOG_CAP_MB = 10                 # a train/eval/verify log keeps its last 10 MB
MIN_FREE_MB = 32                # below this the daemon waits before starting the next step
NIGHT_OF_CAPS = 3               # `run` warns below this many experiments' output caps
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def free_mb(path: Path) -> float:
    return shutil.disk_usage(path).free / 2**20


def is_disk_full(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def prune(folder: ExpFolder, log_cap_mb: float = LOG_CAP_MB) -> int:
    """Remove what an experiment left that the run does not need; returns the bytes freed."""
    freed = 0
    runs = [folder] + folder.confirmations()
    for out in (run.out for run in runs):
        if not out.is_dir():
            continue
        for entry in list(out.iterdir()):
            if entry.name in POLICY_NAMES and entry.is_file():
                continue
            freed += _size(entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    for path in [p for run in runs for p in run.path.glob("*.log")]:
        freed += cut_log(path, log_cap_mb)
    return freed


def cut_log(path: Path, cap_mb: float = LOG_CAP_MB) -> int:
    """Keep the last `cap_mb` of a log, marked as cut; returns the bytes removed."""
    cap = int(cap_mb * 2**20)
    try:
        size = path.stat().st_size
        if size <= cap:
            return 0
        with open(path, "rb") as handle:
            handle.seek(size - cap)
            tail = handle.read()
        tail = tail.split(b"\n", 1)[-1]
        path.write_bytes(f"[autorl: the first {size - len(tail)} bytes of this log were cut]\n".encode() + tail)
        return size - len(tail)
    except OSError:
        return 0


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        try:
            return path.lstat().st_size
        except OSError:
            return 0
    return sum(_size(child) for child in path.iterdir()) if path.is_dir() else 0


class DiskSpace:
    """The filesystem the run writes to. `wait()` blocks while it is (nearly) full."""

    def __init__(self, path: Path, set_waiting: Callable[[Optional[str]], None], should_stop: Callable[[], bool],
                 sleep: Callable[[float], bool], min_free_mb: float = MIN_FREE_MB, poll_s: float = 5.0):
        self.path = Path(path)
        self.set_waiting = set_waiting
        self.should_stop = should_stop
        self.sleep = sleep
        self.min_free_mb = min_free_mb
        self.poll_s = poll_s

    def enough(self) -> bool:
        try:
            return free_mb(self.path) >= self.min_free_mb
        except OSError:
            return False

    def wait(self) -> bool:
        """True once there is room; False when a stop arrived while waiting."""
        if self.enough():
            return True
        text = (f"waiting for disk space on {self.path} ({free_mb(self.path):.0f} MB free, "
                f"{self.min_free_mb:.0f} MB needed); the night goes on by itself once space is freed")
        log.error("%s", text)
        self.announce(text)
        while not self.enough():
            if self.should_stop() or not self.sleep(self.poll_s):
                return False
        log.info("disk space is back on %s (%.0f MB free): going on", self.path, free_mb(self.path))
        self.announce(None)
        return True

    def announce(self, text: Optional[str]) -> None:
        """What `status` shows (None: nothing)."""
        try:
            self.set_waiting(text)  # state.json, for `status`; it may not fit on a full disk
        except OSError:
            pass
