"""Building a Rust translation: compiling a `.rs` source with the toolchain (toolchain.py) into a
shared library cached under `cache_dir()/rust/`, keyed by the source and the toolchain. Loading the
library is backend.py's."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from envs_fast.protocol import BackendError, BuildError, cache_dir, slug
from envs_fast.rust.toolchain import NO_RUSTC, RUSTC_ENV, rustc_available, rustc_path, rustc_version, toolchain  # noqa: F401

# target-cpu=native: the BipedalWalker port steps ~20% faster with this host's instructions (rustc
# never contracts a*b+c into an FMA, so the results keep their bits). A library so built runs only
# on a CPU with the same features, hence the host's feature set is part of its cache key
# (host_target). codegen-units=1 and panic=abort: ~1% fewer instructions; a panic cannot cross the
# C ABI anyway.
RUSTC_FLAGS = ("-C", "opt-level=3", "-C", "codegen-units=1", "-C", "panic=abort", "-C", "target-cpu=native",
               "--edition", "2021", "--crate-type", "cdylib", "-C", "strip=debuginfo")
BUILD_TIMEOUT = 600  # seconds
ERROR_LINES = 60  # of rustc's stderr in a BuildError


def library_path(path: str | Path) -> Path:
    """Where `build` puts the library of the source `path`: `cache_dir()/rust/<source hash>-<toolchain
    hash>/lib<slug>.so`. The toolchain hash covers `rustc --version`, the flags and the target they
    compile for on this host (host_target: the CPU and its features, as target-cpu=native sees them)."""
    path = Path(path)
    source = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    toolchain_hash = hashlib.sha256("\n".join((rustc_version(), " ".join(RUSTC_FLAGS), host_target())).encode()).hexdigest()[:8]
    return cache_dir() / "rust" / f"{source}-{toolchain_hash}" / f"lib{slug(path.stem)}.so"


def host_target() -> str:
    """`rustc --print cfg` under RUSTC_FLAGS' codegen flags: the target and every CPU feature that
    target-cpu=native enables on this host. A cached library is reused only where this is the same."""
    return _host_target(rustc_path() or "rustc", _codegen_flags())


def _codegen_flags() -> tuple[str, ...]:
    """RUSTC_FLAGS' `-C` options (the crate type and output do not change the cfg)."""
    pairs = zip(RUSTC_FLAGS, RUSTC_FLAGS[1:])
    return tuple(part for flag, value in pairs if flag == "-C" for part in (flag, value))


@lru_cache(maxsize=None)
def _host_target(rustc: str, flags: tuple[str, ...]) -> str:
    try:
        result = subprocess.run([rustc, *flags, "--print", "cfg"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        raise BackendError(f"{rustc} --print cfg failed: {error}") from None
    if result.returncode != 0:
        raise BackendError(f"{rustc} --print cfg failed: {result.stderr.strip()[:400]}")
    return result.stdout.strip()


def build(path: str | Path) -> Path:
    """The compiled library of the Rust source `path`, from the cache when it was built before.
    BackendError without rustc or source; BuildError (rustc's message) when it does not compile."""
    path = Path(path)
    if not path.is_file():
        raise BackendError(f"Rust source {str(path)!r} does not exist")
    source = path.read_bytes()
    target = library_path(path)
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        writable = os.access(target.parent, os.W_OK)
    except OSError:
        writable = False
    if not writable:  # a training process reads the run's cache but may not write it: build privately
        target = Path(tempfile.gettempdir()) / "autorl-rust" / target.parent.name / target.name
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
    # Compile a copy of exactly the hashed bytes in a private directory, then move the library in
    # atomically: concurrent builders never see (or load) half a library.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        copy = Path(scratch) / path.name
        copy.write_bytes(source)
        output = Path(scratch) / target.name
        command = [rustc_path() or "rustc", *RUSTC_FLAGS, "--crate-name", f"autorl_{slug(path.stem)}",
                   "-o", str(output), str(copy)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{path}: rustc did not finish within {BUILD_TIMEOUT} s") from None
        if result.returncode != 0 or not output.is_file():
            message = compiler_message(result.stderr.replace(str(copy), str(path)))
            raise BuildError(f"{path} does not compile (rustc {' '.join(RUSTC_FLAGS)}):\n{message}")
        os.replace(output, target)
    return target


def compiler_message(stderr: str, max_lines: int = ERROR_LINES) -> str:
    """rustc's diagnostics with the errors first (warnings printed before them could push them out
    of view), cut to `max_lines` lines."""
    blocks: list[list[str]] = []
    for line in stderr.rstrip().splitlines():
        if not blocks or line.startswith(("error", "warning")):
            blocks.append([])
        blocks[-1].append(line)
    ordered = [b for b in blocks if b[0].startswith("error")] + [b for b in blocks if not b[0].startswith("error")]
    lines = [line for block in ordered for line in block]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)
