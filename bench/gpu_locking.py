"""The GPU as a timed resource for bench/gpu_table.py: whoever times a figure holds a file lock, and the
background processes (verifications) are paused with SIGSTOP while anyone holds it, so a speed figure
never shares the GPU and a paused process's seconds can be left out of its own timing."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from pathlib import Path


class GpuLock:
    """`with GpuLock(path):` the GPU is this process's to time (an exclusive flock, across processes)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self):
        self.handle = open(self.path, "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def lock_is_held(path: Path) -> bool:
    """Whether anyone holds the lock now (probed without waiting; a free lock is released at once)."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


class Pausable:
    """Processes (each the leader of its own session) stopped while the lock is held and continued
    when it is free; `paused_between` tells how long one was stopped in a window."""

    def __init__(self, lock_path: Path, poll_s: float = 0.02):
        self.lock_path, self.poll_s = Path(lock_path), poll_s
        self.lock_path.touch()
        self._procs: dict[int, list[list[float | None]]] = {}  # pid -> pause intervals [start, end or None]
        self._guard = threading.Lock()
        self._stopping = threading.Event()
        self._paused = False  # whether the lock was held at the last look
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def add(self, proc: subprocess.Popen) -> None:
        with self._guard:
            self._procs[proc.pid] = []
            if self._paused:  # started while someone times: it waits like the others
                self._procs[proc.pid].append([time.time(), None])
                self._signal(proc.pid, signal.SIGSTOP)

    def remove(self, proc: subprocess.Popen) -> None:
        with self._guard:
            intervals = self._procs.pop(proc.pid, None)
            if intervals and intervals[-1][1] is None:
                intervals[-1][1] = time.time()
                self._signal(proc.pid, signal.SIGCONT)

    def paused_between(self, proc: subprocess.Popen, start: float, end: float) -> float:
        with self._guard:
            intervals = list(self._procs.get(proc.pid, []))
        return sum(max(0.0, min(end, b if b is not None else end) - max(start, a)) for a, b in intervals)

    def close(self) -> None:
        self._stopping.set()
        self._thread.join()
        with self._guard:
            for pid, intervals in self._procs.items():
                if intervals and intervals[-1][1] is None:
                    self._signal(pid, signal.SIGCONT)

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s):
            busy = lock_is_held(self.lock_path)
            if busy == self._paused:
                continue
            with self._guard:
                now = time.time()
                for pid, intervals in self._procs.items():
                    if busy:
                        intervals.append([now, None])
                    elif intervals and intervals[-1][1] is None:
                        intervals[-1][1] = now
                    self._signal(pid, signal.SIGSTOP if busy else signal.SIGCONT)
                self._paused = busy

    @staticmethod
    def _signal(pid: int, signum: int) -> None:
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:  # it ended meanwhile
            pass
