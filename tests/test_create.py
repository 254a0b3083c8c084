"""`python -m orchestrator create`: a new environment from a description, its checks and repair rounds,
then training on it with the environment frozen (real git repositories, the replay agent, real
subprocesses and the sandbox)."""
from __future__ import annotations

import hashlib
import json
import shutil
import textwrap
from pathlib import Path

import git
import pytest

from orchestrator.envfolder import content_sha256
from tests.conftest import AUTORL_ROOT, FAST, read_results, run_daemon, write_replay

CONNECT_FOUR = AUTORL_ROOT / "tests" / "replays" / "create_connect_four" / "001"
CONNECT_FOUR_ID = "envs.connect_four.env:Env"
DESCRIBE = "connect four against a random opponent"

CORRIDOR = textwrap.dedent('''\
    """A corridor of LENGTH cells: walk right to the goal in the last cell."""
    import random

    NAME = "corridor"
    DESCRIPTION = "Walk right along a corridor of 8 cells to the goal in the last one; each step costs 0.01."
    LENGTH = 8
    ACTIONS = ["step left", "step right"]
    OBSERVATION_SIZE = LENGTH
    OBSERVATION_LOW, OBSERVATION_HIGH = 0.0, 1.0
    REWARD_RANGE = (-0.01, 1.0)
    MAX_STEPS = 20


    def reset(seed, task=None):
        rng = random.Random(seed)
        return {"position": task["start"] if task else rng.randrange(LENGTH - 1), "rng": rng}


    def legal_actions(state):
        return [0, 1]


    def step(state, action):
        state["position"] = max(0, min(LENGTH - 1, state["position"] + (1 if action == 1 else -1)))
        if state["position"] == LENGTH - 1:
            return state, 1.0, True
        return state, -0.01, False


    def observation(state):
        return [1.0 if i == state["position"] else 0.0 for i in range(LENGTH)]


    def render(state):
        return "".join("A" if i == state["position"] else "G" if i == LENGTH - 1 else "." for i in range(LENGTH))
''')


def env_py(name: str) -> str:
    """create.md's Env template for the domain `name`."""
    return textwrap.dedent(f'''\
        import gymnasium as gym
        import numpy as np

        from . import {name} as domain


        class Env(gym.Env):
            metadata = {{"render_modes": ["ansi"], "render_fps": 1}}

            def __init__(self, render_mode=None):
                self.render_mode = render_mode
                self.action_space = gym.spaces.Discrete(len(domain.ACTIONS))
                self.observation_space = gym.spaces.Box(domain.OBSERVATION_LOW, domain.OBSERVATION_HIGH,
                                                        (domain.OBSERVATION_SIZE,), np.float32)
                self.state = None
                self.steps = 0

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                domain_seed = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
                self.state = domain.reset(domain_seed, (options or {{}}).get("task"))
                self.steps = 0
                return np.asarray(domain.observation(self.state), np.float32), {{}}

            def step(self, action):
                self.state, reward, terminated = domain.step(self.state, int(action))
                self.steps += 1
                truncated = not terminated and self.steps >= domain.MAX_STEPS
                return (np.asarray(domain.observation(self.state), np.float32), float(reward), bool(terminated),
                        truncated, {{}})

            def render(self):
                return domain.render(self.state) if self.render_mode == "ansi" else None
    ''')


def connect_four_files(bug: bool = False) -> dict[str, str]:
    files = {f"envs/connect_four/{p.name}": p.read_text() for p in (CONNECT_FOUR / "envs" / "connect_four").iterdir()}
    if bug:  # a seeded bug: own discs are 2.0, outside the declared Box(-1, 1)
        domain = files["envs/connect_four/connect_four.py"]
        buggy = domain.replace('return [float(cell) for cell in state["board"]]', 'return [2.0 * cell for cell in state["board"]]')
        assert buggy != domain
        files["envs/connect_four/connect_four.py"] = buggy
    return files


def replay_rounds(root: Path, rounds: list[dict[str, str]]) -> Path:
    """Replay folders of one create: 001/ for the first round, 001.rK/ for repair round K."""
    for k, files in enumerate(rounds):
        folder = root / ("001" if k == 0 else f"001.r{k}")
        for rel, text in {**files, "DESCRIPTION": f"round {k}"}.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
    return root


