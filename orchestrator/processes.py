"""Process groups: spawn a command in its own session with a scrubbed environment, wait with a
deadline, and kill everything it started when it ends, times out, writes too much or is stopped.

Everything that runs candidate code or an agent's command goes through `run_group`.

What "nothing outlives run_group" rests on, strongest first:

1. With a sandbox (`walls=`, bubblewrap available) the command runs in its own PID namespace:
   when its first process ends, or bwrap is killed with the group, the kernel kills every
   process in the namespace, however it detached (fork + setsid + fork, reparented to init).
   Guaranteed, also against code that tries to escape.
2. Without the sandbox, where a cgroup v2 subtree is writable (root, or a delegated systemd
   scope), the command starts inside its own cgroup `autorl-<marker>` below the daemon's; at the
   end the cgroup is killed as a whole (`cgroup.kill`, else freeze and kill each member).
   Guaranteed against accidents (double-forked daemons, stray workers); code running as root
   could still write itself into another cgroup. Empty `autorl-*` cgroups a killed daemon left
   are pruned after a minute (`cgroups.prune_cgroups`).
3. Always: every process is started with `AUTORL_EXPERIMENT_ID=<marker>` in its environment;
   at the end (and by `kill_marked(marker)` after a `kill -9` of the daemon) any process whose
   /proc/<pid>/environ carries the marker is killed, plus the descendants seen while polling.
   A process that re-executes itself with a cleared environment and escapes before a poll is
   not found this way; only 1 and 2 catch it. (A child subreaper, prctl
   PR_SET_CHILD_SUBREAPER, is deliberately not used: it makes the daemon the parent of every
   orphan of every command it runs -- git included -- and leaves their zombies to reap.)

With `output_dir` and `max_output_bytes` the directory's size (apparent bytes of the files
below it) is measured every OUTPUT_CHECK_INTERVAL_S while the command runs and once after it
ends; past the cap the group is killed and `ProcessResult.output_exceeded` is set. The command
also gets RLIMIT_FSIZE = cap + 1 byte, so a single file growing past the cap is stopped at once
(SIGXFSZ) -- this per-file limit applies to every file it writes, its log included.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import psutil

from . import cgroups

if TYPE_CHECKING:
    from orchestrator.sandbox import Sandbox, Walls

# A variable whose name contains one of these never reaches candidate code or agent commands.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "COOKIE", "PRIVATE")
# Credentials the daemon itself holds under names without the markers above.
DAEMON_CREDENTIALS = ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH", "MODAL_TOKEN_ID", "AWS_PROFILE")
# A secret copied under an innocent name (FOO=$ANTHROPIC_API_KEY) is caught by its value.
MIN_SECRET_VALUE_LENGTH = 8

# Every process run_group starts carries this variable; its value identifies the run_group call.
MARKER_VAR = "AUTORL_EXPERIMENT_ID"
OUTPUT_CHECK_INTERVAL_S = 0.5
POLL_S = 0.2


def _is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS) or upper.startswith(DAEMON_CREDENTIALS)


def scrubbed_env(extra: dict | None = None) -> dict:
    """The daemon's environment without secrets, plus `extra`."""
    secret_values = [
        value for name, value in os.environ.items()
        if _is_secret_name(name) and len(value) >= MIN_SECRET_VALUE_LENGTH
    ]
    env = {
        name: value
        for name, value in os.environ.items()
        if not _is_secret_name(name) and not any(secret in value for secret in secret_values)
    }
    env.update(extra or {})
    return env


