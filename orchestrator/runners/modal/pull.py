"""`pull`: bring a run made on Modal home: results/<tag>/ and branch autorl/<tag> (with the
discarded experiments' refs) from the volume `autorl-results` into this checkout.

    python -m orchestrator pull --tag TAG

Files that did not change since the last pull (same size and mtime) are not read again.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from .support import (BUNDLE_NAME, TOKEN_HINT, VOLUME_NAME, check_modal_reachable,
                            fetch_branch_bundle)


class PullError(Exception):
    """Why nothing (or not everything) came home: one line for the user."""


def pull(tag: str, root: Path, volume=None, timeout_s: float = 30.0) -> Path:
    """Copy the volume's `<tag>/` into `<root>/results/<tag>/` and fetch its branch bundle into
    the checkout `root`; returns the results folder.

    `volume` is anything with modal.Volume's `listdir(path, recursive=True)` and
    `read_file(path)` (default: the `autorl-results` volume, after a credentials and network
    check that raises PullError naming `modal token new`)."""
    root = Path(root)
    if not tag or "/" in tag or tag.startswith("."):
        raise PullError(f"not a run tag: {tag!r}")
    if volume is None:
        problem = check_modal_reachable(timeout_s)
        if problem:
            raise PullError(problem)
        import modal

        volume = modal.Volume.from_name(VOLUME_NAME)
    entries = _listdir(volume, tag)
    files = [e for e in entries if _is_file(e)]
    if not files:
        raise PullError(f"no run {tag!r} in the Modal volume {VOLUME_NAME}")
    results = root / "results" / tag
    results.mkdir(parents=True, exist_ok=True)
    bundle = None
    with tempfile.TemporaryDirectory(prefix="autorl-pull-") as tmp:
        for entry in files:
            rel = _relative(entry.path, tag)
            if PurePosixPath(rel).name.startswith(".") and rel.endswith((".tmp", ".part")):
                continue  # a copy in progress on the other side
            if rel == BUNDLE_NAME:
                bundle = Path(tmp) / BUNDLE_NAME
                _download(volume, entry, bundle, tag)
                continue
            dest = results / rel
            if dest.is_file() and dest.stat().st_size == entry.size and int(dest.stat().st_mtime) == entry.mtime:
                continue
            _download(volume, entry, dest, tag)
        if bundle is not None:
            import git

            try:
                fetch_branch_bundle(root, bundle, tag)
            except (git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
                detail = (getattr(exc, "stderr", "") or str(exc)).strip().splitlines()
                raise PullError(f"results/{tag}/ pulled, but branch autorl/{tag} was not: "
                                f"{detail[-1] if detail else exc}") from None
    return results


# ---------------------------------------------------------------- helpers
def _is_file(entry) -> bool:
    kind = getattr(entry.type, "name", entry.type)
    return kind in ("FILE", 1)


def _relative(path: str, tag: str) -> str:
    """The entry's path inside `<tag>/`, refusing anything that would land outside it."""
    parts = PurePosixPath(path.lstrip("/")).parts
    if len(parts) < 2 or parts[0] != tag or any(p in ("..", ".", "") for p in parts[1:]):
        raise PullError(f"unexpected path {path!r} in the Modal volume {VOLUME_NAME}")
    return "/".join(parts[1:])


def _download(volume, entry, dest: Path, tag: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        with open(tmp, "wb") as out, _modal_errors(tag):
            for chunk in volume.read_file(entry.path):
                out.write(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if entry.mtime:
        os.utime(tmp, (entry.mtime, entry.mtime))
    os.replace(tmp, dest)


def _listdir(volume, tag: str) -> list:
    with _modal_errors(tag):
        return list(volume.listdir(tag, recursive=True))


@contextmanager
def _modal_errors(tag: str):
    """Modal's failures as one-line PullErrors (by class name: no modal import for a fake volume)."""
    try:
        yield
    except FileNotFoundError:
        raise PullError(f"no run {tag!r} in the Modal volume {VOLUME_NAME}") from None
    except Exception as exc:
        name = type(exc).__name__
        if name == "NotFoundError":
            raise PullError(f"no run {tag!r} in the Modal volume {VOLUME_NAME}") from None
        if name == "AuthError":
            raise PullError(f"Modal refused the credentials: {TOKEN_HINT}") from None
        if isinstance(exc, (ConnectionError, TimeoutError)) or "Connection" in name or "Timeout" in name:
            raise PullError(f"cannot reach Modal ({name}); check the network, or {TOKEN_HINT}") from None
        raise
