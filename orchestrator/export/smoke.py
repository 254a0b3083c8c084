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
ROLLOUT_TIMEOUT_S = 300.0
NEMO_GYM_NOTE = "HTTP contract served by FastAPI/uvicorn, not run against the real nemo-gym package"


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
        missing = _missing(("fastapi", "uvicorn", "itsdangerous", "httpx"))
        if not missing:
            reason = ("nemo-gym is installed but the smoke serves the contract app; ng_run runs the real one"
                      if importlib.util.find_spec("nemo_gym") else
                      f"nemo-gym needs Python >= 3.12, this is {sys.version_info.major}.{sys.version_info.minor}"
                      if sys.version_info < (3, 12) else "nemo-gym is not installed")
            return True, f"{NEMO_GYM_NOTE} ({reason})"
    else:
        raise ValueError(framework)
    if missing:
        return False, f"not installed: {', '.join(missing)} (pip install -e \".[export]\")"
    return True, ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_port(port: int, server: subprocess.Popen, timeout: float) -> str | None:
    """None once the port accepts connections, else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"the server exited with code {server.returncode} before listening"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return None
        except OSError:
            time.sleep(0.2)
    return f"the server did not listen on 127.0.0.1:{port} within {timeout:.0f}s"


def _stop(server: subprocess.Popen) -> None:
    """Stop the server and everything it started (its own process group)."""
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
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


def smoke_variant(info: EnvInfo, framework: str, turns: int = 4, player: str = "auto",
                  verbose: bool = False) -> SmokeResult:
    available, note = framework_available(framework)
    if not available:
        return SmokeResult(framework, False, f"{framework}: FAIL {note}")
    folder = variant_dir(info, framework)
    port = free_port()
    url = f"{'tcp' if framework == 'verifiers' else 'http'}://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix=f"autorl-smoke-{framework}-") as scratch:
        server_log = Path(scratch) / "server.log"
        with open(server_log, "w") as log:
            server = subprocess.Popen(
                [sys.executable, f"{module_name(info, framework)}.py", "--host", "127.0.0.1", "--port", str(port)],
                cwd=folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=_env(), start_new_session=True)
        try:
            problem = _wait_for_port(port, server, SERVER_START_TIMEOUT_S)
            if problem:
                return SmokeResult(framework, False, f"{framework}: FAIL {problem}\n{_tail(server_log.read_text())}")
            try:
                rollout = subprocess.run(
                    [sys.executable, "rollout.py", "--url", url, "--turns", str(turns), "--player", player],
                    cwd=folder, capture_output=True, text=True, timeout=ROLLOUT_TIMEOUT_S,
                    stdin=subprocess.DEVNULL, env=_env())
            except subprocess.TimeoutExpired:
                return SmokeResult(framework, False,
                                   f"{framework}: FAIL rollout.py did not finish within {ROLLOUT_TIMEOUT_S:.0f}s")
        finally:
            _stop(server)
        if verbose:
            print(rollout.stdout, end="", flush=True)
        result = _parse_result(rollout.stdout)
        if rollout.returncode != 0 or result is None:
            errors = [line for line in rollout.stderr.splitlines() if line.strip()]
            reason = errors[-1] if errors else f"rollout.py exited with code {rollout.returncode}"
            detail = _tail(rollout.stdout + rollout.stderr) + "\n  server log:\n" + _tail(server_log.read_text())
            return SmokeResult(framework, False, f"{framework}: FAIL {reason}\n{detail}")
    extra = ""
    if "rubric_reward" in result:
        extra += f", rubric reward {result['rubric_reward']:g}"
    if "verify_reward" in result:
        extra += f", verify reward {result['verify_reward']:g}"
    if note:
        extra += f"; {note}"
    turns = f"{result['turns']} turn{'' if result['turns'] == 1 else 's'}"
    line = f"{framework}: ok ({turns}, reward {result['reward']:g}{extra})"
    return SmokeResult(framework, True, line)
