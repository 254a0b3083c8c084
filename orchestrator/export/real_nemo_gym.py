"""The real nemo-gym for `export --smoke`: a Python >= 3.12 interpreter, a venv with the NeMo Gym
variant's dependencies (nemo-gym among them), and `ng_run` serving the variant's resources server.

nemo-gym needs Python >= 3.12 and autorl runs on 3.11, so the variant runs in a venv of its own,
built once per interpreter and dependency list in the user cache and shared by every smoke (and
prepared by `make install`):

    $AUTORL_NEMO_GYM_CACHE, else $XDG_CACHE_HOME/autorl/nemo-gym, else ~/.cache/autorl/nemo-gym
        venv-py<version>-<key>/          the venv; ready once it holds autorl-ready.json
        venv-py<version>-<key>.lock      held by the one process building it (the others wait)

<key> hashes the interpreter and the requirements, so a changed variant pyproject or interpreter
gets a new venv.

    python -m orchestrator.export.real_nemo_gym [--python PATH]    # prepare that venv
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the project allows it): the same parser, as the tomli package
    import tomli as tomllib
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Callable, Optional

MIN_VERSION = (3, 12)
CACHE_ENV = "AUTORL_NEMO_GYM_CACHE"
READY_FILE = "autorl-ready.json"
PROBE_TIMEOUT_S = 30.0
INSTALL_TIMEOUT_S = 1800.0
EXTRA = "nemo-gym"  # the variant pyproject's optional dependencies that bring the real package
PYPROJECT_TEMPLATE = Path(__file__).resolve().parent / "templates" / "nemo_gym" / "pyproject.toml.tmpl"
# Variables of this process that would leak into (or break) the other interpreter.
FOREIGN_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")


class NemoGymUnavailable(RuntimeError):
    """No real nemo-gym here: no Python >= 3.12, or pip could not install the variant's requirements."""


@dataclass(frozen=True)
class Interpreter:
    path: str     # the interpreter's own sys.executable (a pyenv shim resolves to the real one)
    version: str  # e.g. 3.12.1


@dataclass(frozen=True)
class NemoGymVenv:
    path: Path
    interpreter: Interpreter
    nemo_gym_version: str

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    @property
    def python(self) -> Path:
        return self.bin("python")


