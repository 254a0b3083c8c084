"""Verdicts and throughput figures cached on disk, so `backend="auto"` never re-verifies.

A record's key is the backend's content hash (the translation file, or the third-party package's
version), the versions of the packages that decide its behaviour, the env id and the verifier's own
source: change any of them and the old verdict no longer applies.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path

from envs_fast.protocol import file_hash, is_file_spec, is_rust_spec, sync_companion

PACKAGE_DIR = Path(__file__).resolve().parent
CACHE_ENV_VAR = "AUTORL_VERIFY_CACHE"
PACKAGES = ("jax", "jaxlib", "gymnasium", "numpy", "scipy", "envpool", "gymnax", "box2d-py", "box2d", "mujoco")
VERIFIER_SOURCES = ("verify/*.py", "probes.py", "stats.py", "vector.py", "protocol.py", "backend.py", "gymnax_backend.py",
                    "jax_batched.py", "adapter.py", "rust_build.py", "rust_backend.py",
                    "rust_vector.py")  # glob patterns under envs_fast/


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured) if configured else _main_checkout(PACKAGE_DIR.parent) / ".envs_fast_cache"


def _main_checkout(root: Path) -> Path:
    """The main checkout when `root` is a git worktree (runs/<tag>/), so a run's train process finds
    the verdicts the daemon stored; records are keyed by content, so sharing them is safe."""
    marker = root / ".git"
    if marker.is_file():
        text = marker.read_text().strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text.split(":", 1)[1].strip())
            gitdir = gitdir if gitdir.is_absolute() else (root / gitdir).resolve()
            if gitdir.parent.name == "worktrees":
                return gitdir.parent.parent.parent
    return root


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _verifier_hash() -> str:
    digest = hashlib.sha256()
    for pattern in VERIFIER_SOURCES:
        for path in sorted(PACKAGE_DIR.glob(pattern)):
            digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def backend_identity(spec: str, env_id: str) -> str:
    """Content hash for a file spec; the package version for envpool/gymnax/reference."""
    if is_rust_spec(spec):  # the translation and its state-sync companion decide the verdict together
        companion = sync_companion(spec)
        return "file:" + file_hash(spec) + (":" + file_hash(companion) if companion.is_file() else "")
    if is_file_spec(spec):
        return "file:" + file_hash(spec)
    package = {"reference": "gymnasium"}.get(spec, spec)
    return f"{spec}:{package_versions().get(package, 'missing')}"


def record_key(spec: str, env_id: str) -> str:
    payload = json.dumps(
        {"backend": backend_identity(spec, env_id), "env_id": env_id, "versions": package_versions(),
         "verifier": _verifier_hash()},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def record_name(kind: str, spec: str, env_id: str) -> str:
    """The file name of a record ("verdict" or "bench") in any cache directory."""
    return f"{kind}-{record_key(spec, env_id)}.json"


def _path(kind: str, spec: str, env_id: str) -> Path:
    return cache_dir() / record_name(kind, spec, env_id)


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
                                           "passed": passed, "summary": summary, "time": time.time()})


def cached_verdict(spec: str, env_id: str) -> dict | None:
    return _read(_path("verdict", spec, env_id))


def store_throughput(spec: str, env_id: str, num_envs: int, adapter_sps: float) -> None:
    path = _path("bench", spec, env_id)
    record = _read(path) or {"spec": spec, "env_id": env_id, "adapter_sps": {}}
    record["adapter_sps"][str(num_envs)] = adapter_sps
    _write(path, record)


def cached_throughput(spec: str, env_id: str, num_envs: int) -> float | None:
    """Adapter SPS measured at the num_envs closest to the requested one, if any was measured."""
    record = _read(_path("bench", spec, env_id))
    if not record or not record.get("adapter_sps"):
        return None
    nearest = min(record["adapter_sps"], key=lambda n: abs(int(n) - num_envs))
    return float(record["adapter_sps"][nearest])
