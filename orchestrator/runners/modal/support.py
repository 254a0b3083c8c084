"""What the daemon shares with the Modal side (runners/modal/, modal_app.py): the results
volume's layout, a run's branch as a git bundle, and the credential checks made before anything
is created on Modal.

The volume `autorl-results` holds one folder per run tag:

    <tag>/results.tsv, <tag>/exp-NNNN/...   a copy of results/<tag>/ (made after every experiment)
    <tag>/branch.bundle                     branch autorl/<tag> and refs/autorl/<tag>/* (discards)
    <tag>/night.log                         the daemon's output in its night container

Nothing here imports modal at module level: the daemon imports this module with or without Modal.
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Iterable, Mapping, Optional

VOLUME_NAME = "autorl-results"
BUNDLE_NAME = "branch.bundle"
NIGHT_LOG_NAME = "night.log"
# Run-folder files that only mean something to the live daemon beside them (results.RunFolder).
NOT_SYNCED = ("daemon.lock", "STOP")
TOKEN_HINT = "run `modal token new` (or set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET)"


# How the Modal containers are sized, read from the environment where a night is started: the night's
# own container must see the same, or its daemon calls and bills with the defaults
CONTAINER_SETTINGS = ("AUTORL_MODAL_GPU", "AUTORL_MODAL_CPU", "AUTORL_MODAL_EVAL_CPU", "AUTORL_MODAL_TIMEOUT")


def container_settings(environ=None) -> dict:
    """The CONTAINER_SETTINGS set in `environ` (default: this process's environment)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in CONTAINER_SETTINGS if environ.get(name)}


def eval_cpu() -> float:
    """CPU cores of a scoring container (AUTORL_MODAL_EVAL_CPU, default 8): what it is declared with,
    billed at and scores with (one evaluation worker per core)."""
    return float(os.environ.get("AUTORL_MODAL_EVAL_CPU", 8))
NO_CREDENTIALS = f"no Modal credentials found: {TOKEN_HINT}"


# ---------------------------------------------------------------- credentials
def _read_toml(path: Path) -> dict:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10: modal depends on `toml`
        import toml

        return toml.loads(path.read_text())
    return tomllib.loads(path.read_text())


def modal_credentials_problem(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """None when a Modal token is configured, else one line naming `modal token new`. No network.

    Follows modal.config: MODAL_TOKEN_ID/MODAL_TOKEN_SECRET (or MODAL_OAUTH_*) in the environment,
    else the profile MODAL_PROFILE (else the active one, else "default") of MODAL_CONFIG_PATH
    (else ~/.modal.toml). Inside a Modal container the container's own identity is used."""
    env = os.environ if environ is None else environ
    if env.get("MODAL_IS_REMOTE") == "1":
        return None
    home = env.get("HOME") or os.path.expanduser("~")
    path = Path(env.get("MODAL_CONFIG_PATH") or Path(home) / ".modal.toml")
    profiles: dict = {}
    if path.is_file():
        try:
            profiles = _read_toml(path)
        except (OSError, ValueError) as exc:
            return f"cannot read the Modal configuration {path} ({exc}): {TOKEN_HINT}"
    profiles = {name: values for name, values in profiles.items() if isinstance(values, dict)}
    active = [name for name, values in profiles.items() if values.get("active") is True]
    profile = env.get("MODAL_PROFILE") or (active[0] if active else "default")
    section = profiles.get(profile, {})

    def setting(key: str) -> str:
        return env.get(f"MODAL_{key.upper()}") or str(section.get(key) or "")

    if setting("token_id") and setting("token_secret"):
        return None
    if setting("oauth_refresh_token") and setting("oauth_client_id"):
        return None
    if env.get("MODAL_PROFILE") and profile not in profiles:
        return f"Modal profile {profile!r} is not in {path}: run `modal token new --profile {profile}`"
    return NO_CREDENTIALS


def check_modal_reachable(timeout_s: float = 10.0) -> Optional[str]:
    """None when Modal answers an authenticated request within `timeout_s`, else one line.

    The request is a lookup of the results volume (a missing volume still proves the credentials
    and the network work); it runs in a thread so a dead network cannot hang the caller."""
    problem = modal_credentials_problem()
    if problem:
        return problem
    outcome: list[Optional[str]] = []

    def probe() -> None:
        try:
            import modal
            import modal.exception

            modal.Volume.from_name(VOLUME_NAME).hydrate()
            outcome.append(None)
        except modal.exception.NotFoundError:
            outcome.append(None)
        except modal.exception.AuthError as exc:
            outcome.append(f"Modal refused the credentials ({_first_line(exc)}): {TOKEN_HINT}")
        except BaseException as exc:  # noqa: BLE001 - any failure is reported as one line
            outcome.append(f"cannot reach Modal ({type(exc).__name__}: {_first_line(exc)}); "
                           f"check the network, or {TOKEN_HINT}")

    thread = threading.Thread(target=probe, name="modal-reachable", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return f"Modal did not answer within {timeout_s:g}s; check the network, or {TOKEN_HINT}"
    return outcome[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------- the run's branch as a bundle
def branch_ref(tag: str) -> str:
    return f"refs/heads/autorl/{tag}"


def _has_ref(repo, ref: str) -> bool:
    import git

    try:
        repo.git.rev_parse("--verify", "--quiet", ref)
        return True
    except git.GitCommandError:
        return False


def write_branch_bundle(checkout: Path, tag: str, dest: Path) -> bool:
    """Bundle branch autorl/<tag> and the discarded experiments' refs/autorl/<tag>/* into `dest`
    (replaced atomically). False when the branch does not exist (yet)."""
    import git

    repo = git.Repo(checkout)
    if not _has_ref(repo, branch_ref(tag)):
        return False
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    repo.git.bundle("create", str(tmp), branch_ref(tag), f"--glob=refs/autorl/{tag}/*")
    os.replace(tmp, dest)
    return True


def fetch_branch_bundle(checkout: Path, bundle: Path, tag: str) -> None:
    """Fetch branch autorl/<tag> and refs/autorl/<tag>/* from `bundle` into `checkout`, forcing
    the update (the bundle is the newer record of the run). Raises git.GitCommandError."""
    import git

    repo = git.Repo(checkout)
    heads = repo.git.bundle("list-heads", str(bundle)).split()
    specs = [f"+{branch_ref(tag)}:{branch_ref(tag)}"] if branch_ref(tag) in heads else []
    if any(h.startswith(f"refs/autorl/{tag}/") for h in heads):
        specs.append(f"+refs/autorl/{tag}/*:refs/autorl/{tag}/*")
    if specs:
        repo.git.fetch("--quiet", str(bundle), *specs)


# ---------------------------------------------------------------- copying a run folder
def copy_changed(source: Path, target: Path, skip: Iterable[str] = ()) -> list[str]:
    """Copy the regular files under `source` that are new or changed (size or mtime) to `target`;
    returns their relative paths. Names in `skip` are left out at any depth."""
    skip = set(skip)
    copied = []
    for path in sorted(Path(source).rglob("*")):
        rel = path.relative_to(source)
        if any(part in skip for part in rel.parts) or path.is_symlink() or not path.is_file():
            continue
        dest = Path(target) / rel
        try:
            stat = path.stat()
            if dest.is_file():
                have = dest.stat()
                if have.st_size == stat.st_size and abs(have.st_mtime - stat.st_mtime) < 1e-3:
                    continue  # copy2 keeps the mtime: unchanged since the last copy
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp")
            shutil.copy2(path, tmp)
            os.replace(tmp, dest)
        except FileNotFoundError:  # removed while we copied (a live run folder)
            continue
        copied.append(rel.as_posix())
    return copied
