"""`python -m orchestrator export`: the OpenEnv, OpenReward, verifiers and NeMo Gym variants of an env.

A framework whose package is not installed is skipped with the reason. nemo-gym needs Python >= 3.12,
so the NeMo Gym variant is tested twice: its HTTP contract in this interpreter (FastAPI's TestClient,
uvicorn in the contract-mode smoke), and against the real nemo-gym 0.4.0 served by ng_run from a
Python >= 3.12 venv in the user cache (`make install` builds it; the real tests build it when missing,
and skip with the reason where no such Python is found or pip cannot install nemo-gym).
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.export import FRAMEWORKS, inspect_env, main as export_main
from orchestrator.export.generate import module_name, variant_dir
from orchestrator.export.real_nemo_gym import NemoGymUnavailable, prepare
from orchestrator.export.smoke import NEMO_GYM_NOTE, framework_available

REPO = Path(__file__).resolve().parent.parent
CORRIDOR = Path(__file__).resolve().parent / "export_envs" / "corridor"
CONNECT_FOUR = REPO / "envs" / "connect_four"
TURNS = 4
REFUSED = re.compile(r"not legal|episode is over")  # action 99, in a game that may have ended


def needs(framework: str):
    available, reason = framework_available(framework)
    return pytest.mark.skipif(not available, reason=f"{framework}: {reason}")


PER_FRAMEWORK = [pytest.param(framework, marks=needs(framework), id=framework) for framework in FRAMEWORKS]
ENV_FOLDERS = [
    pytest.param(CORRIDOR, id="corridor"),
    pytest.param(CONNECT_FOUR, id="connect_four", marks=pytest.mark.skipif(
        not CONNECT_FOUR.is_dir(), reason="envs/connect_four/ is missing from this checkout")),
]


def copy_env(source: Path, tmp_path: Path) -> Path:
    """Export into a copy, so a test never writes into the repository's env folders."""
    target = tmp_path / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("export", "__pycache__"))
    return target


def load_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def domain_outcome(env_dir: Path, turns: int = TURNS) -> tuple[list[int], list[float]]:
    """The first-legal-action player's actions and rewards, computed by the domain module itself."""
    info = inspect_env(env_dir)
    domain = load_file(env_dir / info.domain_file, f"expected_{env_dir.name}_{id(env_dir)}")
    tasks_file = env_dir / "tasks.py"
    tasks = load_file(tasks_file, f"expected_tasks_{id(env_dir)}").TASKS if tasks_file.exists() else []
    state = domain.reset(0, tasks[0] if tasks else None)
    actions, rewards = [], []
    for _ in range(min(turns, domain.MAX_STEPS)):
        action = list(domain.legal_actions(state))[0]
        state, reward, terminated = domain.step(state, action)
        actions.append(action)
        rewards.append(float(reward))
        if terminated:
            break
    return actions, rewards


