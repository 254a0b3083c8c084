"""An environment folder `envs/<name>/`: which env ids live in one, and its content hash.

The hash freezes a created environment during a search: run.json records it at setup, the daemon
hands it to the scoring process (AUTORL_ENV_SHA256), and evaluate.py recomputes it over the folder
it imports and refuses to score when it differs. evaluate.py keeps its own copy of `content_sha256`
(the harness imports nothing of the daemon's); tests check that both agree.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Optional

ENVS = "envs"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
ENV_ID_PATTERN = re.compile(r"^envs\.([a-z][a-z0-9_]*)\.[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_-]*$")
IGNORED_PARTS = ("__pycache__",)


def env_id_for(name: str) -> str:
    """The env id `run --env` takes for envs/<name>/."""
    return f"{ENVS}.{name}.env:Env"


def env_folder(env_id: Optional[str]) -> Optional[str]:
    """`envs/<name>` for an id such as `envs.<name>.env:Env`, else None."""
    match = ENV_ID_PATTERN.match(env_id or "")
    return f"{ENVS}/{match[1]}" if match else None


def content_sha256(folder: Path) -> str:
    """sha256 over the folder's files in sorted order of their relative paths: each contributes its
    path, a NUL, its size, a NUL and its bytes. __pycache__ is ignored (importing writes it)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    files = sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob("*")
                   if p.is_file() and not any(part in IGNORED_PARTS for part in p.relative_to(folder).parts))
    for relative, path in files:
        data = path.read_bytes()
        digest.update(f"{relative}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()
