"""The walls around candidate code: a bubblewrap (`bwrap`) sandbox on Linux.

A process run through `Sandbox.wrap(cmd, walls)` sees only what its `Walls` name:

- read-only: the system directories (/usr, /bin, /lib*, /sbin, /etc, /sys), the running Python
  environment (exactly sys.prefix, sys.base_prefix, the interpreter's directories and the
  sys.path entries outside the hidden places -- never their parents: a pyenv interpreter under
  $HOME or a venv inside the checkout shows nothing else of $HOME or the checkout) and
  `Walls.read_only` (the experiment's code snapshot, the harness copy, an artifact);
- writable: `Walls.writable` (the output directory), a private /tmp, /dev/shm and $HOME
  (empty tmpfs mounts that vanish with the sandbox);
- a fresh /dev and /proc; its own PID, IPC and UTS namespaces (when its first process ends the
  kernel kills every process in it, however it detached); no network unless `Walls.network`;
  no capabilities (also when the daemon runs as root); a new session (no terminal injection).

Everything else -- the user's $HOME, the main checkout, the run folder `results/<tag>/`, the git
directory, other runs -- is absent, not merely unreadable. The root of the sandbox is a
read-only tmpfs, so nothing can be created beside the bound paths either.

Modes: "auto" uses the sandbox where it works and otherwise runs commands unwalled (the daemon
says so once: `Sandbox.describe()`), except that a run with a coding agent refuses to start
(`agent_walls_problem`); "require" raises `SandboxUnavailable` at construction when
it does not work; "off" never walls (debugging). Availability is probed once per bwrap binary
with a real trial run (`bwrap ... true`), so a kernel without unprivileged user namespaces or a
container that forbids them is caught with bwrap's own one-line reason.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

MODES = ("auto", "require", "off")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
# Readable by root even without capabilities; nothing in a sandbox needs them.
MASKED_FILES = ("/etc/shadow", "/etc/gshadow")
PROBE_TIMEOUT_S = 20


# Agents that write and run code of their own (an LLM's edits, its run tool): unwalled, their code could
# read the verdicts, run.json's evaluation seed and the Python environment the harness imports
CODING_AGENTS = ("anthropic", "command")


def agent_walls_problem(mode: str, agent_name: str, bwrap: Optional[str] = None) -> Optional[str]:
    """Why a run may not start (None: it may): `--sandbox auto` fails closed for a coding agent where
    bubblewrap cannot run. The offline agents (optuna edits constants, replay applies prepared files)
    go on unwalled, and the start-up log says so (`Sandbox.describe`)."""
    if mode != "auto" or agent_name not in CODING_AGENTS:
        return None
    ok, reason = probe(bwrap)
    if ok:
        return None
    return (f"no sandbox for the {agent_name} agent's code: {reason}. Install bubblewrap, or run with "
            "--sandbox off to accept that its code runs unwalled, with your rights")


class SandboxUnavailable(RuntimeError):
    """`--sandbox require` on a machine where bubblewrap cannot run."""


@dataclass
class Walls:
    """One process's view of the filesystem and network inside the sandbox.

    Paths are bound at the same absolute path as outside, so environment variables such as
    AUTORL_OUTPUT_DIR keep meaning the same directory. `cwd` must lie under a bound path (or be
    the private /tmp): to show a process one file of a folder (the harness copy in the run
    folder), bind the file, not the folder."""
    cwd: Path                        # under a bound path, or /tmp
    read_only: Sequence[Path] = ()   # directories or single files: code snapshot, harness copy, artifact
    writable: Sequence[Path] = ()    # the output directory
    hidden: Sequence[Path] = ()      # never bound for the Python environment (checkout, run folder)
    network: bool = False
    python: bool = True              # bind the running Python environment read-only
    gpu: bool = True                 # pass /dev/nvidia* through when present
    tmp_size: Optional[int] = None   # bytes for each private tmpfs (/tmp, /dev/shm, $HOME)
    masked: Sequence[Path] = ()      # shown as empty private folders, also inside a bound path
    home: bool = False               # bind the user's $HOME (writable) instead of an empty one
    private_tmp: bool = True         # an empty private /tmp (False: the real one, as read_only says)
    env: dict = field(default_factory=dict)  # variables set inside (bwrap --setenv)


def _under(path: str, roots) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def python_paths(hidden: Sequence[Path] = ()) -> list[str]:
    """The directories the running Python needs, each exactly (not its parents).

    The interpreter's prefixes and directories always; a sys.path entry when it is a
    site-packages/dist-packages directory or lies outside the hidden places ($HOME, the daemon's
    cwd, `hidden`): so the checkout that `python -m orchestrator` puts on sys.path stays out."""
    executable = sys.executable or ""
    roots = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    if executable:
        roots |= {os.path.dirname(executable), os.path.dirname(os.path.realpath(executable))}
    roots = {os.path.abspath(r) for r in roots if r and os.path.isdir(r)}
    hidden_roots = {os.path.realpath(p) for p in (Path.home(), os.getcwd(), *hidden)}
    extra = set()
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue  # '' (the cwd), zip files that do not exist, ...
        entry = os.path.abspath(entry)
        real = os.path.realpath(entry)
        if _under(entry, roots) or _under(real, roots):
            continue
        if os.path.basename(real) in ("site-packages", "dist-packages") or not _under(real, hidden_roots):
            extra.add(entry)
    paths = set()
    for path in roots | extra:
        paths |= {path, os.path.realpath(path)}
    # A bind of a directory shows everything below it: drop what an ancestor already covers.
    return sorted(p for p in paths if not any(q != p and _under(p, [q]) for q in paths))


def _depth(path: str) -> int:
    return len(Path(path).parts)


@functools.lru_cache(maxsize=None)
def probe(bwrap: Optional[str] = None) -> tuple[bool, str]:
    """(True, version) when bubblewrap runs here, else (False, one-line reason). Cached."""
    if not sys.platform.startswith("linux"):
        name = "macOS" if sys.platform == "darwin" else sys.platform
        return False, f"no sandbox on {name}: bubblewrap needs Linux namespaces"
    path = bwrap or shutil.which("bwrap")
    if not path or not os.access(path, os.X_OK):
        return False, "bwrap not found on PATH (install bubblewrap: apt-get install bubblewrap)"
    trial = _bwrap_argv(path, ["true"], Walls(cwd=Path("/usr"), python=False, gpu=False))
    try:
        done = subprocess.run(trial, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to start: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or "").strip().splitlines()
        why = lines[-1] if lines else f"exit status {done.returncode}"
        return False, f"bwrap cannot create a sandbox here (user namespaces disabled?): {why}"
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    return True, version or "bubblewrap"


def _bwrap_argv(bwrap: str, cmd: list[str], walls: Walls) -> list[str]:
    mounts: list[tuple[str, list[str]]] = []  # (destination, arguments)
    bound: list[str] = []

    def bind(flag: str, path) -> None:
        path = os.path.abspath(path)
        if not os.path.exists(path):
            raise ValueError(f"sandbox: cannot bind {path}: it does not exist")
        mounts.append((path, [flag, path, path]))
        bound.append(path)

    def tmpfs(path: str) -> None:
        size = ["--size", str(int(walls.tmp_size))] if walls.tmp_size else []
        mounts.append((path, [*size, "--tmpfs", path]))
        bound.append(path)

    whole_root = any(os.path.abspath(p) == "/" for p in walls.read_only)  # the system dirs come with it
    for directory in () if whole_root else SYSTEM_DIRS:
        if os.path.islink(directory):
            mounts.append((directory, ["--symlink", os.readlink(directory), directory]))
        elif os.path.isdir(directory):
            bind("--ro-bind", directory)
    for masked in MASKED_FILES:
        if os.path.isfile(masked):
            mounts.append((masked, ["--ro-bind", "/dev/null", masked]))
    mounts.append(("/dev", ["--dev", "/dev"]))
    mounts.append(("/proc", ["--proc", "/proc"]))
    tmpfs("/dev/shm")
    if walls.private_tmp:
        tmpfs("/tmp")
    if walls.gpu:
        for device in sorted(glob.glob("/dev/nvidia*")):
            mounts.append((device, ["--dev-bind", device, device]))
    if walls.python:
        for path in python_paths(walls.hidden):
            bind("--ro-bind", path)
    for path in walls.read_only:
        bind("--ro-bind", path)
    for path in walls.writable:
        bind("--bind", path)
    home = os.path.abspath(os.path.expanduser("~"))
    if walls.home and _depth(home) > 1:
        bind("--bind", home)  # a coding CLI keeps its login there (the command agent)
    elif _depth(home) > 1 and not _under(home, bound):
        tmpfs(home)  # a private, empty $HOME for caches; binds below it come after (deeper)
    for path in walls.masked:
        path = os.path.abspath(path)
        if os.path.isdir(path):
            mounts.append((path, ["--tmpfs", path]))  # empty; what is written there vanishes
    cwd = os.path.abspath(walls.cwd)
    if not _under(cwd, bound):
        raise ValueError(f"sandbox: the working directory {cwd} is not under a bound path")
    mounts.sort(key=lambda m: _depth(m[0]))  # parents before the mounts inside them
    argv = [bwrap]
    for _, args in mounts:
        argv += args
    argv += ["--remount-ro", "/"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not walls.network:
        argv += ["--unshare-net"]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for name, value in walls.env.items():
        argv += ["--setenv", name, str(value)]
    argv += ["--chdir", cwd, "--", *cmd]
    return argv


class Sandbox:
    """Walls candidate code with bubblewrap where it works (see the module docstring)."""

    def __init__(self, mode: str = "auto", bwrap: Optional[str] = None):
        if mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.bwrap = bwrap or shutil.which("bwrap") or "bwrap"
        self._explicit = bwrap
        if mode == "require" and not self.available:
            raise SandboxUnavailable(f"--sandbox require: {self.reason}")

    @property
    def available(self) -> bool:
        """bubblewrap works on this machine (probed once)."""
        return probe(self._explicit)[0]

    @property
    def reason(self) -> Optional[str]:
        """Why the sandbox is unavailable (one line), or None when it is available."""
        ok, text = probe(self._explicit)
        return None if ok else text

    @property
    def active(self) -> bool:
        """Commands will actually be walled."""
        return self.mode != "off" and self.available

    def describe(self) -> str:
        """One line for the daemon's start-up log."""
        if self.mode == "off":
            return ("sandbox off (--sandbox off): candidate code runs with the daemon's rights; "
                    "only its environment is scrubbed")
        if self.available:
            return (f"sandbox: {probe(self._explicit)[1]} (no network, read-only code and Python, "
                    "only the output directory writable, private /tmp, own PID namespace)")
        return (f"no sandbox: {self.reason}; candidate code runs with the daemon's rights and can "
                "read the user's files (environment scrubbed, processes still killed)")

    def wrap(self, cmd: list[str], walls: Walls) -> list[str]:
        """The bwrap argv that runs `cmd` inside `walls`, or `cmd` unchanged when not active."""
        if not self.active:
            if self.mode == "require":
                raise SandboxUnavailable(f"--sandbox require: {self.reason}")
            return list(cmd)
        return _bwrap_argv(self.bwrap, list(cmd), walls)

    def __repr__(self) -> str:
        return f"Sandbox(mode={self.mode!r}, active={self.active})"
