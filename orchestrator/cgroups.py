"""cgroup v2: each command run_group starts may get its own cgroup `autorl-<marker>` below the
daemon's, killed as a whole when the command ends (see processes.py for where this stands among
the guarantees that nothing outlives its experiment). Empty ones a killed daemon left are pruned."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

CGROUP_PREFIX = "autorl-"
STALE_CGROUP_S = 60.0  # an empty autorl-* cgroup older than this is a killed daemon's leftover


@lru_cache(maxsize=None)
def _cgroup2_mount() -> Optional[Path]:
    try:
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                fields = line.split()
                if " - cgroup2 " in line and len(fields) > 4:
                    return Path(fields[4])
    except OSError:
        pass
    return None


def _own_cgroup() -> Optional[Path]:
    mount = _cgroup2_mount()
    if mount is None:
        return None
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return mount / line[3:].strip().lstrip("/")
    except OSError:
        pass
    return None


def join_cgroup(procs_file: str) -> Callable[[], None]:
    def join() -> None:
        with open(procs_file, "w") as procs:
            procs.write(str(os.getpid()))
    return join


@lru_cache(maxsize=None)
def cgroup_base() -> Optional[Path]:
    """The cgroup v2 directory under which each command gets its own cgroup, when this process
    may create one there and move a child into it (tried once); else None."""
    base = _own_cgroup()
    if base is None or not os.access(base, os.W_OK):
        return None
    trial = base / f"{CGROUP_PREFIX}probe-{os.getpid()}"
    try:
        trial.mkdir(exist_ok=True)
        done = subprocess.run(["true"], preexec_fn=join_cgroup(str(trial / "cgroup.procs")),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        ok = done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    finally:
        remove_cgroup(trial)
    return base if ok else None


def cgroup_pids(cgroup: Path) -> list[int]:
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_cgroup(cgroup: Path) -> int:
    """SIGKILL every process in `cgroup`; returns how many there were."""
    pids = cgroup_pids(cgroup)
    if not pids:
        return 0
    try:
        (cgroup / "cgroup.kill").write_text("1")
    except OSError:  # kernel < 5.14: freeze, kill each member, thaw
        try:
            (cgroup / "cgroup.freeze").write_text("1")
        except OSError:
            pass
        for _ in range(20):
            members = cgroup_pids(cgroup)
            if not members:
                break
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)
        try:
            (cgroup / "cgroup.freeze").write_text("0")
        except OSError:
            pass
    return len(pids)


def remove_cgroup(cgroup: Path, wait_s: float = 5.0) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # still populated (killed processes not yet gone)
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def prune_cgroups(min_age_s: float = STALE_CGROUP_S) -> int:
    """Remove empty `autorl-*` cgroups older than `min_age_s` that a killed daemon left behind
    (a younger one may belong to a command another daemon is just starting). Returns how many."""
    base = cgroup_base()
    if base is None:
        return 0
    removed = 0
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(CGROUP_PREFIX) and e.is_dir()]
    except OSError:
        return 0
    for entry in entries:
        try:
            if time.time() - entry.stat().st_mtime < min_age_s or cgroup_pids(Path(entry.path)):
                continue
            os.rmdir(entry.path)
            removed += 1
        except OSError:
            continue
    return removed


def cgroup_of(pid: int) -> Optional[Path]:
    mount = _cgroup2_mount()
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::") and mount is not None:
                return mount / line[3:].strip().lstrip("/")
    except OSError:
        pass
    return None
