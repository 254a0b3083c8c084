"""The user-level cache: verdicts and benchmark records that a user's runs share, so the second run
on an env does not verify and benchmark again what the first one did.

Records keep the names `envs_fast.cache.record_name` gives them in a run's cache (the backend's
content or package version, the versions of the packages that decide its behaviour, the env id and
the verifier's source), so a record applies exactly where it would in the run that made it. Only the
daemon reads and writes this folder: it lends a record to a run's cache before verifying, and keeps a
record once it has merged it from a verifier's scratch cache. Candidate code never sees it (it is
outside every sandbox's walls, and the variable naming it is not passed on). Without a sandbox a
train.py could still write there, so the daemon signs what it keeps (HMAC-SHA256, with a key in
`<cache>.key`, mode 0600, beside the folder and outside the walls too) and lends only what carries
its signature: a record or library written by anything else is not used, and verified again.

Layout of `user_cache_dir()` ($AUTORL_USER_CACHE, else $XDG_CACHE_HOME/autorl/verify, else
~/.cache/autorl/verify):
    verdict-<key>.json                    a passing verdict (failures are never kept: verified again)
    bench/<context>/bench-<key>.json      a throughput record, and bench-<key>.figures.json the benchmark's
                                          figures; <context> names the machine and the train.py constants
                                          the figure depends on (bench reads NUM_ENVS, JAX_NUM_ENVS, ...)
    rust/<source>-<toolchain>/            a Rust translation's built library, as in a run's cache
    <file>.sig                            the daemon's signature of <file> (of each library's .so)
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Optional

USER_CACHE_ENV = "AUTORL_USER_CACHE"
SIGNATURE = ".sig"
log = logging.getLogger("autorl")
# What bench reads from candidate/train.py's hyperparameter block (envs_fast.bench.train_num_envs, e2e_shape).
TRAIN_CONSTANTS = ("NUM_ENVS", "JAX_NUM_ENVS", "JAX_NUM_STEPS", "HIDDEN_SIZE")


def user_cache_dir(environ: Optional[dict] = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(USER_CACHE_ENV):
        return Path(environ[USER_CACHE_ENV]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autorl" / "verify"


def bench_context(root: Path) -> str:
    """What a throughput figure depends on besides the backend: this machine, and the train.py
    constants bench reads from the checkout at `root` (as text; nothing is imported)."""
    from envs_fast.bench import train_constant

    constants = {name: train_constant(name, root) for name in TRAIN_CONSTANTS}
    machine = [platform.node(), os.cpu_count(), platform.machine(), platform.processor()]
    return hashlib.sha256(json.dumps([machine, constants], sort_keys=True).encode()).hexdigest()[:16]


def figures_name(record_name: str) -> str:
    """`bench-<key>.json` -> `bench-<key>.figures.json`: the benchmark's own JSON beside its record."""
    return record_name[:-len(".json")] + ".figures.json"


