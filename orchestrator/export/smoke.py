"""`export --smoke`: serve each exported variant on 127.0.0.1, run its rollout.py against it, stop it."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .domain import EnvInfo
from .generate import module_name, variant_dir

SERVER_START_TIMEOUT_S = 120.0
NG_RUN_START_TIMEOUT_S = 300.0  # ng_run starts a Ray cluster first, then the resources server
NG_RUN_READY_LINE = "servers ready!"  # ng_run 0.4: "All 1 / 1 servers ready! Polling every 60s"
ROLLOUT_TIMEOUT_S = 300.0
NEMO_GYM_NOTE = "contract mode: HTTP contract served by FastAPI/uvicorn, not run against the real nemo-gym package"


@dataclass
class SmokeResult:
    framework: str
    ok: bool
    line: str


def _missing(modules: tuple[str, ...]) -> list[str]:
    return [name for name in modules if importlib.util.find_spec(name) is None]


def verifiers_classic_available() -> tuple[bool, str]:
    """The export uses verifiers' classic ToolEnv/Rubric, which verifiers 0.4 removed."""
    if _missing(("verifiers", "datasets")):
        return False, "verifiers (< 0.4) or datasets is not installed"
    version = importlib.metadata.version("verifiers")
    major_minor = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if major_minor >= (0, 4):
        return False, f"verifiers {version} has no classic ToolEnv/Rubric (the export needs verifiers < 0.4)"
    return True, ""