def new_marker() -> str:
    """A fresh value for AUTORL_EXPERIMENT_ID (record it before spawning to kill by it later)."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------- process groups
def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(MARKER_VAR) == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs, timeout_s: float = 5.0) -> None:
    """Wait until each process has exited (a zombie left to another parent counts as exited)."""
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        pending = [proc for proc in pending if not _gone(proc)]
        if pending:
            time.sleep(0.01)


def _kill_and_wait(procs, timeout_s: float = 5.0) -> int:
    killed = []
    for proc in procs:
        try:
            proc.kill()  # psutil checks it is still the same process (pid + start time)
            killed.append(proc)
        except psutil.Error:
            pass
    _wait_gone(killed, timeout_s)
    return len(killed)


def kill_marked(marker: str) -> int:
    """Kill every process started under `marker` (AUTORL_EXPERIMENT_ID) and its cgroup, wherever
    it went: for `--resume` after the daemon was killed. Returns the number of processes killed."""
    if not marker:
        return 0
    procs = _marked(marker)
    name = f"{cgroups.CGROUP_PREFIX}{marker}"
    found = {cgroups.cgroup_of(proc.pid) for proc in procs}
    base = cgroups.cgroup_base()
    if base is not None:
        found.add(base / name)
    found = {cgroup for cgroup in found if cgroup is not None and cgroup.name == name}
    killed = 0
    for cgroup in found:
        if cgroup.is_dir():
            killed += cgroups.kill_cgroup(cgroup)
    killed = max(killed, _kill_and_wait(procs))
    for cgroup in found:
        cgroups.remove_cgroup(cgroup)
    cgroups.prune_cgroups()
    return killed


def kill_orphaned_group(pgid: int, cwd_inside: list[Path], marker: Optional[str] = None) -> int:
    """Kill what is left of a recorded process group after the daemon died.

    The pgid is only trusted if a member still runs with its cwd inside one of `cwd_inside` (the
    run's worktree or folder) or carries `marker`, so a reused pgid of an unrelated process is
    never touched. A sandboxed command's group is bwrap (and its PID-namespace init): killing it
    ends the namespace and every process inside. With `marker`, processes that left the group
    (setsid) are killed too (`kill_marked`). Returns the number of processes killed."""
    roots = [str(Path(p).resolve()) for p in cwd_inside]

    def inside(path: str) -> bool:
        return any(path == root or path.startswith(root + os.sep) for root in roots)

    members = group_members(pgid)
    ours = False
    for proc in members:
        try:
            environ = proc.environ()
            ours = (ours or inside(proc.cwd()) or inside(environ.get("AUTORL_OUTPUT_DIR", "/nonexistent"))
                    or bool(marker and environ.get(MARKER_VAR) == marker))
        except psutil.Error:
            continue
    killed = 0
    if ours:
        kill_group(pgid)
        _wait_gone(members)
        killed = len(members)
    if marker:
        killed += kill_marked(marker)
    else:
        cgroups.prune_cgroups()
    return killed


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return set()


def tree_size(path: Path) -> int:
    """Apparent size in bytes of the files below `path` (symlinks not followed)."""
    total, stack = 0, [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


@dataclass
class ProcessResult:
    returncode: Optional[int]
    wall_s: float
    timed_out: bool = False
    interrupted: bool = False
    output_exceeded: bool = False  # the output directory grew past max_output_bytes
    output_bytes: int = 0          # its size at the last measurement (0 when not watched)
    marker: str = ""               # AUTORL_EXPERIMENT_ID of every process it started
    sandboxed: bool = False        # the command ran inside the sandbox's walls
    artifact_s: Optional[float] = None  # seconds from the start to the watched artifact's last change


def file_fingerprint(path: Optional[Path]) -> Optional[tuple]:
    """What changes whenever a file is written, replaced or touched (its ctime is the kernel's: no
    utime can set it back); None when there is no file."""
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def run_group(
    cmd: list[str],
    cwd: Path,
    env: dict,
    log_path: Path,
    timeout_s: float,
    should_stop: Callable[[], bool],
    on_spawn: Callable[[int], None] = lambda pgid: None,
    on_tick: Callable[[float], None] = lambda elapsed: None,
    stderr_path: Optional[Path] = None,
    *,
    walls: Optional["Walls"] = None,
    sandbox: Optional["Sandbox"] = None,
    output_dir: Optional[Path] = None,
    max_output_bytes: Optional[int] = None,
    marker: Optional[str] = None,
    artifact: Optional[Callable[[], Optional[tuple]]] = None,
) -> ProcessResult:
    """Run `cmd` in a new session, output to `log_path` (stderr too, unless `stderr_path`); kill its
    group at the timeout, on stop, and when an exception (a stop signal) interrupts the wait.

    `walls`: run inside the sandbox (`sandbox`, default Sandbox("auto"): unwalled where bubblewrap
    does not work). `output_dir` + `max_output_bytes`: cap what it writes there. `marker`: the
    AUTORL_EXPERIMENT_ID to give it (default: a fresh one; record it before spawning, for
    `kill_marked` after a crash). Two run_group calls running at the same time must not share a
    marker: the first to end kills what carries it. `artifact`: a fingerprint of the file the
    command delivers (file_fingerprint), looked at every OUTPUT_CHECK_INTERVAL_S and once at the
    end; `artifact_s` is when it was last seen to change, by the daemon's clock, not the file's.
    Whatever it started is dead when this returns (see the module docstring)."""
    if sandbox is not None and walls is None:
        raise ValueError("run_group: a sandbox needs walls")
    sandboxed = False
    if walls is not None:
        if sandbox is None:
            from orchestrator.sandbox import Sandbox
            sandbox = Sandbox("auto")
        sandboxed = sandbox.active
        cmd = sandbox.wrap(cmd, walls)
    marker = marker or new_marker()
    env = {**(os.environ if env is None else env), MARKER_VAR: marker}
    watch = output_dir is not None and max_output_bytes is not None

    cgroup: Optional[Path] = None
    base = cgroups.cgroup_base()
    if base is not None:
        try:
            cgroup = base / f"{cgroups.CGROUP_PREFIX}{marker}"
            cgroup.mkdir(exist_ok=True)
        except OSError:
            cgroup = None
    join = cgroups.join_cgroup(str(cgroup / "cgroup.procs")) if cgroup is not None else None
    fsize = int(max_output_bytes) + 1 if watch else None

    def preexec() -> None:  # in the child, after setsid, before exec: no locks, no imports
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if join is not None:
            join()

    started = time.monotonic()
    timed_out = interrupted = exceeded = False
    output_bytes = 0
    delivered: list = [None, None]  # the artifact's last fingerprint, and when it was first seen so

    def look_at_artifact(now: float) -> None:
        if artifact is not None:
            fingerprint = artifact()
            if fingerprint != delivered[0]:
                delivered[:] = [fingerprint, None if fingerprint is None else now - started]
    try:
        with open(log_path, "ab") as log, open(stderr_path or os.devnull, "ab") as err:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log,
                                    stderr=err if stderr_path else subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=preexec if (fsize is not None or join is not None) else None)
            pgid = proc.pid  # start_new_session: the child leads its own group
            on_spawn(pgid)
            seen: set[psutil.Process] = set()  # descendants, in case one leaves the group (setsid)
            next_check = started + OUTPUT_CHECK_INTERVAL_S
            try:
                while True:
                    try:
                        proc.wait(timeout=POLL_S)
                        look_at_artifact(time.monotonic())  # written since the last look: by the exit at the latest
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    seen |= _descendants(proc.pid)
                    now = time.monotonic()
                    elapsed = now - started
                    on_tick(elapsed)
                    if now >= next_check:
                        next_check = now + OUTPUT_CHECK_INTERVAL_S
                        look_at_artifact(now)
                        if watch:
                            output_bytes = tree_size(output_dir)
                            exceeded = output_bytes > max_output_bytes
                    if should_stop():
                        interrupted = True
                    elif elapsed > timeout_s:
                        timed_out = True
                    if timed_out or interrupted or exceeded:
                        kill_group(pgid)
                        proc.wait()
                        break
            finally:
                kill_group(pgid)  # leftovers: workers, grandchildren
                if cgroup is not None:
                    cgroups.kill_cgroup(cgroup)
                _kill_and_wait([p for p in seen if p.is_running()], timeout_s=2)
                _kill_and_wait(_marked(marker), timeout_s=2)
                if proc.poll() is None:
                    proc.wait()
    finally:
        if cgroup is not None:
            cgroups.kill_cgroup(cgroup)
            cgroups.remove_cgroup(cgroup)
            cgroups.prune_cgroups()
    if watch:
        output_bytes = tree_size(output_dir)
        exceeded = exceeded or output_bytes > max_output_bytes
    return ProcessResult(proc.returncode, time.monotonic() - started, timed_out, interrupted,
                         output_exceeded=exceeded, output_bytes=output_bytes, marker=marker,
                         sandboxed=sandboxed, artifact_s=delivered[1])
