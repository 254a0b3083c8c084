"""The daemon's own files, checked between experiments.

The sandbox keeps candidate code away from the run folder; where there is no sandbox (or it is
off) this is the second wall: the daemon remembers what it last wrote to run.json, results.tsv
and the harness copy, and after every experiment compares. A file found changed is reported,
restored from the daemon's copy, and the experiments that ran meanwhile are `invalid`. Nothing
the daemon trusts (the held-out seed, the harness hash) is ever read back from a file a
candidate could have reached during the session.
"""
from __future__ import annotations

from pathlib import Path

from .daemon import log
from .results import RunFolder


class Guard:
    def __init__(self, folder: RunFolder, harness_bytes: bytes):
        self.folder = folder
        self.expected: dict[Path, bytes] = {folder.harness: harness_bytes}
        self.note(folder.config)
        self.note(folder.results)

    def note(self, path: Path) -> None:
        """The daemon has just written `path`: this is what it must look like."""
        self.expected[path] = path.read_bytes() if path.exists() else b""

    def check(self) -> list[str]:
        """Names of the daemon's files found changed (each restored)."""
        changed = []
        for path, data in self.expected.items():
            try:
                current = path.read_bytes()
            except OSError:
                current = None
            if current != data:
                changed.append(path.name)
                log.error("%s was changed behind the daemon's back (by candidate code?); restoring the daemon's "
                          "copy", path)
                tmp = path.with_name(path.name + ".restore")
                tmp.write_bytes(data)
                tmp.replace(path)
        return changed
