"""Verdicts and throughput figures cached on disk, so `backend="auto"` never re-verifies.

A record's name is the hash of what decides it besides envs_fast's own code: the backend's content
hash (the translation file, or the third-party package's version; a Rust translation's with rustc's
version), the env id, the interpreter and the versions of the packages that decide its behaviour (jax
and jaxlib with their CUDA plugins, torch, the physics engines). A throughput record's name adds the
machine (CPU model and count; on a GPU machine its GPUs instead, `bench_machine`): a figure measured
on another machine is no figure here.

envs_fast's code is checked as a build tool checks a depfile: a record lists the modules of envs_fast
(all but translations) that the process which wrote it had imported, with their hashes (`sources`),
and holds while each of them is unchanged (`holds`). So a verdict on the Rust BipedalWalker port
survives an edit to the MJX engine, which its verification never imports, and not an edit to the
verifier or the Rust loader. Change any input and the old record no longer applies.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from envs_fast.protocol import (CACHE_ENV_VAR, TRANSLATIONS_DIR, cache_dir, file_hash, is_file_spec,  # noqa: F401
                                is_rust_spec, sync_companion)

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
            "gymnasium", "numpy", "scipy", "torch", "envpool", "gymnax", "box2d-py", "box2d", "mujoco", "mujoco-mjx")


def decisive_sources(package_dir: Path | None = None) -> list[Path]:
    """The modules of envs_fast whose source is part of every record's key: all but the translations
    (envs_fast/translations/: a record of one holds its own file's hash). Every other module, at any
    depth, decides verdicts or figures."""
    package_dir = package_dir or PACKAGE_DIR
    return sorted(p for p in package_dir.rglob("*.py") if p.relative_to(package_dir).parts[0] != TRANSLATIONS_DIR)


@contextlib.contextmanager
def reading_from(folder: Path):
    """This process reads and writes its records in `folder` while inside (CACHE_ENV_VAR, as it
    was before when it leaves): the daemon reads a run's verdicts as the run's processes do."""
    outer = os.environ.get(CACHE_ENV_VAR)
    os.environ[CACHE_ENV_VAR] = str(folder)
    try:
        yield
    finally:
        if outer is None:
            os.environ.pop(CACHE_ENV_VAR, None)
        else:
            os.environ[CACHE_ENV_VAR] = outer


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def source_hashes(package_dir: Path | None = None) -> dict[str, str]:
    """{path in envs_fast: sha256} of every decisive module, this process's or those of a copy of
    envs_fast (`package_dir`: a snapshot's, a run's worktree's): what a record's `sources` are checked
    against."""
    package_dir = package_dir or PACKAGE_DIR
    return {path.relative_to(package_dir).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in decisive_sources(package_dir)}


def loaded_sources() -> dict[str, str]:
    """The decisive modules of envs_fast this process has imported, with their hashes: what a record it
    writes depends on (the verifier's levels, the backend's loader and what they import, and nothing
    of the backends it never loaded)."""
    loaded = {Path(module.__file__).resolve() for module in list(sys.modules.values())
              if getattr(module, "__file__", None)}
    return {name: digest for name, digest in source_hashes().items() if (PACKAGE_DIR / name).resolve() in loaded}


def changed_sources(record: dict, environment: dict | None = None) -> list[str]:
    """The modules `record` was made with that differ in `environment`'s envs_fast (None: this
    process's); every one of them when the record names none (written before records listed them)."""
    sources = record.get("sources")
    current = _field(environment, "envs_fast", source_hashes)
    if not isinstance(sources, dict) or not sources or not isinstance(current, dict):
        return ["(all: the record does not list its sources)"]
    return sorted(name for name, digest in sources.items() if current.get(name) != digest)


def holds(record: dict | None, environment: dict | None = None) -> bool:
    """Whether a record read under its name still applies: every envs_fast module it depends on unchanged."""
    return bool(record) and not changed_sources(record, environment)


def interpreter() -> str:
    return f"{platform.python_implementation()} {sys.version}"


@functools.lru_cache(maxsize=None)
def machine() -> dict:
    """What a throughput figure was measured on: the CPU model and count, and the GPUs."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = ""
    if shutil.which("nvidia-smi"):
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            gpus = "nvidia-smi failed"
    return {"cpu": model, "cpus": os.cpu_count(), "arch": platform.machine(), "gpus": gpus}


def rustc() -> str:
    from envs_fast.rust.toolchain import rustc_available, rustc_version

    return rustc_version() if rustc_available() else "no rustc"


def environment(package_dir: Path | None = None) -> dict:
    """What this process's records are keyed by besides the backend and the env: the interpreter,
    the packages, the machine, the Rust compiler, and envs_fast's decisive modules that records are
    checked against (`package_dir`'s:
    the envs_fast a checkout's processes import, which need not be this process's). The daemon
    names the records of a Modal run by its containers' (`record_name(..., environment=)`), which
    they report; a local run's by the envs_fast its processes run (the run's commit, not the
    daemon's)."""
    return {"python": interpreter(), "versions": package_versions(), "machine": machine(), "rustc": rustc(),
            "envs_fast": source_hashes(package_dir)}


def _field(environment: dict | None, name: str, current):
    """`environment`'s value of `name`, or this process's (`current()`) where it does not say."""
    return environment[name] if environment and name in environment else current()


def backend_identity(spec: str, env_id: str, environment: dict | None = None) -> str:
    """Content hash for a file spec; the package version for envpool/gymnax/reference."""
    if is_file_spec(spec):  # the translation and its state-sync companion (a JAX port may import it) decide together
        companion = sync_companion(spec)
        identity = "file:" + file_hash(spec) + (":" + file_hash(companion) if companion.is_file() else "")
        if is_rust_spec(spec):  # and the compiler
            identity += ":" + _field(environment, "rustc", rustc)
        return identity
    package = {"reference": "gymnasium", "mujoco_batch": "mujoco", "mjx": "mujoco-mjx"}.get(spec, spec)  # their .py: in every key
    versions = _field(environment, "versions", package_versions)
    return f"{spec}:{versions.get(package, 'missing')}"


def runs_jax(spec: str) -> bool:
    """Whether a backend's steps are JAX code (a JAX translation, gymnax), whose floating point
    depends on the device XLA compiles for. The others (Rust, envpool, gymnasium) step on the CPU
    whatever accelerator the machine has, so their verdicts hold on any of them."""
    return spec in ("gymnax", "mjx") or (is_file_spec(spec) and not is_rust_spec(spec))


def bench_machine(here: dict) -> dict:
    """What of a machine keys its throughput figures: all of it on a CPU machine; on a GPU machine its
    GPUs and architecture. A cloud's containers of one GPU type land on hosts of several CPU models
    (and report the host's CPU count, not their share): keyed by those, a training container on
    another host found no figure and chose another backend than the one the run named."""
    if not here.get("gpus"):
        return here
    return {"gpus": here["gpus"], "arch": here.get("arch")}


def key_inputs(spec: str, env_id: str, kind: str = "verdict", environment: dict | None = None) -> dict:
    """Everything a record of `kind` ("verdict" or "bench") depends on, in `environment` (None: this
    process's, field by field). A throughput figure depends on the whole machine; a JAX backend's
    verdict on its accelerator (a verdict reached on a CPU says nothing of the same code compiled for
    a GPU)."""
    inputs = {"backend": backend_identity(spec, env_id, environment), "env_id": env_id,
              "versions": _field(environment, "versions", package_versions),
              "python": _field(environment, "python", interpreter)}
    here = _field(environment, "machine", machine)
    if kind == "bench":
        inputs["machine"] = bench_machine(here)
    elif runs_jax(spec):
        inputs["accelerator"] = here.get("gpus", "")
    return inputs


def record_key(spec: str, env_id: str, kind: str = "verdict", environment: dict | None = None) -> str:
    payload = json.dumps(key_inputs(spec, env_id, kind, environment), sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def record_name(kind: str, spec: str, env_id: str, environment: dict | None = None) -> str:
    """The file name of a record ("verdict" or "bench") in any cache directory, as a process in
    `environment` (None: this one) names it."""
    return f"{kind}-{record_key(spec, env_id, kind, environment)}.json"


def _path(kind: str, spec: str, env_id: str, environment: dict | None = None) -> Path:
    return cache_dir() / record_name(kind, spec, env_id, environment)


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump(record, handle, indent=1, default=str)
    os.replace(handle.name, path)  # atomic: a reader never sees half a record


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def store_verdict(spec: str, env_id: str, levels: list[int], passed: bool, summary: str) -> None:
    _write(_path("verdict", spec, env_id), {"spec": spec, "env_id": env_id, "levels": sorted(levels),
                                           "passed": passed, "summary": summary, "time": time.time(),
                                           "sources": loaded_sources()})


def cached_verdict(spec: str, env_id: str, environment: dict | None = None) -> dict | None:
    """The verdict of `spec` as a process in `environment` (None: this one) would find it."""
    record = _read(_path("verdict", spec, env_id, environment))
    return record if holds(record, environment) else None


def store_throughput(spec: str, env_id: str, num_envs: int, adapter_sps: float) -> None:
    path = _path("bench", spec, env_id)
    record = _read(path)
    if not holds(record):  # measured with other code: its figures go with it
        record = {"spec": spec, "env_id": env_id, "adapter_sps": {}, "machine": machine(), "sources": {}}
    record["adapter_sps"][str(num_envs)] = adapter_sps
    record["sources"] = {**record["sources"], **loaded_sources()}
    _write(path, record)


def cached_throughput(spec: str, env_id: str, num_envs: int, environment: dict | None = None) -> float | None:
    """Adapter SPS measured at the num_envs closest to the requested one, if any was measured."""
    record = _read(_path("bench", spec, env_id, environment))
    if not holds(record, environment) or not record.get("adapter_sps"):
        return None
    nearest = min(record["adapter_sps"], key=lambda n: abs(int(n) - num_envs))
    return float(record["adapter_sps"][nearest])