def run_export(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", "export", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=env)


# --- the smoke test: each variant's server on 127.0.0.1, its rollout.py against it ---

@pytest.mark.parametrize("framework", PER_FRAMEWORK)
def test_smoke_serves_the_variant_and_plays_it_offline(framework, tmp_path):
    """NeMo Gym in contract mode here; the real nemo-gym has tests of its own below."""
    env_dir = copy_env(CORRIDOR, tmp_path)
    done = run_export("--env", str(env_dir), "--to", framework, "--smoke", "--player", "scripted",
                      "--nemo-gym", "contract")
    assert done.returncode == 0, done.stdout + done.stderr
    _, rewards = domain_outcome(env_dir)
    line = [line for line in done.stdout.splitlines() if line.startswith(f"{framework}:")]
    assert line and line[0].startswith(f"{framework}: ok ({len(rewards)} turns, reward {sum(rewards):g}"), done.stdout
    if framework == "nemo_gym":
        assert f"{NEMO_GYM_NOTE} (--nemo-gym contract)" in line[0]


def leftover_processes(env_dir: Path) -> list:
    """Processes still running from env_dir (a server's cwd or command line), zombies aside."""
    import psutil

    leftovers = []
    for process in psutil.process_iter(["cmdline", "cwd", "status"]):
        where = " ".join(process.info["cmdline"] or []) + " " + (process.info["cwd"] or "")
        if str(env_dir) in where and process.info["status"] != psutil.STATUS_ZOMBIE:
            leftovers.append(process)
    return leftovers


@pytest.mark.parametrize("mode", ["contract", "real"])
def test_smoke_fails_loudly_on_a_tool_error_and_stops_the_server(mode, request, tmp_path):
    """A domain whose step raises: the NeMo Gym server answers 500 (nemo-gym's exception middleware,
    or the contract's FastAPI), rollout.py exits non-zero, the smoke line says FAIL with the reason,
    the command exits 1 and no server (nor ng_run's Ray cluster) is left running."""
    if mode == "real":
        request.getfixturevalue("real_nemo_gym")
    env_dir = copy_env(CORRIDOR, tmp_path)
    domain = env_dir / "corridor.py"
    domain.write_text(domain.read_text().replace(
        'state["position"] += 1 if action == 1 else -1',
        'if action == 0:\n        raise RuntimeError("boom")\n    state["position"] += 1'))
    done = run_export("--env", str(env_dir), "--to", "nemo_gym", "--smoke", "--player", "scripted", "--nemo-gym", mode)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nemo_gym: FAIL" in done.stdout and "tool act failed: HTTP 500" in done.stdout, done.stdout
    assert not leftover_processes(env_dir)


@pytest.mark.skipif(not framework_available("nemo_gym")[0], reason=f"nemo_gym: {framework_available('nemo_gym')[1]}")
def test_smoke_with_claude_plays_through_the_real_anthropic_client(tmp_path, monkeypatch):
    """--player anthropic against the fake Messages API on 127.0.0.1 (tests/fake_anthropic.py):
    Claude's tool calls reach the env and the tool results go back to Claude. The NeMo Gym rollout
    is the quickest; its player is the one the openenv, ors and verifiers rollouts use."""
    from tests.fake_anthropic import FakeAnthropic, result_text, text_turn, tool_results, tool_turn

    env_dir = copy_env(CORRIDOR, tmp_path)
    script = [tool_turn(("observe", {})), tool_turn(("act", {"action": 1})), text_turn("That will do.")]
    with FakeAnthropic(script) as claude:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "fake")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.url)
        done = run_export("--env", str(env_dir), "--to", "nemo_gym", "--smoke", "--player", "anthropic",
                          "--nemo-gym", "contract")
        requests = claude.message_requests
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nemo_gym: ok (1 turn, reward -0.1" in done.stdout, done.stdout
    assert {tool["name"] for tool in requests[0]["body"]["tools"]} == {"observe", "act"}
    assert "corridor of 5 cells" in json.dumps(requests[0]["body"]["messages"])  # the domain's DESCRIPTION
    acted = json.loads(result_text(tool_results(requests[2]["body"])[0]))
    assert acted["reward"] == pytest.approx(-0.1) and acted["board"] == "|. A . . G|"


# --- every variant goes through the same domain module ---

def drive_openenv(folder: Path, module, actions: list[int]) -> list[float]:
    from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

    env = getattr(module, f"{inspect_env(folder.parents[1]).class_prefix}Environment")()
    try:
        env.reset(seed=0, task_index=0)
        assert {tool.name for tool in env.step(ListToolsAction()).tools} == {"observe", "act"}
        rewards = []
        for action in actions:
            observation = env.step(CallToolAction(tool_name="act", arguments={"action": action}))
            assert observation.error is None, observation.error
            rewards.append(observation.reward)
        refused = env.step(CallToolAction(tool_name="act", arguments={"action": 99}))
        assert refused.error is not None and REFUSED.search(refused.error.message)
        return rewards
    finally:
        env.close()


def drive_ors(folder: Path, module, actions: list[int]) -> list[float]:
    cls = getattr(module, inspect_env(folder.parents[1]).class_prefix)
    assert {tool.name for tool in cls.list_tools().tools} == {"observe", "act"}
    env = cls(task_spec=cls.list_tasks("train")[0])

    async def play():
        outputs = [await env.act(module.ActParams(action=action)) for action in actions]
        with pytest.raises(module.IllegalAct):
            await env.act(module.ActParams(action=99))
        return outputs

    return [output.reward for output in asyncio.run(play())]


def drive_verifiers(folder: Path, module, actions: list[int]) -> list[float]:
    from verifiers.types import AssistantMessage, ClientConfig, ToolCall

    env = module.load_environment()
    assert {tool.name for tool in env.tool_defs} == {"observe", "act"}
    assert all("episode" not in json.dumps(tool.parameters) for tool in env.tool_defs)  # hidden

    async def play():
        offline = ClientConfig(api_key_var="AUTORL_UNUSED_KEY", api_base_url="http://127.0.0.1:9/v1")
        state = await env.init_state(module.rollout_input(0), offline, "scripted")
        state = await env.setup_state(state)
        for i, action in enumerate([*actions, 99]):
            call = ToolCall(id=f"call-{i}", name="act", arguments=json.dumps({"action": action}))
            await env.env_response([AssistantMessage(content="", tool_calls=[call])], state)
        return state

    state = asyncio.run(play())
    assert len(state["tool_errors"]) == 1 and REFUSED.search(state["tool_errors"][0])
    assert module.episode_return(state) == pytest.approx(sum(state["step_rewards"]))
    return state["step_rewards"]


def drive_nemo_gym(folder: Path, module, actions: list[int]) -> list[float]:
    from fastapi.testclient import TestClient

    with TestClient(module.contract_app()) as client:
        assert client.post("/seed_session", json={"seed": 0, "task_index": 0}).status_code == 200
        rewards = []
        for action in actions:
            answer = client.post("/act", json={"action": action})
            assert answer.status_code == 200, answer.text
            rewards.append(answer.json()["reward"])
        assert client.post("/act", json={"action": 99}).status_code == 400
        verified = client.post("/verify", json={"responses_create_params": {"input": []}, "response": {}})
        assert verified.json()["reward"] == pytest.approx(sum(rewards))
    return rewards


DRIVERS = {"openenv": drive_openenv, "ors": drive_ors, "verifiers": drive_verifiers, "nemo_gym": drive_nemo_gym}


def play_variant(env_dir: Path, framework: str, actions: list[int], tag: str) -> list[float]:
    folder = variant_dir(inspect_env(env_dir), framework)
    module = load_file(folder / f"{module_name(inspect_env(env_dir), framework)}.py", f"variant_{framework}_{tag}")
    return DRIVERS[framework](folder, module, actions)


@pytest.mark.parametrize("framework", PER_FRAMEWORK)
@pytest.mark.parametrize("env_source", ENV_FOLDERS)
def test_each_variant_plays_the_domain_module_through_its_tools(framework, env_source, tmp_path):
    env_dir = copy_env(env_source, tmp_path)
    assert export_main(["--env", str(env_dir), "--to", framework]) == 0
    actions, rewards = domain_outcome(env_dir)
    assert play_variant(env_dir, framework, actions, f"{env_source.name}_{tmp_path.name}") == pytest.approx(rewards)


@pytest.mark.parametrize("framework", PER_FRAMEWORK)
def test_a_rule_changed_in_the_domain_module_changes_the_variant(framework, tmp_path):
    """No rule is copied into a variant: the step cost edited in corridor.py is what its tools pay."""
    env_dir = copy_env(CORRIDOR, tmp_path)
    assert export_main(["--env", str(env_dir), "--to", framework]) == 0
    actions = [1, 0, 1]
    before = play_variant(env_dir, framework, actions, f"before_{tmp_path.name}")
    domain = env_dir / "corridor.py"
    domain.write_text(domain.read_text().replace("STEP_REWARD = -0.1", "STEP_REWARD = -0.25"))
    after = play_variant(env_dir, framework, actions, f"after_{tmp_path.name}")
    assert before == pytest.approx([-0.1] * 3) and after == pytest.approx([-0.25] * 3)


# --- NeMo Gym: the HTTP contract (not the real package, which needs Python >= 3.12) ---

@pytest.fixture
def nemo_gym_contract(tmp_path):
    available, reason = framework_available("nemo_gym")
    if not available:
        pytest.skip(f"nemo_gym contract: {reason}")
    env_dir = copy_env(CORRIDOR, tmp_path)
    assert export_main(["--env", str(env_dir), "--to", "nemo_gym"]) == 0
    folder = variant_dir(inspect_env(env_dir), "nemo_gym")
    module = load_file(folder / "corridor_nemo_gym.py", f"nemo_contract_{tmp_path.name}")
    return folder, module


def test_nemo_gym_contract_has_one_post_route_per_tool_not_the_real_package(nemo_gym_contract, tmp_path):
    """NeMo Gym's contract served by FastAPI, not by the real nemo-gym package (Python >= 3.12)."""
    folder, module = nemo_gym_contract
    rollout = load_file(folder / "rollout.py", f"nemo_rollout_{tmp_path.name}")
    openapi = module.contract_app().openapi()
    posts = {path for path, operations in openapi["paths"].items() if "post" in operations}
    assert posts == {"/seed_session", "/observe", "/act", "/verify"}
    tools = {tool["name"]: tool for tool in rollout.discover_tools(openapi)}
    assert set(tools) == {"observe", "act"}
    assert tools["act"]["input_schema"]["properties"]["action"]["type"] == "integer"
    assert "corridor of 5 cells" in tools["observe"]["description"]  # the domain's DESCRIPTION


def test_nemo_gym_contract_keeps_one_episode_per_cookie_session_not_the_real_package(nemo_gym_contract):
    """Cookie sessions as NeMo Gym's SessionMiddleware sets them; contract only, not nemo-gym itself."""
    from fastapi.testclient import TestClient

    _, module = nemo_gym_contract
    app = module.contract_app()
    with TestClient(app) as alice, TestClient(app) as bob:
        alice.post("/seed_session", json={"seed": 0, "task_index": 1})  # task 1 starts in cell 2
        bob.post("/seed_session", json={"seed": 0, "task_index": 0})
        assert "CorridorResourcesServer___corridor_resources_server" in alice.cookies
        assert alice.post("/observe").json()["board"] == "|. . A . G|"
        assert bob.post("/observe").json()["board"] == "|A . . . G|"
        assert alice.post("/act", json={"action": 1}).json()["reward"] == pytest.approx(-0.1)
        finish = alice.post("/act", json={"action": 1}).json()
        assert finish["reward"] == pytest.approx(1.0) and finish["terminated"] and finish["done"]
        after_end = alice.post("/act", json={"action": 1})
        assert after_end.status_code == 400 and "episode is over" in after_end.json()["detail"]
        bob.post("/act", json={"action": 1})
        body = {"responses_create_params": {"input": []}, "response": {"id": "r"}, "extra": 1}
        alice_verdict, bob_verdict = alice.post("/verify", json=body).json(), bob.post("/verify", json=body).json()
        assert alice_verdict["reward"] == pytest.approx(0.9) and bob_verdict["reward"] == pytest.approx(-0.1)
        assert alice_verdict["extra"] == 1  # verify echoes the request, as NeMo Gym's BaseVerifyResponse does


def test_nemo_gym_rollout_verify_body_is_a_responses_api_record_not_the_real_package(nemo_gym_contract, tmp_path):
    """The envelope validates as openai's Response (NeMoGymResponse's base); the output items carry
    the fields of NeMo Gym's function_call / function_call_output items. Not checked by nemo-gym."""
    openai_responses = pytest.importorskip("openai.types.responses")
    folder, _ = nemo_gym_contract
    rollout = load_file(folder / "rollout.py", f"nemo_rollout_body_{tmp_path.name}")
    items = [{"type": "function_call", "call_id": "c0", "name": "act", "arguments": "{\"action\": 1}",
              "status": "completed"}, {"type": "function_call_output", "call_id": "c0", "output": "{}"}]
    body = rollout.verify_body({"input": [], "tools": []}, items, "scripted")
    openai_responses.Response.model_validate({**body["response"], "output": []})
    assert body["response"]["output"] == items


# --- NeMo Gym: the real nemo-gym, in a Python >= 3.12 venv of its own, served by ng_run ---

@pytest.fixture(scope="session")
def real_nemo_gym():
    """The cached venv `export --smoke` runs the real nemo-gym in (built by `make install`; built
    here, once for all workers, when missing). Skips with the reason where it cannot exist."""
    try:
        return prepare()
    except NemoGymUnavailable as error:
        pytest.skip(f"real nemo-gym: {error}")


@pytest.mark.skipif(not CONNECT_FOUR.is_dir(), reason="envs/connect_four/ is missing from this checkout")
def test_smoke_runs_connect_four_on_the_real_nemo_gym(real_nemo_gym, tmp_path):
    """The default smoke (no option) takes the real path here: ng_run serves the exported
    resources server and rollout.py plays it and has it verified; nothing is left running."""
    env_dir = copy_env(CONNECT_FOUR, tmp_path)
    done = run_export("--env", str(env_dir), "--to", "nemo_gym", "--smoke", "--player", "scripted")
    assert done.returncode == 0, done.stdout + done.stderr
    _, rewards = domain_outcome(env_dir)
    real = (f"nemo_gym: ok (real nemo-gym {real_nemo_gym.nemo_gym_version}, served by ng_run on Python "
            f"{real_nemo_gym.interpreter.version}; {len(rewards)} turns, reward {sum(rewards):g}, "
            f"verify reward {sum(rewards):g})")
    assert real in done.stdout.splitlines(), done.stdout
    assert real_nemo_gym.nemo_gym_version == "0.4.0"  # the version the variant's pyproject pins
    assert not leftover_processes(env_dir)


REAL_SESSIONS = """
import importlib.util, json, sys
from unittest.mock import MagicMock
from fastapi.testclient import TestClient
from nemo_gym.server_utils import ServerClient

spec = importlib.util.spec_from_file_location("variant", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert module.HAVE_NEMO_GYM
config = module.CorridorResourcesServerConfig(host="127.0.0.1", port=8080, entrypoint="corridor_nemo_gym.py",
                                              name="corridor_resources_server")
server = module.CorridorResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
app = server.setup_webserver()
body = {"responses_create_params": {"input": []},
        "response": {"id": "r", "created_at": 0, "model": "scripted", "object": "response", "output": [],
                     "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}}
with TestClient(app) as alice, TestClient(app) as bob:
    alice.post("/seed_session", json={"seed": 0, "task_index": 1})
    bob.post("/seed_session", json={"seed": 0, "task_index": 0})
    out = {"cookies": sorted(alice.cookies.keys()), "alice_board": alice.post("/observe").json()["board"],
           "bob_board": bob.post("/observe").json()["board"],
           "alice_rewards": [alice.post("/act", json={"action": 1}).json()["reward"] for _ in range(2)]}
    refused = alice.post("/act", json={"action": 1})
    out["refused"] = [refused.status_code, refused.json()["detail"]]
    bob.post("/act", json={"action": 1})
    out["verify"] = [alice.post("/verify", json=body).json()["reward"], bob.post("/verify", json=body).json()["reward"]]
    out["posts"] = sorted(path for path, ops in app.openapi()["paths"].items() if "post" in ops)
print(json.dumps(out))
"""


def test_real_resources_server_keeps_one_episode_per_session(real_nemo_gym, tmp_path):
    """The variant's SimpleResourcesServer subclass in the real nemo-gym: its session middleware
    (the cookie the contract mimics) keeps each caller's episode, /verify scores that episode."""
    env_dir = copy_env(CORRIDOR, tmp_path)
    assert export_main(["--env", str(env_dir), "--to", "nemo_gym"]) == 0
    script = tmp_path / "real_sessions.py"
    script.write_text(REAL_SESSIONS)
    variant = variant_dir(inspect_env(env_dir), "nemo_gym") / "corridor_nemo_gym.py"
    done = subprocess.run([str(real_nemo_gym.python), str(script), str(variant)], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["cookies"] == ["CorridorResourcesServer___corridor_resources_server"]  # the contract's cookie
    assert out["alice_board"] == "|. . A . G|" and out["bob_board"] == "|A . . . G|"
    assert out["alice_rewards"] == pytest.approx([-0.1, 1.0])
    assert out["refused"][0] == 400 and "episode is over" in out["refused"][1]
    assert out["verify"] == pytest.approx([0.9, -0.1])
    assert out["posts"] == ["/act", "/aggregate_metrics", "/observe", "/seed_session", "/verify"]


# --- NeMo Gym: the fallback to contract mode, and its reasons ---

def test_smoke_falls_back_to_contract_mode_without_python_3_12(tmp_path):
    """No Python >= 3.12 on PATH nor under pyenv: contract mode, and the line says why."""
    env_dir = copy_env(CORRIDOR, tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "PYENV_ROOT": str(empty)}
    done = run_export("--env", str(env_dir), "--to", "nemo_gym", "--smoke", "--player", "scripted", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{NEMO_GYM_NOTE} (no Python >= 3.12 found on PATH or under pyenv" in done.stdout, done.stdout


def test_smoke_asked_for_the_real_nemo_gym_fails_without_it(tmp_path):
    """--nemo-python naming no usable interpreter (or --nemo-gym real without one) is a FAIL, not a fallback."""
    env_dir = copy_env(CORRIDOR, tmp_path)
    done = run_export("--env", str(env_dir), "--to", "nemo_gym", "--smoke", "--nemo-python", str(tmp_path / "nope"))
    assert done.returncode == 1
    assert f"nemo_gym: FAIL no real nemo-gym: {tmp_path / 'nope'} is not a Python >= 3.12" in done.stdout


def test_smoke_falls_back_to_contract_mode_when_pip_cannot_install_nemo_gym(tmp_path):
    """Offline (pip finds no package): contract mode with pip's reason, and no half-built venv kept."""
    from orchestrator.export.real_nemo_gym import find_interpreter

    try:
        find_interpreter()
    except NemoGymUnavailable as error:
        pytest.skip(f"real nemo-gym: {error}")
    env_dir = copy_env(CORRIDOR, tmp_path)
    cache = tmp_path / "nemo-cache"
    env = {**os.environ, "AUTORL_NEMO_GYM_CACHE": str(cache), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    done = run_export("--env", str(env_dir), "--to", "nemo_gym", "--smoke", "--player", "scripted", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{NEMO_GYM_NOTE} (pip install nemo-gym failed:" in done.stdout, done.stdout
    assert [path.suffix for path in cache.iterdir()] == [".lock"]


def test_the_venv_is_keyed_by_interpreter_and_requirements(tmp_path):
    from orchestrator.export.real_nemo_gym import Interpreter, candidate_paths, template_requirements, venv_path

    environ = {"AUTORL_NEMO_GYM_CACHE": str(tmp_path)}
    py312, py313 = Interpreter("/py/3.12/bin/python3", "3.12.1"), Interpreter("/py/3.13/bin/python3", "3.13.0")
    requirements = template_requirements()
    assert any(requirement.startswith("nemo-gym==0.4.0") for requirement in requirements)
    first = venv_path(py312, requirements, environ)
    assert first.parent == tmp_path and first.name.startswith("venv-py3.12.1-")
    assert venv_path(py312, list(reversed(requirements)), environ) == first
    assert venv_path(py313, requirements, environ) != first
    assert venv_path(py312, requirements + ["numpy"], environ) != first
    versions = tmp_path / "pyenv" / "versions"
    for name in ("3.11.7", "3.13.0", "3.12.1", "3.12.9", "3.13t-dev"):
        (versions / name / "bin").mkdir(parents=True)
        (versions / name / "bin" / "python3").touch()
    found = candidate_paths({"PATH": str(tmp_path / "empty"), "PYENV_ROOT": str(tmp_path / "pyenv")})
    assert found == [str(versions / name / "bin" / "python3") for name in ("3.12.9", "3.12.1", "3.13.0")]


# --- generation: deterministic, confined to export/, bad input refused ---

def tree(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_export_is_deterministic_and_writes_only_the_chosen_export_folders(tmp_path):
    env_dir = copy_env(CORRIDOR, tmp_path)
    assert export_main(["--env", str(env_dir), "--to", "all"]) == 0
    first = tree(env_dir)
    stray = env_dir / "export" / "openenv" / "stale.py"
    stray.write_text("left over")
    (env_dir / "export" / "ors" / "rollout.py").write_text("edited by hand")
    assert export_main(["--env", str(env_dir), "--to", "openenv"]) == 0
    second = tree(env_dir)
    assert not stray.exists()
    assert second["export/ors/rollout.py"] == b"edited by hand"  # a framework not asked for is left alone
    assert {k: v for k, v in second.items() if not k.startswith("export/ors/")} == \
           {k: v for k, v in first.items() if not k.startswith("export/ors/")}
    expected = {f"export/{fw}/{name}" for fw in FRAMEWORKS
                for name in (f"corridor_{fw}.py", "rollout.py", "pyproject.toml", "README.md")}
    assert expected | {"export/nemo_gym/configs/corridor_nemo_gym.yaml", "corridor.py", "tasks.py"} == set(first)


def test_bad_input_is_refused_with_exit_2(tmp_path, capsys):
    no_domain = tmp_path / "empty_env"
    no_domain.mkdir()
    (no_domain / "helpers.py").write_text("X = 1\n")
    assert export_main(["--env", str(no_domain)]) == 2
    assert "has no domain module" in capsys.readouterr().err
    assert export_main(["--env", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert export_main(["--env", str(copy_env(CORRIDOR, tmp_path)), "--to", "openenv,gym"]) == 2
    assert "unknown framework gym" in capsys.readouterr().err
    half = tmp_path / "half"
    half.mkdir()
    (half / "half.py").write_text("ACTIONS = ['a']\ndef legal_actions(state):\n    return [0]\n")
    assert export_main(["--env", str(half)]) == 2
    assert "misses NAME" in capsys.readouterr().err and not (half / "export").exists()


def test_unknown_framework_exits_2_from_the_command_line(tmp_path):
    done = run_export("--env", str(copy_env(CORRIDOR, tmp_path)), "--to", "gym")
    assert done.returncode == 2 and "unknown framework gym" in done.stderr


@pytest.mark.skipif(not (CONNECT_FOUR / "export").is_dir(), reason="envs/connect_four/export/ is missing from this checkout")
def test_the_shipped_connect_four_export_is_what_export_writes(tmp_path):
    env_dir = copy_env(CONNECT_FOUR, tmp_path)
    done = run_export("--env", str(env_dir), "--to", ",".join(FRAMEWORKS))
    assert done.returncode == 0, done.stdout + done.stderr
    shipped = sorted(p.relative_to(CONNECT_FOUR) for p in (CONNECT_FOUR / "export").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    written = sorted(p.relative_to(env_dir) for p in (env_dir / "export").rglob("*") if p.is_file())
    assert shipped == written
    for rel in shipped:
        assert (CONNECT_FOUR / rel).read_bytes() == (env_dir / rel).read_bytes(), rel


def test_the_nemo_gym_helper_reads_pyproject_without_tomllib():
    """Python 3.10 has no tomllib (the project allows 3.10): the module falls back to tomli, the same
    parser, and reads a variant's requirements the same way. tomllib is blocked in a fresh process."""
    code = ("import sys; sys.modules['tomllib'] = None\n"
            "from orchestrator.export import real_nemo_gym as m\n"
            "assert m.tomllib.__name__ == 'tomli', m.tomllib\n"
            "print(m.requirements_of('[project]\\ndependencies = [\"numpy\"]\\n"
            "[project.optional-dependencies]\\nnemo-gym = [\"fastapi\"]\\n'))")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from orchestrator.export.real_nemo_gym import EXTRA
    assert EXTRA == "nemo-gym" and proc.stdout.strip() == "['numpy', 'fastapi']"