def create(repo: Path, name: str, replay: Path, *extra: str, timeout: float = 300):
    return run_daemon(repo, "create", "--name", name, "--describe", DESCRIBE, "--agent", "replay",
                      "--replay-dir", str(replay), *extra, timeout=timeout)


def create_connect_four(repo: Path, tmp_path: Path):
    proc = create(repo, "connect_four", replay_rounds(tmp_path / "replay-create", [connect_four_files()]))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# A train.py that trains nothing and always drops its disc in column 4.
COLUMN_FOUR_TRAIN_PY = textwrap.dedent('''\
    import os
    from pathlib import Path

    import torch


    class Column(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.full((obs.shape[0],), 3, dtype=torch.long)


    out = Path(os.environ["AUTORL_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(Column()), str(out / "policy.pt"))
    print("---")
    print("env_steps: 0")
''')


@pytest.mark.long
def test_a_buggy_create_is_repaired_committed_and_trained(autorl_repo, tmp_path):
    repo = autorl_repo()  # the shipped train.py: it must train on the created env through make_vec_env
    main = git.Repo(repo)
    base = main.head.commit.hexsha
    replay = replay_rounds(tmp_path / "replay-create", [connect_four_files(bug=True), connect_four_files()])
    proc = create(repo, "connect_four", replay)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "created envs/connect_four/" in proc.stdout and CONNECT_FOUR_ID in proc.stdout

    folder = repo / "results" / "create-connect_four"
    first = (folder / "round-0" / "check.txt").read_text()
    assert first.startswith("envs/connect_four/: FAILED observations in space")
    assert "FAIL  observations in space: episode 0" in first and "outside [-1.0, 1.0]" in first
    assert "PASS  written paths" in first and "PASS  stdlib imports" in first
    assert json.loads((folder / "round-1" / "check.json").read_text())["passed"] is True
    record = json.loads((folder / "create.json").read_text())
    assert record["status"] == "created" and record["rounds"] == 2

    # One commit on main adding envs/connect_four/ and nothing else; the worktree and branch are gone.
    tip = main.head.commit
    assert tip.parents[0].hexsha == base and main.active_branch.name == "main"
    assert sorted(d.b_path for d in tip.parents[0].diff(tip)) == sorted(connect_four_files())
    assert "every check passed" in tip.message and DESCRIBE in tip.message
    assert (repo / "envs" / "connect_four" / "env.py").read_text() == connect_four_files()["envs/connect_four/env.py"]
    assert not (repo / "runs" / "create-connect_four").exists()
    assert "autorl/create-connect_four" not in [h.name for h in main.heads]
    assert not main.is_dirty(untracked_files=True)

    # Frozen during search: train on it; an experiment writing under envs/ is invalid.
    train = write_replay(tmp_path / "replay-run", {1: {"envs/connect_four/README.md": "edited\n",
                                                       "DESCRIPTION": "tweak the env's README"}})
    proc = run_daemon(repo, "run", "--env", CONNECT_FOUR_ID, "--tag", "cf", "--agent", "replay", "--replay-dir",
                      str(train), "--budget", "3", "--max-experiments", "1", *FAST, "--grace", "30", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "cf")
    assert list(rows.status) == ["baseline", "baseline", "invalid"]
    assert rows.score[:2].between(-1, 1).all()
    assert "outside candidate/train.py: envs/connect_four/README.md" in rows.description[2]
    run = json.loads((repo / "results" / "cf" / "run.json").read_text())
    assert run["env_folder"] == "envs/connect_four"
    assert run["env_sha256"] == content_sha256(repo / "envs" / "connect_four")
    train_log = (repo / "results" / "cf" / "exp-0000" / "train.log").read_text()
    assert "backend: reference" in train_log and "path: jax-host" in train_log


