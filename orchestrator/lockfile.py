"""constraints.txt: the tested versions (`make install` and the Modal image install through it), and
how a set of installed versions differs from it."""
from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

LOCK_FILE = Path(__file__).resolve().parents[1] / "constraints.txt"
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^;\s]+)")


def canonical(name: str) -> str:
    """A distribution's name as the index compares them (PEP 503): `Box2D` is `box2d`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK_FILE) -> dict[str, str]:
    """{canonical name: version} of every `name==version` line (markers are kept out of the version)."""
    pins = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def installed_versions() -> dict[str, str]:
    """{canonical name: version} of this interpreter's distributions."""
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def differences(versions: dict[str, str], lock: dict[str, str] | None = None) -> list[str]:
    """`name X (locked Y)` for each locked package installed at another version. A local build label
    (`2.13.0+cpu`) is the same version, as pip's `==` takes it; a locked package not installed is not
    a difference (envpool off Linux, the CUDA plugins on a CPU machine)."""
    lock = read_lock() if lock is None else lock
    found = {canonical(name): version for name, version in versions.items()}
    return [f"{name} {found[name]} (locked {pinned})" for name, pinned in sorted(lock.items())
            if name in found and found[name].split("+")[0] != pinned]
