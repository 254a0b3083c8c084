"""A whole night on Modal, as plain Python. In the night container (`run_night`): the daemon over
a clone of the checkout, its run copied to the results volume after every experiment, and a run
of an earlier night restored from it on --resume. On this machine: the checkout as a git bundle
and the time zone that the night container is given.

Nothing here imports modal: night_daemon of functions.py calls run_night, and tests call
these directly over local folders standing for the volume.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Optional

from .support import (BUNDLE_NAME, CONTAINER_SETTINGS, NIGHT_LOG_NAME, NOT_SYNCED, VOLUME_NAME, copy_changed,
                             fetch_branch_bundle, write_branch_bundle)

# Set in the night container for the daemon it runs: the ids of the running app's functions,
# which functions.configured looks up instead of starting an app of its own.
FUNCTION_IDS_ENV = "AUTORL_MODAL_FUNCTIONS"
DEFAULT_IDENTITY = ("autorl", "autorl@modal.invalid")


# ---------------------------------------------------------------- the run to and from the volume
def sync_run(checkout: Path, tag: str, target_root: Path, night_log: Optional[Path] = None) -> list[str]:
    """Copy results/<tag>/ of `checkout` (new or changed files) and a bundle of its branch
    autorl/<tag> into `target_root/<tag>/` (the volume's layout); returns what was copied."""
    target = Path(target_root) / tag
    source = Path(checkout) / "results" / tag
    copied = copy_changed(source, target, skip=(*NOT_SYNCED, BUNDLE_NAME, NIGHT_LOG_NAME)) if source.is_dir() else []
    if write_branch_bundle(checkout, tag, target / BUNDLE_NAME):
        copied.append(BUNDLE_NAME)
    if night_log is not None and Path(night_log).is_file():
        target.mkdir(parents=True, exist_ok=True)
        data = Path(night_log).read_bytes()
        (target / NIGHT_LOG_NAME).write_bytes(data)
        copied.append(NIGHT_LOG_NAME)
    return copied


def restore_run(source: Path, checkout: Path, tag: str) -> bool:
    """The reverse of sync_run (a night resuming a run of an earlier night): `source` (= volume's
    <tag>/) back into results/<tag>/ and branch autorl/<tag>. False when there is nothing."""
    if not (Path(source) / "results.tsv").is_file():
        return False
    copy_changed(source, Path(checkout) / "results" / tag, skip=(*NOT_SYNCED, BUNDLE_NAME, NIGHT_LOG_NAME))
    if (Path(source) / BUNDLE_NAME).is_file():
        fetch_branch_bundle(checkout, Path(source) / BUNDLE_NAME, tag)
    return True


class RunSync:
    """Copies a run to the volume whenever its results.tsv changes (a thread), and once at the end."""

    def __init__(self, checkout: Path, tag: str, target_root: Path, commit: Callable[[], None],
                 poll_s: float = 5.0, night_log: Optional[Path] = None):
        self.checkout, self.tag, self.target_root = Path(checkout), tag, Path(target_root)
        self.commit, self.poll_s, self.night_log = commit, poll_s, night_log
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen = None
        self._thread = threading.Thread(target=self._watch, name="autorl-volume-sync", daemon=True)

    def _stamp(self):
        try:
            st = (self.checkout / "results" / self.tag / "results.tsv").stat()
            return st.st_mtime_ns, st.st_size
        except OSError:
            return None

    def sync_now(self) -> list[str]:
        with self._lock:
            self._seen = self._stamp()
            try:
                copied = sync_run(self.checkout, self.tag, self.target_root, self.night_log)
                self.commit()
                return copied
            except Exception as exc:  # noqa: BLE001 - a failed copy must not end the night
                print(f"[autorl night] saving results to the volume failed: {exc!r}", flush=True)
                return []

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            stamp = self._stamp()
            if stamp is not None and stamp != self._seen:
                self.sync_now()

    def start(self) -> "RunSync":
        self._thread.start()
        return self

    def stop(self) -> list[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.sync_now()


# ---------------------------------------------------------------- the night container
def clone_bundle(bundle: bytes, dest: Path, identity: tuple[str, str] = DEFAULT_IDENTITY) -> Path:
    """A checkout at `dest` from a `git bundle` of HEAD and the branches (all of them local)."""
    import git

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    bundle_path = dest.parent / f"{dest.name}.bundle"
    bundle_path.write_bytes(bundle)
    repo = git.Repo.clone_from(str(bundle_path), str(dest))
    repo.git.fetch("--quiet", "--update-head-ok", str(bundle_path), "+refs/heads/*:refs/heads/*")
    repo.delete_remote("origin")
    with repo.config_writer() as config:
        config.set_value("user", "name", identity[0] or DEFAULT_IDENTITY[0])
        config.set_value("user", "email", identity[1] or DEFAULT_IDENTITY[1])
    return dest


def _option_values(args: list[str], option: str) -> list[str]:
    """The values given to `option` in `args` (as `--opt V` or `--opt=V`)."""
    values = []
    for i, arg in enumerate(args):
        if arg == option:
            values.append(args[i + 1] if i + 1 < len(args) else "")
        elif arg.startswith(option + "="):
            values.append(arg.split("=", 1)[1])
    return values


def daemon_command(env_id: str, tag: str, run_args: str) -> list[str]:
    """The daemon's command line in the night container: --runner modal unless given, and always
    --sandbox require. The night container holds the --secret, the network and the volume (every
    run's held-out seed), so candidate code run there (verify, bench, the agent's commands) must be
    walled or not run at all: the daemon refuses to start where bubblewrap cannot sandbox."""
    args = shlex.split(run_args or "")
    for option in ("--env", "--tag"):
        if _option_values(args, option):
            raise ValueError(f"give {option} as the night's own option (--env-id / --tag), not in --run-args")
    if any(mode != "require" for mode in _option_values(args, "--sandbox")):
        raise ValueError("a night on Modal always runs with --sandbox require (its container holds the secret "
                         "and the volume's held-out seeds): leave --sandbox out of --run-args")
    if not _option_values(args, "--runner"):
        args = ["--runner", "modal", *args]
    if not _option_values(args, "--sandbox"):
        args = [*args, "--sandbox", "require"]
    return [sys.executable, "-m", "orchestrator", "run", "--env", env_id, "--tag", tag, *args]


def run_night(bundle: bytes, env_id: str, tag: str, run_args: str, volume_root: Path,
              commit: Callable[[], None] = lambda: None, function_ids: Optional[dict] = None,
              workdir: Optional[Path] = None, poll_s: float = 5.0,
              identity: tuple[str, str] = DEFAULT_IDENTITY, tz: str = "", settings: Optional[dict] = None) -> int:
    """Clone the checkout, run the daemon over it (its output to stdout and night.log), and keep
    `volume_root/<tag>/` up to date after every experiment; returns the daemon's exit code.
    `settings`: the container sizes of the machine the night was started from
    (support.container_settings), for the daemon's calls and bills."""
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="autorl-night-"))
    work.mkdir(parents=True, exist_ok=True)
    checkout = clone_bundle(bundle, work / "autorl", identity)
    cmd = daemon_command(env_id, tag, run_args)
    saved = Path(volume_root) / tag
    if (saved / "results.tsv").is_file():
        if "--resume" not in cmd:
            print(f"[autorl night] run {tag!r} already exists in the volume {VOLUME_NAME}: pass "
                  f"--run-args '--resume ...' to continue it, or another --tag", flush=True)
            return 2
        restore_run(saved, checkout, tag)
        print(f"[autorl night] resuming {tag!r} from the volume {VOLUME_NAME}", flush=True)
    env = dict(os.environ)
    env.update({name: str(value) for name, value in (settings or {}).items() if name in CONTAINER_SETTINGS})
    if function_ids:
        env[FUNCTION_IDS_ENV] = json.dumps(function_ids)
    if tz:
        env["TZ"] = tz
    night_log = work / NIGHT_LOG_NAME
    sync = RunSync(checkout, tag, volume_root, commit, poll_s, night_log).start()
    print(f"[autorl night] {' '.join(shlex.quote(c) for c in cmd[1:])}", flush=True)
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        out = getattr(sys.stdout, "buffer", None)
        with open(night_log, "ab") as log:
            for line in proc.stdout:
                if out is not None:
                    out.write(line)
                else:
                    sys.stdout.write(line.decode("utf-8", errors="replace"))
                sys.stdout.flush()
                log.write(line)
                log.flush()
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted here (container stopping): let the daemon stop cleanly
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        sync.stop()