def connect_four_runner(autorl_repo, tmp_path):
    """A LocalRunner over a run of the created connect_four env (no daemon): (runner, workspace, its
    base commit, the run folder's path)."""
    from orchestrator.config import RunConfig
    from orchestrator.inflight import InFlight
    from orchestrator.results import RunFolder
    from orchestrator.runners import RunnerSettings
    from orchestrator.runners.local import LocalRunner
    from orchestrator.workspace import Workspace

    repo = autorl_repo(train_py=COLUMN_FOUR_TRAIN_PY)
    create_connect_four(repo, tmp_path)
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    shutil.copyfile(repo / "evaluate.py", folder.harness)
    workspace = Workspace(repo, "t")
    base = workspace.create()
    config = RunConfig(
        tag="t", env_id=CONNECT_FOUR_ID, budget_s=5, grace_s=30, eval_episodes=20, eval_seed=1000, train_seeds=[1],
        confirm_seed=1, eval_timeout_s=300, eval_workers=1, schedule=["train"], main_root=str(repo),
        worktree=str(workspace.path), branch=workspace.branch, base_commit=base,
        harness_sha256=hashlib.sha256(folder.harness.read_bytes()).hexdigest(), created="", agent="replay",
        env_folder="envs/connect_four", env_sha256=content_sha256(repo / "envs" / "connect_four"))
    runner = LocalRunner(RunnerSettings(config, folder), workspace, lambda: False, InFlight(folder.path),
                         folder.harness.read_bytes())
    return runner, workspace, base, folder.path


def test_changing_the_env_folder_makes_scoring_refuse(autorl_repo, tmp_path):
    from orchestrator.results import ExpFolder
    from orchestrator.runners import Slot

    runner, workspace, base, run_dir = connect_four_runner(autorl_repo, tmp_path)
    try:
        scored = runner.measure(Slot(1, ExpFolder(run_dir / "exp-0001"), "exp 1"), base, 1)
        assert scored.status is None and -1 <= scored.score <= 1, scored.note

        # Between experiments, a hand edit of the env committed on the run's branch.
        domain = workspace.path / "envs" / "connect_four" / "connect_four.py"
        domain.write_text(domain.read_text().replace("WIN, LOSS, DRAW, ILLEGAL = 1.0", "WIN, LOSS, DRAW, ILLEGAL = 0.5"))
        changed = workspace.commit("a sneaky edit of the environment")
        refused = runner.measure(Slot(2, ExpFolder(run_dir / "exp-0002"), "exp 2"), changed, 1)
    finally:
        runner.close()
    assert refused.status == "invalid" and refused.score is None
    assert "envs/connect_four/ changed since the run started (sha256 " in refused.note
    assert refused.note.endswith("the environment is frozen during a search")
    assert not (run_dir / "exp-0002" / "eval.json").exists()


PROBE_WRITES = textwrap.dedent('''\
    import os, sys
    from pathlib import Path
    target = Path(os.environ["AUTORL_ENV_ROOT"]) / "envs" / "connect_four" / "connect_four.py"
    try:
        with open(target, "a") as f:
            f.write("WIN = 1e9\\n")
        print("ENV WRITTEN")
    except OSError as exc:
        print(f"ENV REFUSED {exc.errno}")
    (Path.cwd() / "eval-scratch.txt").write_text("ok")
    print("CWD WRITTEN")
''')


def test_a_created_envs_code_is_read_only_to_its_evaluation(autorl_repo, tmp_path):
    """What the evaluation process imports of a created env lies outside its only writable folder and
    cannot be written from inside it: a probe run with the evaluation's own walls, environment and
    sandbox tries (as a policy or the env's own code might, to raise later scores)."""
    import os
    import sys

    from orchestrator import processes
    from orchestrator.results import ExpFolder
    from orchestrator.runners import Slot

    runner, _, base, run_dir = connect_four_runner(autorl_repo, tmp_path)
    seen = {}
    real_spawn = runner._spawn

    def spawn_after_probe(slot, stage, cmd, cwd, env, log_path, timeout_s, tick, walls, **kwargs):
        if stage == "eval":
            root = Path(env["AUTORL_ENV_ROOT"])
            seen["root"], seen["writable"] = root, [Path(p) for p in walls.writable]
            seen["modes"] = [p.stat().st_mode & 0o222 for p in [root, *root.rglob("*")]]
            probe_log = tmp_path / "probe.log"
            processes.run_group([sys.executable, "-c", PROBE_WRITES], cwd, env, probe_log, 120, lambda: False,
                                walls=walls, sandbox=runner.sandbox)
            seen["probe"] = probe_log.read_text()
        return real_spawn(slot, stage, cmd, cwd, env, log_path, timeout_s, tick, walls, **kwargs)

    runner._spawn = spawn_after_probe
    try:
        scored = runner.measure(Slot(1, ExpFolder(run_dir / "exp-0001"), "exp 1"), base, 1)
    finally:
        runner.close()
    assert scored.status is None and -1 <= scored.score <= 1, scored.note
    root = seen["root"]
    assert not any(root == w or w in root.parents for w in seen["writable"]), (root, seen["writable"])
    assert set(seen["modes"]) == {0}, "the snapshot's files and folders keep no write permission"
    assert "CWD WRITTEN" in seen["probe"], seen["probe"]
    assert not root.exists(), "the read-only snapshot is removed after the evaluation"
    if not runner.sandbox.active and os.geteuid() == 0:
        pytest.skip("without bubblewrap, root ignores file permissions: only the hash re-checks guard the env "
                    f"({runner.sandbox.reason()})")
    assert "ENV REFUSED" in seen["probe"] and "ENV WRITTEN" not in seen["probe"], seen["probe"]


