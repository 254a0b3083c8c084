"""The Rust toolchain in use: rustc on PATH, or $AUTORL_RUSTC for the walled-in processes of the
daemon, and its version (what a built library and a Rust translation's verdict depend on)."""
from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from envs_fast.protocol import BackendError

NO_RUSTC = "rustc not found on PATH: Rust backends need the Rust toolchain (rustup.rs)"
# The compiler to use. The daemon sets it for the processes it walls in: their $HOME is empty, so
# rustup's proxy (~/.cargo/bin/rustc) is gone, but the toolchain's own binary still runs.
RUSTC_ENV = "AUTORL_RUSTC"


def rustc_path() -> str | None:
    """$AUTORL_RUSTC when it names a file, else the rustc on PATH, else None."""
    configured = os.environ.get(RUSTC_ENV)
    if configured and os.path.isfile(configured):
        return configured
    return shutil.which("rustc")


def rustc_available() -> bool:
    return rustc_path() is not None


def toolchain() -> tuple[Path, Path] | None:
    """(the toolchain's own rustc binary, its sysroot): what a walled-in process must be shown and
    told ($AUTORL_RUSTC) to build Rust backends. None without rustc."""
    rustc = rustc_path()
    if rustc is None:
        return None
    try:
        sysroot = Path(subprocess.run([rustc, "--print", "sysroot"], capture_output=True, text=True,
                                      check=True, timeout=60).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None
    binary = sysroot / "bin" / "rustc"
    return (binary if binary.is_file() else Path(rustc)), sysroot


def rustc_version() -> str:
    """`rustc --version` of the rustc in use, e.g. "rustc 1.95.0 (59807616e 2026-04-14)"."""
    rustc = rustc_path()
    if rustc is None:
        raise BackendError(NO_RUSTC)
    return _version_of(rustc)


@lru_cache(maxsize=None)
def _version_of(rustc: str) -> str:
    return subprocess.run([rustc, "--version"], capture_output=True, text=True, check=True).stdout.strip()