class UserCache:
    """The user-level cache seen from one run: `lend` copies a record into the run's cache, `keep`
    copies one from it. Both are atomic, so concurrent runs never read half a file; what `keep` and
    `write` put there is signed, and `lend`, `read` and `lend_library` take only what is."""

    def __init__(self, root: Path, run_cache: Path):
        self.root = Path(root)
        self.run_cache = Path(run_cache)
        self._key: Optional[bytes] = None

    # ------------------------------------------------------------ signatures
    @property
    def key_path(self) -> Path:
        return self.root.with_name(self.root.name + ".key")

    def key(self) -> bytes:
        """The signing key, made on first use (0600, created exclusively: two daemons agree on one)."""
        if self._key is None:
            path = self.key_path
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as handle:
                        handle.write(secrets.token_hex(32))
                except FileExistsError:
                    pass
            self._key = path.read_text().strip().encode()
        return self._key

    def _signature(self, path: Path, data: Optional[bytes] = None) -> str:
        relative = path.relative_to(self.root).as_posix().encode()
        data = path.read_bytes() if data is None else data
        return hmac.new(self.key(), relative + b"\0" + data, hashlib.sha256).hexdigest()

    def _put(self, path: Path, data: bytes) -> None:
        """Write `path` signed: the signature first, so a reader never takes an unsigned file for a
        forged one (it finds the old file with the new signature at worst, and verifies again)."""
        _write_atomically(path.with_name(path.name + SIGNATURE), self._signature(path, data).encode())
        _write_atomically(path, data)

    def _signed(self, path: Path, warn: bool = True) -> bool:
        """Whether `path` is as a daemon kept it (anything else wrote it: not lent, verified again)."""
        if not path.is_file():
            return False
        try:
            signature = path.with_name(path.name + SIGNATURE).read_text().strip()
            if hmac.compare_digest(signature, self._signature(path)):
                return True
        except (OSError, ValueError):
            pass
        if warn:
            log.warning("user cache: %s has no valid signature of the daemon's (written by candidate code?): "
                        "not used, verified again", path)
        return False

    # ------------------------------------------------------------ records
    def lend(self, name: str, where: str = "") -> bool:
        """Copy `where/name` of the user cache into the run's cache; False when there is none (or
        none the daemon signed)."""
        source = self.root / where / name
        try:
            if not self._signed(source):
                return False
        except OSError:  # an unreadable key: nothing in the user cache can be trusted
            return False
        _copy_atomically(source, self.run_cache / name)
        return True

    def keep(self, name: str, where: str = "") -> bool:
        """Copy `name` of the run's cache into `where/` of the user cache, signed; False when there is none."""
        source = self.run_cache / name
        if not source.is_file():
            return False
        try:
            self._put(self.root / where / name, source.read_bytes())
        except OSError:  # a read-only or full home: the run goes on, the next one verifies again
            return False
        return True

    def read(self, name: str, where: str = "") -> dict:
        try:
            if not self._signed(self.root / where / name):
                return {}
            data = json.loads((self.root / where / name).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write(self, name: str, data: dict, where: str = "") -> None:
        path = self.root / where / name
        try:
            self._put(path, json.dumps(data, indent=1, default=str).encode())
        except OSError:
            pass

    def lend_library(self, folder: str) -> bool:
        """A Rust library folder `rust/<folder>/` into the run's cache (training loads it from there)."""
        libraries = list((self.root / "rust" / folder).glob("*.so"))
        try:
            if not libraries or not all(self._signed(lib) for lib in libraries):
                return False
        except OSError:
            return False
        return _copy_library(self.root / "rust" / folder, self.run_cache / "rust" / folder)

    def keep_library(self, folder: str) -> bool:
        source, dest = self.run_cache / "rust" / folder, self.root / "rust" / folder
        built = list(source.glob("*.so"))
        if not built:
            return False
        try:
            present = list(dest.glob("*.so"))
            if present and all(self._signed(library, warn=False) for library in present):
                return True
            shutil.rmtree(dest, ignore_errors=True)  # unsigned (or from before signatures): replaced
            if not _copy_library(source, dest):
                return False
            for library in dest.glob("*.so"):  # (a reader in between finds it unsigned: builds it again)
                _write_atomically(library.with_name(library.name + SIGNATURE), self._signature(library).encode())
            return True
        except OSError:
            return False


def _write_atomically(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, suffix=".tmp") as handle:
        handle.write(data)
    os.replace(handle.name, dest)


def _copy_atomically(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, suffix=".tmp") as handle:
        tmp = Path(handle.name)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _copy_library(source: Path, dest: Path) -> bool:
    """Copy a built library folder unless the destination already has its library; the copy is
    renamed into place, so a reader sees all of it or none."""
    if not any(source.glob("*.so")):
        return False
    if any(dest.glob("*.so")):
        return True
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".copy-"))
    try:
        shutil.copytree(source, scratch / "lib", ignore=shutil.ignore_patterns(".build-*", "*" + SIGNATURE))
        try:
            os.replace(scratch / "lib", dest)
        except OSError:  # another run put it there first
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return True