@pytest.mark.long
@pytest.mark.slow
def test_a_corridor_is_created_after_its_paths_and_imports_are_repaired(autorl_repo, tmp_path):
    repo = autorl_repo()
    shipped_train = (repo / "candidate" / "train.py").read_text()
    good = {"envs/corridor/corridor.py": CORRIDOR, "envs/corridor/env.py": env_py("corridor"),
            "envs/corridor/tasks.py": 'TASKS = [{"start": 0}, {"start": 3}]\n',
            "envs/corridor/README.md": "# corridor\n\n## Assumptions\n\n- the goal is the last cell\n"}
    bad = {**good, "envs/corridor/corridor.py": CORRIDOR.replace("import random\n", "import random\nimport numpy\n"),
           "candidate/train.py": shipped_train + "\n# the agent also touched train.py\n"}
    fixed = {**good, "candidate/train.py": shipped_train}  # writing it back undoes the change
    proc = create(repo, "corridor", replay_rounds(tmp_path / "replay", [bad, fixed]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = (repo / "results" / "create-corridor" / "round-0" / "check.txt").read_text()
    assert first.splitlines()[0] == "envs/corridor/: FAILED written paths, stdlib imports"
    assert "wrote outside envs/corridor/: candidate/train.py" in first
    assert "corridor.py:3: imports numpy (outside the standard library)" in first
    second = (repo / "results" / "create-corridor" / "round-1" / "check.txt").read_text()
    assert "PASS  tasks: 2 task(s)" in second and "PASS  random episodes: 1000 episodes" in second
    main = git.Repo(repo)
    added = sorted(d.b_path for d in main.head.commit.parents[0].diff(main.head.commit))
    assert added == sorted(good)  # train.py is as it was

    # create -> export: the created env's four variants pass the smoke offline, and they play the
    # domain module itself (a step cost changed in corridor.py is what every variant's tools pay).
    from orchestrator.export.smoke import framework_available
    from tests.test_export import FRAMEWORKS, play_variant

    installable = [framework for framework in FRAMEWORKS if framework_available(framework)[0]]
    if not installable:
        pytest.skip("the export half: no framework of the export extra is installed (pip install -e '.[export]')")
    proc = run_daemon(repo, "export", "--env", "envs/corridor", "--to", ",".join(installable), "--smoke",
                      "--player", "scripted", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines() if ": ok (" in line] == installable
    env_dir = repo / "envs" / "corridor"
    before = {framework: play_variant(env_dir, framework, [1, 0, 1], f"before_{framework}") for framework in installable}
    domain = env_dir / "corridor.py"
    domain.write_text(domain.read_text().replace("return state, -0.01, False", "return state, -0.05, False"))
    after = {framework: play_variant(env_dir, framework, [1, 0, 1], f"after_{framework}") for framework in installable}
    for framework in installable:
        assert before[framework] == pytest.approx([-0.01] * 3), framework
        assert after[framework] == pytest.approx([-0.05] * 3), framework


def test_a_create_that_never_passes_leaves_main_untouched(autorl_repo, tmp_path):
    repo = autorl_repo()
    main = git.Repo(repo)
    base = main.head.commit.hexsha
    broken = {**connect_four_files(), "envs/connect_four/env.py": "import gymnasium\n\nclass Env:\n    pass\n"}
    replay = replay_rounds(tmp_path / "replay", [broken, {**broken, "envs/connect_four/README.md": "still broken\n"}])
    proc = create(repo, "connect_four", replay, "--repair-rounds", "1")
    assert proc.returncode == 1
    assert "create failed: checks failed after 1 repair round(s): env class" in proc.stderr
    assert main.head.commit.hexsha == base and not (repo / "envs").exists()
    assert not main.is_dirty(untracked_files=True)
    folder = repo / "results" / "create-connect_four"
    assert json.loads((folder / "create.json").read_text())["status"] == "failed"
    assert "FAIL  env class: envs/connect_four/env.py must define `class Env(gymnasium.Env)`" in \
        (folder / "round-1" / "check.txt").read_text()
    assert (folder / "round-0" / "diff.patch").read_text().count("+++ b/envs/connect_four/") == 3

    # A second attempt keeps the first one's rounds (moved aside) and can succeed.
    create_connect_four(repo, tmp_path / "again")
    kept = [p for p in (repo / "results").iterdir() if p.name.startswith("create-connect_four.")]
    assert len(kept) == 1 and (kept[0] / "round-1" / "check.txt").exists()


def test_bad_input_is_refused_and_nothing_is_lost(autorl_repo, tmp_path):
    repo = autorl_repo()
    replay = replay_rounds(tmp_path / "replay", [connect_four_files()])
    proc = run_daemon(repo, "create", "--name", "x", "--describe", DESCRIBE, "--agent", "optuna")
    assert proc.returncode == 2 and "invalid choice: 'optuna'" in proc.stderr
    proc = run_daemon(repo, "create", "--name", "x", "--agent", "replay", "--replay-dir", str(replay))
    assert proc.returncode == 2 and "one of the arguments --describe --spec is required" in proc.stderr
    proc = run_daemon(repo, "create", "--name", "Connect-Four", "--describe", DESCRIBE)
    assert proc.returncode == 1 and "bad --name 'Connect-Four'" in proc.stderr
    proc = run_daemon(repo, "create", "--name", "x", "--spec", str(tmp_path / "missing.txt"))
    assert proc.returncode == 1 and "--spec" in proc.stderr and "No such file" in proc.stderr
    proc = run_daemon(repo, "create", "--name", "x", "--describe", DESCRIBE)
    assert proc.returncode == 1 and "create needs an agent that writes code" in proc.stderr

    (repo / "candidate" / "train.py").write_text("# an edit in progress\n")
    proc = create(repo, "connect_four", replay)
    assert proc.returncode == 1 and "uncommitted changes (candidate/train.py)" in proc.stderr
    assert (repo / "candidate" / "train.py").read_text() == "# an edit in progress\n"
    git.Repo(repo).git.checkout("candidate/train.py")

    create_connect_four(repo, tmp_path)
    before = content_sha256(repo / "envs" / "connect_four")
    proc = create(repo, "connect_four", replay)
    assert proc.returncode == 1 and "envs/connect_four/ exists already" in proc.stderr
    assert content_sha256(repo / "envs" / "connect_four") == before

    proc = run_daemon(repo, "run", "--env", "envs.nothing.env:Env", "--max-experiments", "0")
    assert proc.returncode == 1 and "envs/nothing/ is not in commit" in proc.stderr
    assert not (repo / "results" / "envs_nothing_env_env").exists()


def test_the_harness_and_the_daemon_hash_an_env_folder_alike(tmp_path):
    import evaluate

    folder = tmp_path / "envs" / "demo"
    (folder / "sub").mkdir(parents=True)
    (folder / "demo.py").write_text("X = 1\n")
    (folder / "sub" / "data.txt").write_bytes(b"\x00\x01")
    before = content_sha256(folder)
    assert evaluate.env_folder_sha256(folder) == before
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "demo.cpython-311.pyc").write_bytes(b"compiled")
    assert content_sha256(folder) == evaluate.env_folder_sha256(folder) == before
    (folder / "demo.py").write_text("X = 2\n")
    assert content_sha256(folder) != before