def framework_available(framework: str) -> tuple[bool, str]:
    """(can this machine run the variant, why not / a note)."""
    if framework == "openenv":
        missing = _missing(("openenv", "fastmcp", "uvicorn"))
    elif framework == "ors":
        missing = _missing(("openreward",))
    elif framework == "verifiers":
        return verifiers_classic_available()
    elif framework == "nemo_gym":
        # contract mode's packages; the real nemo-gym runs in a venv of its own (real_nemo_gym.py)
        missing = _missing(("fastapi", "uvicorn", "itsdangerous", "httpx"))
    else:
        raise ValueError(framework)
    if missing:
        return False, f"not installed: {', '.join(missing)} (pip install -e \".[export]\")"
    return True, ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_served(port: int, server: subprocess.Popen, timeout: float, log: Path,
                       ready_line: str | None = None) -> str | None:
    """None once the port accepts connections (and the server's log shows `ready_line`), else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"the server exited with code {server.returncode} before listening"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                if ready_line is None or ready_line in log.read_text(errors="replace"):
                    return None
        except OSError:
            pass
        time.sleep(0.2)
    return (f"the server did not listen on 127.0.0.1:{port} within {timeout:.0f}s" if ready_line is None else
            f"the server did not report {ready_line!r} within {timeout:.0f}s")


STOP_GRACE_S = 30.0


def _session_members(session_id: int) -> list[int]:
    """The processes of the session the server leads: it and everything it started, including
    children that moved to process groups of their own (Ray's workers do)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == session_id:
                    members.append(int(entry))
            except OSError:  # gone meanwhile
                pass
    return members


def _stop(server: subprocess.Popen, stop_signal: int = signal.SIGTERM) -> None:
    """Ask the server to stop (its process group), wait, then kill whatever is left of its session."""
    if server.poll() is None:
        try:
            os.killpg(server.pid, stop_signal)
            server.wait(timeout=STOP_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    for pid in _session_members(server.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if server.poll() is None:
        server.wait(timeout=10)


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def _parse_result(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", OPENREWARD_DISABLE_UPDATE_CHECK="1")
    return env


@dataclass
class Served:
    """How to start one variant's server and run its rollout.py against it."""
    command: list[str]
    cwd: Path
    env: dict[str, str]
    port: int
    rollout_python: str
    start_timeout: float = SERVER_START_TIMEOUT_S
    stop_signal: int = signal.SIGTERM  # ng_run shuts its servers and its Ray cluster down on SIGINT
    ready_line: str | None = None  # what the server prints once it is ready to serve (ng_run does)
    rollout_env: dict[str, str] | None = None  # default: this process's environment (_env())


def _serve_and_roll(framework: str, folder: Path, served: Served, url: str, turns: int, player: str,
                    verbose: bool, scratch: Path) -> SmokeResult | dict:
    """The rollout's RESULT record, or the FAIL result."""
    server_log = scratch / "server.log"
    with open(server_log, "w") as log:
        server = subprocess.Popen(served.command, cwd=served.cwd, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=served.env, start_new_session=True)
    try:
        problem = _wait_until_served(served.port, server, served.start_timeout, server_log, served.ready_line)
        if problem:
            return SmokeResult(framework, False, f"{framework}: FAIL {problem}\n{_tail(server_log.read_text())}")
        try:
            rollout = subprocess.run(
                [served.rollout_python, "rollout.py", "--url", url, "--turns", str(turns), "--player", player],
                cwd=folder, capture_output=True, text=True, timeout=ROLLOUT_TIMEOUT_S,
                stdin=subprocess.DEVNULL, env=served.rollout_env or _env())
        except subprocess.TimeoutExpired:
            return SmokeResult(framework, False,
                               f"{framework}: FAIL rollout.py did not finish within {ROLLOUT_TIMEOUT_S:.0f}s")
    finally:
        _stop(server, served.stop_signal)
    if verbose:
        print(rollout.stdout, end="", flush=True)
    result = _parse_result(rollout.stdout)
    if rollout.returncode != 0 or result is None:
        errors = [line for line in rollout.stderr.splitlines() if line.strip()]
        reason = errors[-1] if errors else f"rollout.py exited with code {rollout.returncode}"
        detail = _tail(rollout.stdout + rollout.stderr) + "\n  server log:\n" + _tail(server_log.read_text())
        return SmokeResult(framework, False, f"{framework}: FAIL {reason}\n{detail}")
    return result


def _own_server(info: EnvInfo, framework: str, port: int) -> Served:
    """The variant's own entry point with this interpreter (contract mode for NeMo Gym)."""
    return Served([sys.executable, f"{module_name(info, framework)}.py", "--host", "127.0.0.1", "--port", str(port)],
                  variant_dir(info, framework), _env(), port, sys.executable)


def _outcome(result: dict) -> str:
    turns = f"{result['turns']} turn{'' if result['turns'] == 1 else 's'}"
    text = f"{turns}, reward {result['reward']:g}"
    if "rubric_reward" in result:
        text += f", rubric reward {result['rubric_reward']:g}"
    if "verify_reward" in result:
        text += f", verify reward {result['verify_reward']:g}"
    return text


def smoke_variant(info: EnvInfo, framework: str, turns: int = 4, player: str = "auto",
                  verbose: bool = False, nemo_gym: str = "auto", nemo_python: str | None = None) -> SmokeResult:
    """Serve one variant on 127.0.0.1, run its rollout.py against it, stop it. NeMo Gym: `nemo_gym`
    is auto (the real nemo-gym when a Python >= 3.12 can install it, else contract mode), real
    (FAIL without it) or contract; `nemo_python` names the interpreter (and asks for the real one)."""
    if framework == "nemo_gym":
        return smoke_nemo_gym(info, turns, player, verbose, nemo_gym, nemo_python)
    available, note = framework_available(framework)
    if not available:
        return SmokeResult(framework, False, f"{framework}: FAIL {note}")
    port = free_port()
    url = f"{'tcp' if framework == 'verifiers' else 'http'}://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix=f"autorl-smoke-{framework}-") as scratch:
        result = _serve_and_roll(framework, variant_dir(info, framework), _own_server(info, framework, port),
                                 url, turns, player, verbose, Path(scratch))
    if isinstance(result, SmokeResult):
        return result
    return SmokeResult(framework, True, f"{framework}: ok ({_outcome(result)}{f'; {note}' if note else ''})")


def smoke_nemo_gym(info: EnvInfo, turns: int, player: str, verbose: bool, mode: str = "auto",
                   nemo_python: str | None = None) -> SmokeResult:
    from .real_nemo_gym import (NemoGymUnavailable, clean_environment, ensure_venv, find_interpreter,
                                ng_run_command, ng_run_environment, requirements_of, write_ng_run_config)

    framework, folder = "nemo_gym", variant_dir(info, "nemo_gym")
    venv, why_not_real = None, "--nemo-gym contract"
    if mode != "contract":
        try:
            requirements = requirements_of((folder / "pyproject.toml").read_text(encoding="utf-8"))
            venv = ensure_venv(find_interpreter(nemo_python), requirements)
        except NemoGymUnavailable as error:
            if mode == "real" or nemo_python:
                return SmokeResult(framework, False, f"{framework}: FAIL no real nemo-gym: {error}")
            why_not_real = str(error)
    if venv is None:
        available, missing = framework_available(framework)
        if not available:
            return SmokeResult(framework, False, f"{framework}: FAIL {missing}")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="autorl-smoke-nemo_gym-") as scratch:
        if venv is None:
            served = _own_server(info, framework, port)
        else:
            config_file = folder / "configs" / f"{module_name(info, framework)}.yaml"
            try:
                config = write_ng_run_config(venv, folder, config_file, Path(scratch) / "gym", port, free_port())
            except (OSError, ValueError, NemoGymUnavailable) as error:
                return SmokeResult(framework, False, f"{framework}: FAIL {config_file.name}: {error}")
            # rollout.py runs in the variant's venv too (this process's PYTHONPATH is for 3.11)
            rollout_env = {**clean_environment(_env()), "VIRTUAL_ENV": str(venv.path)}
            served = Served(ng_run_command(venv, config), config.parent, ng_run_environment(venv), port,
                            str(venv.python), NG_RUN_START_TIMEOUT_S, signal.SIGINT, NG_RUN_READY_LINE, rollout_env)
        result = _serve_and_roll(framework, folder, served, f"http://127.0.0.1:{port}", turns, player, verbose,
                                 Path(scratch))
    if isinstance(result, SmokeResult):
        return result
    if venv is not None:
        how = f"real nemo-gym {venv.nemo_gym_version}, served by ng_run on Python {venv.interpreter.version}"
        return SmokeResult(framework, True, f"{framework}: ok ({how}; {_outcome(result)})")
    return SmokeResult(framework, True, f"{framework}: ok ({_outcome(result)}; {NEMO_GYM_NOTE} ({why_not_real}))")