def clean_environment(environ: Optional[dict] = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    for name in FOREIGN_VARIABLES:
        env.pop(name, None)
    return env


def probe(path: str) -> Optional[Interpreter]:
    """The interpreter at `path` when it runs and is Python >= 3.12 with venv, else None."""
    script = ("import sys, venv; print(sys.executable); "
              "print('.'.join(map(str, sys.version_info[:3])))")
    try:
        done = subprocess.run([path, "-c", script], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=clean_environment())
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        return None
    version = tuple(int(part) for part in lines[1].split("."))
    return Interpreter(lines[0], lines[1]) if version[:2] >= MIN_VERSION else None


def candidate_paths(environ: Optional[dict] = None) -> list[str]:
    """Pythons >= 3.12 to try, 3.12 first (the version nemo-gym is built and tested on): on PATH,
    then pyenv's versions ($PYENV_ROOT or ~/.pyenv)."""
    environ = os.environ if environ is None else environ
    minors = range(MIN_VERSION[1], MIN_VERSION[1] + 4)
    on_path = [shutil.which(f"python3.{minor}", path=environ.get("PATH")) for minor in minors]
    on_path.append(shutil.which("python3", path=environ.get("PATH")))
    pyenv_versions = Path(environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    releases = []
    if pyenv_versions.is_dir():
        for folder in pyenv_versions.iterdir():
            match = re.fullmatch(r"3\.(\d+)\.(\d+)", folder.name)  # releases only, not 3.13t or -dev
            if match and int(match[1]) >= MIN_VERSION[1] and (folder / "bin" / "python3").exists():
                releases.append(((int(match[1]) != MIN_VERSION[1], int(match[1]), -int(match[2])),
                                 str(folder / "bin" / "python3")))
    paths = [path for path in on_path if path] + [path for _, path in sorted(releases)]
    return list(dict.fromkeys(paths))


def find_interpreter(explicit: Optional[str] = None) -> Interpreter:
    if explicit:
        found = probe(explicit)
        if found is None:
            raise NemoGymUnavailable(f"{explicit} is not a Python >= 3.12 that runs")
        return found
    for path in candidate_paths():
        found = probe(path)
        if found is not None:
            return found
    raise NemoGymUnavailable("no Python >= 3.12 found on PATH or under pyenv (give one with --nemo-python PATH)")


def requirements_of(pyproject_text: str) -> list[str]:
    """The variant's dependencies plus its nemo-gym extra: what its venv holds."""
    project = tomllib.loads(pyproject_text)["project"]
    return list(project.get("dependencies", [])) + list(project.get("optional-dependencies", {}).get(EXTRA, []))


def template_requirements() -> list[str]:
    """The requirements every generated NeMo Gym variant declares (for `make install`)."""
    text = Template(PYPROJECT_TEMPLATE.read_text(encoding="utf-8")).safe_substitute(
        ENV_SLUG="env", ENV_NAME="env", MODULE="env_nemo_gym", DOMAIN_FILE="env.py", GENERATED_NOTE_YAML="")
    return requirements_of(text)


def cache_root(environ: Optional[dict] = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV]).expanduser()
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autorl" / "nemo-gym"


def venv_path(interpreter: Interpreter, requirements: list[str], environ: Optional[dict] = None) -> Path:
    key = hashlib.sha256(json.dumps([interpreter.path, interpreter.version, sorted(requirements)]).encode())
    return cache_root(environ) / f"venv-py{interpreter.version}-{key.hexdigest()[:12]}"


def _ready(path: Path, interpreter: Interpreter) -> Optional[NemoGymVenv]:
    try:
        record = json.loads((path / READY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (path / "bin" / "python").exists():
        return None
    return NemoGymVenv(path, interpreter, str(record.get("nemo_gym_version", "?")))


def _run(command: list, timeout: float, what: str) -> str:
    try:
        done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=clean_environment())
    except subprocess.TimeoutExpired:
        raise NemoGymUnavailable(f"{what} did not finish within {timeout:.0f}s") from None
    if done.returncode != 0:
        errors = [line.strip() for line in (done.stderr or done.stdout).splitlines()
                  if line.strip() and not line.lstrip().startswith("WARNING:")]
        raise NemoGymUnavailable(f"{what} failed: {errors[-1] if errors else f'exit code {done.returncode}'}")
    return done.stdout


def _hold_lock(lock_path: Path, timeout: float):
    """The build lock (fcntl, released when the process dies): another smoke building the same
    venv makes this one wait for it instead of building into the same folder."""
    handle = open(lock_path, "w")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                raise NemoGymUnavailable(f"another process held {lock_path} for {timeout:.0f}s") from None
            time.sleep(2)


def ensure_venv(interpreter: Interpreter, requirements: list[str],
                log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> NemoGymVenv:
    """The cached venv with `requirements` for `interpreter`, built (once) when missing."""
    target = venv_path(interpreter, requirements)
    ready = _ready(target, interpreter)
    if ready:
        return ready
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = _hold_lock(target.with_name(target.name + ".lock"), INSTALL_TIMEOUT_S + 60)
    except OSError as error:
        raise NemoGymUnavailable(f"cannot use the cache {target.parent}: {error}") from error
    with lock:
        ready = _ready(target, interpreter)  # built by the process we waited for
        if ready:
            return ready
        log(f"nemo_gym: installing {', '.join(requirements)} with Python {interpreter.version} "
            f"into {target} (once; a few minutes)")
        shutil.rmtree(target, ignore_errors=True)  # what a build that died half-way left
        try:
            _run([interpreter.path, "-m", "venv", target], 300, f"python{interpreter.version} -m venv")
            _run([target / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  *requirements], INSTALL_TIMEOUT_S, "pip install nemo-gym")
            version = _run([target / "bin" / "python", "-c",
                            "import importlib.metadata as m; print(m.version('nemo-gym'))"], 60,
                           "reading nemo-gym's version").strip()
        except NemoGymUnavailable:
            shutil.rmtree(target, ignore_errors=True)
            raise
        # Written last and renamed into place: a venv without it is unfinished, never used.
        with tempfile.NamedTemporaryFile("w", dir=target, delete=False, suffix=".tmp") as handle:
            json.dump({"nemo_gym_version": version, "python": interpreter.path,
                       "requirements": requirements}, handle)
        os.replace(handle.name, target / READY_FILE)
    return NemoGymVenv(target, interpreter, version)


def prepare(explicit_python: Optional[str] = None, requirements: Optional[list[str]] = None) -> NemoGymVenv:
    """find_interpreter + ensure_venv: raises NemoGymUnavailable with the reason."""
    return ensure_venv(find_interpreter(explicit_python), requirements or template_requirements())


# --- serving the variant the way NeMo Gym does: ng_run with the generated config ---

def _load_yaml(venv: NemoGymVenv, path: Path) -> dict:
    """Read YAML with the venv's PyYAML (a nemo-gym dependency; autorl itself does not need one)."""
    script = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"
    return json.loads(_run([venv.python, "-c", script, path], 60, f"reading {path.name}"))


def write_ng_run_config(venv: NemoGymVenv, variant: Path, config_file: Path, scratch: Path,
                        port: int, head_port: int) -> Path:
    """ng_run's working folder in `scratch`: resources_servers/<name> is the variant folder (linked,
    so its wrapper still finds the env's domain module) and its venv is the cached one
    (skip_venv_if_present: ng_run sources it instead of building one with uv). The config is the
    generated one's resources server, on 127.0.0.1:port; its simple_agent is left out, as it needs a
    policy model server (rollout.py plays the agent's part). Returns the config's path."""
    generated = _load_yaml(venv, config_file)
    servers = [(top, value["resources_servers"]) for top, value in generated.items()
               if isinstance(value, dict) and isinstance(value.get("resources_servers"), dict)]
    if len(servers) != 1 or len(servers[0][1]) != 1:
        raise ValueError(f"{config_file} should hold one resources server, not {len(servers)}")
    top, inner = servers[0]
    (name, block), = inner.items()
    (scratch / "resources_servers").mkdir(parents=True)
    (scratch / "resources_servers" / name).symlink_to(variant.resolve(), target_is_directory=True)
    venv_link = scratch / "venvs" / "resources_servers" / name / ".venv"
    venv_link.parent.mkdir(parents=True)
    venv_link.symlink_to(venv.path, target_is_directory=True)
    config = {top: {"resources_servers": {name: {**block, "host": "127.0.0.1", "port": port}}},
              "head_server": {"host": "127.0.0.1", "port": head_port},
              "skip_venv_if_present": True, "uv_venv_dir": str(scratch / "venvs")}
    path = scratch / "ng_run.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


def ng_run_command(venv: NemoGymVenv, config: Path) -> list[str]:
    return [str(venv.bin("ng_run")), f"+config_paths=[{config}]"]


def ng_run_environment(venv: NemoGymVenv) -> dict[str, str]:
    env = clean_environment()
    env.update(PATH=f"{venv.path / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv.path),
               PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0",
               # Ray's own switch for a loopback-only cluster (its default on macOS and Windows):
               # without it the GCS and raylet listen on the machine's address.
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return env


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.export.real_nemo_gym",
                                     description="Prepare the venv `export --smoke` serves NeMo Gym variants from.")
    parser.add_argument("--python", help="a Python >= 3.12 (default: found on PATH or under pyenv)")
    args = parser.parse_args(argv)
    try:
        venv = prepare(args.python)
    except NemoGymUnavailable as error:
        print(f"note: no real nemo-gym for `export --smoke` (its NeMo Gym variant falls back to contract "
              f"mode): {error}", file=sys.stderr)
        return 1
    print(f"nemo-gym {venv.nemo_gym_version} (Python {venv.interpreter.version}) ready in {venv.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
