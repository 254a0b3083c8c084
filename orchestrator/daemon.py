"""What makes the loop a daemon: the run lock, stop requests (signals, `stop`), logging, state.

The daemon is single-threaded. A stop request (SIGTERM, SIGINT, or the STOP file written by
`python -m orchestrator stop`) sets a flag the loop polls between steps and while it waits on a
process; while the agent is working it interrupts the agent at once (StopRequested).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

from .results import RunFolder

LOCK_NAME, STOP_NAME, STATE_NAME, LOG_NAME = RunFolder.LOCK, RunFolder.STOP, RunFolder.STATE, RunFolder.LOG

log = logging.getLogger("autorl")


# ---------------------------------------------------------------- lock
class LockHeld(Exception):
    def __init__(self, pid: Optional[int], path: Path):
        self.pid = pid
        super().__init__(f"another daemon (pid {pid if pid else 'unknown'}) holds {path}")


class RunLock:
    """An exclusive fcntl.flock on results/<tag>/daemon.lock, holding the daemon's pid.

    The kernel drops it when the process dies (even by kill -9), so there is no stale lock."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(lock_holder(self.path.parent), self.path) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def lock_holder(run_dir: Path) -> Optional[int]:
    """The pid of the daemon running this run, or None when none is."""
    path = Path(run_dir) / LOCK_NAME
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- stop requests
class StopRequested(BaseException):
    """Raised inside the agent's turn when a stop arrives (BaseException: agents' `except
    Exception` handlers must not swallow it)."""


class StopControl:
    def __init__(self, run_dir: Path):
        self.stop_file = Path(run_dir) / STOP_NAME
        self.reason: Optional[str] = None
        self._interruptible = False

    def install(self) -> None:
        self.stop_file.unlink(missing_ok=True)  # a request for an earlier session is void
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        first = self.reason is None
        self.reason = self.reason or signal.Signals(signum).name
        if first:
            log.info("%s received: stopping after aborting the experiment in flight", self.reason)
        if self._interruptible:
            self._interruptible = False
            raise StopRequested(self.reason)

    def request(self, reason: str) -> None:
        """The daemon stops itself (a limit reached in flight), as a stop request would stop it."""
        if self.reason is None:
            self.reason = reason
            log.info("stopping: %s", reason)

    def requested(self) -> bool:
        if self.reason is None and self.stop_file.exists():
            self.reason = "stop request"
            log.info("stop requested (%s): aborting the experiment in flight", self.stop_file)
        return self.reason is not None

    @contextmanager
    def interruptible(self):
        """While inside, a stop signal raises StopRequested right away (the agent's turn)."""
        if self.requested():
            raise StopRequested(self.reason)
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def sleep(self, seconds: float) -> bool:
        """Sleep unless a stop arrives; True when it slept the whole time."""
        return sleep_unless(self.requested, seconds)


def sleep_unless(stop_requested: Callable[[], bool], seconds: float, tick_s: float = 0.5) -> bool:
    """Sleep `seconds`, looking at `stop_requested` every `tick_s`; True when it slept the whole time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop_requested():
            return False
        time.sleep(min(tick_s, max(0.0, deadline - time.monotonic())))
    return not stop_requested()


def request_stop(run_dir: Path, wait_s: float = 120.0) -> tuple[Optional[int], bool]:
    """Ask the run's daemon to stop: STOP file plus SIGTERM. Returns (pid, stopped in time)."""
    pid = lock_holder(run_dir)
    if pid is None:
        return None, True
    (Path(run_dir) / STOP_NAME).write_text(f"requested by pid {os.getpid()}\n")
    if pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if lock_holder(run_dir) is None:
            return pid, True
        time.sleep(0.2)
    return pid, False


# ---------------------------------------------------------------- state of the experiment in flight
def write_state(run_dir: Path, state: dict) -> None:
    """Atomically (write + rename) so a kill at any instant leaves the old or the new state."""
    path = Path(run_dir) / STATE_NAME
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as handle:
        json.dump(state, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_state(run_dir: Path) -> dict:
    path = Path(run_dir) / STATE_NAME
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


# ---------------------------------------------------------------- logging
class _LineClearingHandler(logging.StreamHandler):
    """On a TTY, erase the progress line before printing an event line."""

    def emit(self, record):
        if progress.active:
            self.stream.write("\r\x1b[K")
            progress.active = False
        super().emit(record)


class _Progress:
    def __init__(self):
        self.active = False
        self.enabled = False
        self._last = 0.0

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 1.0:
            return
        self._last = now
        sys.stdout.write("\r\x1b[K" + text)
        sys.stdout.flush()
        self.active = True


progress = _Progress()


@contextmanager
def logging_into(path: Path):
    """While inside, the daemon's log lines (INFO and up) also go to the file `path` (a command's own
    log, e.g. transfer's); what else logging does is left as it was."""
    handler = logging.FileHandler(path)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    handler.setLevel(logging.INFO)
    level = log.level
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)
        handler.close()
        log.setLevel(level)


def setup_logging(run_dir: Optional[Path] = None) -> None:
    """One line per event to stdout and results/<tag>/daemon.log (works under nohup, no TTY)."""
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    stream = _LineClearingHandler(sys.stdout)
    stream.setFormatter(formatter)
    log.addHandler(stream)
    if run_dir is not None:
        file_handler = logging.FileHandler(Path(run_dir) / LOG_NAME)
        file_handler.setFormatter(formatter)
        log.addHandler(file_handler)
    progress.enabled = sys.stdout.isatty()