# ---------------------------------------------------------------- on this machine, before the night
BUILD_LOG_NAME = "modal-build.log"  # in results/<tag>/ of the checkout that started the night


@contextlib.contextmanager
def output_saved_to(path: Path):
    """Everything this process writes to its stdout and stderr meanwhile (Modal's image build log
    included, which Modal's output manager writes itself, and what subprocesses write) still
    reaches the terminal, on stdout, and is also appended to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    terminal = {fd: os.dup(fd) for fd in (1, 2)}
    read_end, write_end = os.pipe()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    os.close(write_end)

    def pump() -> None:
        with open(path, "ab") as log, os.fdopen(terminal[1], "wb", closefd=False) as out:
            while chunk := os.read(read_end, 65536):
                out.write(chunk)
                out.flush()
                log.write(chunk)
                log.flush()

    thread = threading.Thread(target=pump, name="autorl-output-tee", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            os.dup2(terminal[fd], fd)  # the pipe's last write end closes: the pump reads to its end
        thread.join(timeout=10)
        os.close(read_end)
        for fd in (1, 2):
            os.close(terminal[fd])


def local_timezone() -> str:
    """This machine's IANA time zone (so --until 07:00 means 07:00 here), or "" if unknown."""
    if os.environ.get("TZ"):
        return os.environ["TZ"].lstrip(":")
    target = os.path.realpath("/etc/localtime")
    return target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else ""


def checkout_bundle(root: Path) -> tuple[bytes, tuple[str, str]]:
    """A git bundle of HEAD and every local branch, and the git identity to commit with."""
    import git

    repo = git.Repo(root)
    if repo.is_dirty(untracked_files=False):
        print("note: uncommitted changes are not part of the night (it runs the committed checkout)")
    with tempfile.TemporaryDirectory(prefix="autorl-bundle-") as tmp:
        path = Path(tmp) / "checkout.bundle"
        repo.git.bundle("create", str(path), "HEAD", "--branches")
        data = path.read_bytes()
    reader = repo.config_reader()
    identity = (reader.get_value("user", "name", DEFAULT_IDENTITY[0]),
                reader.get_value("user", "email", DEFAULT_IDENTITY[1]))
    return data, (str(identity[0]), str(identity[1]))
