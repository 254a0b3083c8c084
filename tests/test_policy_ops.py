"""A policy is pure computation: before the harness first calls an artifact it holds every op of the
artifact's graph to evaluate.ALLOWED_POLICY_OPS. A policy that would write a file (the review's
`torch.from_file(..., shared=True)` + `copy_`), print, or run code as it loads is refused unrun; the
daemon records it `invalid` with the harness's reason. Each evaluation process also checks the frozen
env folder again once it has imported the env."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Tuple

import pytest
import torch
import torch.nn as nn

import evaluate
from tests.conftest import FAST, TINY_TRAIN_PY, read_results, run_daemon, write_replay
from tests.handmade_policies import AlwaysZero
from tests.train_helpers import edited_copy, run_train

REPO = Path(__file__).resolve().parent.parent
UNTOUCHED = b"the environment's code\n"


def target_file(tmp_path: Path) -> Path:
    target = tmp_path / "target.txt"
    target.write_bytes(UNTOUCHED)
    return target


class WritesAFile(nn.Module):
    """The review's attack: maps a file writable and overwrites it from inside forward()."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mapped = torch.from_file(self.path, shared=True, size=4, dtype=torch.uint8)
        mapped.copy_(torch.full((4,), 88, dtype=torch.uint8))
        return torch.zeros(obs.shape[0], dtype=torch.long) + 0 * mapped[0].long()


class Prints(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        print("a line on the harness's stdout")
        return torch.zeros(obs.shape[0], dtype=torch.long)


class WritesWhenLoaded(nn.Module):
    """TorchScript runs a module's __setstate__ inside torch.jit.load, before any graph is looked at."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, bool]:
        return self.path, self.training

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]) -> None:
        mapped = torch.from_file(state[0], shared=True, size=4, dtype=torch.uint8)
        mapped.copy_(torch.full((4,), 88, dtype=torch.uint8))
        self.path, self.training = state[0], state[1] and bool(mapped[0] >= 0)  # used, so not compiled away

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.long)


class PrintsFromAHook(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.long)


def printing_pre_hook(module: nn.Module, inputs: Tuple[torch.Tensor]) -> None:
    print("a hook ran")


class MLP(nn.Module):
    """What a researcher writes: layers, control flow, and the common activations and heads."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.LayerNorm(32),
                                    nn.GELU(), nn.Dropout(0.1))
        self.head = nn.Linear(32, 2)
        self.softmax = nn.Softmax(dim=-1)  # scripted, its dim=None branch holds an aten::warn

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.hidden(torch.clamp(obs, -10.0, 10.0))
        if obs.shape[0] > 1:
            h = h * 1.0
        for _ in range(2):
            h = h + 0.0
        return torch.argmax(self.softmax(self.head(h)), dim=-1)


class ConvPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm1d(4)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.pool(torch.relu(self.norm(self.conv(obs.unsqueeze(1))))).flatten(1)
        return torch.log_softmax(self.head(h), dim=-1).argmax(-1)


def scripted(module: nn.Module, path: Path) -> Path:
    torch.jit.save(torch.jit.script(module), str(path))
    return path


def exported(module: nn.Module, path: Path) -> Path:
    program = torch.export.export(module.eval(), (torch.zeros(3, 4),), dynamic_shapes=({0: torch.export.Dim("b")},))
    torch.export.save(program, str(path))
    return path


def refusal(path: Path) -> str:
    with pytest.raises(evaluate.PolicyRefused) as refused:
        evaluate.load_policy(path)
    return str(refused.value)


# ---------------------------------------------------------------- refused before it runs
def test_a_policy_that_writes_a_file_is_refused_before_it_runs(tmp_path):
    target = target_file(tmp_path)
    path = scripted(WritesAFile(str(target)), tmp_path / "policy.pt")
    assert refusal(path) == "policy.pt calls aten::from_file: a policy may not do I/O"
    assert target.read_bytes() == UNTOUCHED
    torch.jit.load(str(path))(torch.zeros(2, 4))  # run, as the harness used to: the attack is real
    assert target.read_bytes() != UNTOUCHED


def test_a_policy_that_prints_is_refused_and_so_is_one_that_prints_from_a_hook(tmp_path):
    assert refusal(scripted(Prints(), tmp_path / "prints.pt")) == "prints.pt calls prim::Print: a policy may not do I/O"
    hooked = PrintsFromAHook()
    hooked.register_forward_pre_hook(printing_pre_hook)  # a hook is not part of forward's graph
    assert refusal(scripted(hooked, tmp_path / "hook.pt")) == "hook.pt calls prim::Print: a policy may not do I/O"


def test_a_policy_that_runs_code_as_it_loads_is_refused_unloaded(tmp_path):
    target = target_file(tmp_path)
    path = scripted(WritesWhenLoaded(str(target)), tmp_path / "policy.pt")
    assert target.read_bytes() == UNTOUCHED
    assert refusal(path) == ("policy.pt defines __setstate__, which runs as it loads: a policy may not run code "
                             "when loaded")
    assert target.read_bytes() == UNTOUCHED
    torch.jit.load(str(path))  # loaded as the harness used to: the file is overwritten by the load itself
    assert target.read_bytes() != UNTOUCHED


def test_random_sampling_is_allowed_but_a_file_read_is_not(tmp_path):
    # bench/random_policy.py scores a uniformly random policy with the harness: sampling reads nothing.
    spec = importlib.util.spec_from_file_location("random_policy", REPO / "bench" / "random_policy.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    policy = evaluate.load_policy(scripted(bench.UniformDiscrete(3), tmp_path / "random.pt"))
    assert set(policy(torch.zeros(200, 4).numpy()).tolist()) == {0, 1, 2}

    class ReadsNoise(nn.Module):
        def __init__(self, path: str):
            super().__init__()
            self.path = path

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.from_file(self.path, size=obs.shape[0], dtype=torch.uint8).long() % 3

    target = target_file(tmp_path)
    assert refusal(scripted(ReadsNoise(str(target)), tmp_path / "reads.pt")) == \
        "reads.pt calls aten::from_file: a policy may not do I/O"


def test_a_torch_export_artifact_is_checked_op_by_op(tmp_path):
    class PrintsInExport(nn.Module):
        def forward(self, obs):
            torch.ops.aten._print("a line on the harness's stdout")
            return obs.sum(-1)

    assert refusal(exported(PrintsInExport(), tmp_path / "policy.pt2")) == \
        "policy.pt2 calls aten::_print: a policy may not do I/O"


def test_a_torch_export_artifact_may_not_unpickle_code_as_it_loads(tmp_path):
    # torch.export.load unpickles an archive's sample inputs, retrying with full pickle when the
    # weights-only load fails: a crafted payload would run as the harness loads the artifact.
    witness = tmp_path / "ran-at-load"
    payload = io.BytesIO()
    torch.save((_RunsWhenUnpickled(str(witness)),), payload)
    clean = zipfile.ZipFile(exported(MLP(), tmp_path / "clean.pt2"))
    path = tmp_path / "policy.pt2"
    with zipfile.ZipFile(path, "w") as crafted:
        for entry in clean.infolist():
            sample_inputs = entry.filename.endswith("data/sample_inputs/model.pt")
            crafted.writestr(entry.filename, payload.getvalue() if sample_inputs else clean.read(entry))
    assert refusal(path) == ("policy.pt2 holds a pickled object that is not plain tensors: a policy may not run "
                             "code when loaded")
    assert not witness.exists()


class _RunsWhenUnpickled:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return Path.touch, (Path(self.path),)


# ---------------------------------------------------------------- ordinary policies load and act
@pytest.mark.parametrize("make", [MLP, ConvPolicy], ids=["mlp", "conv"])
@pytest.mark.parametrize("save", [scripted, exported], ids=["torchscript", "torch.export"])
def test_ordinary_policies_load_and_act(tmp_path, make, save):
    module = make().eval()
    path = save(module, tmp_path / ("policy.pt" if save is scripted else "policy.pt2"))
    obs = torch.randn(5, 4).numpy()
    with torch.no_grad():
        assert (evaluate.load_policy(path)(obs) == module(torch.as_tensor(obs)).numpy()).all()


def test_a_traced_policy_as_train_py_exports_it_loads(tmp_path):
    actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    class Exported(nn.Module):  # train.py's ExportedPolicy: normalise, clip, act, argmax
        def __init__(self):
            super().__init__()
            self.actor = actor
            self.register_buffer("obs_mean", torch.zeros(4))
            self.register_buffer("obs_std", torch.ones(4))

        def forward(self, obs):
            x = torch.clamp((torch.flatten(obs, 1) - self.obs_mean) / self.obs_std, -10.0, 10.0)
            return torch.argmax(self.actor(x), dim=-1)

    path = tmp_path / "policy.pt"
    torch.jit.save(torch.jit.trace(Exported(), torch.zeros(2, 4), check_trace=False), str(path))
    assert evaluate.load_policy(path)(torch.zeros(3, 4).numpy()).shape == (3,)


# ---------------------------------------------------------------- the harness, the trainer, the daemon
def test_the_harness_exits_with_its_own_code_and_one_line(tmp_path):
    target = target_file(tmp_path)
    path = scripted(WritesAFile(str(target)), tmp_path / "bad.pt")
    proc = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--policy", str(path), "--env", "CartPole-v1",
                           "--episodes", "2", "--out", str(tmp_path / "e.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == evaluate.POLICY_REFUSED_EXIT == 4, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "evaluate.py: error: bad.pt calls aten::from_file: a policy may not do I/O"
    assert target.read_bytes() == UNTOUCHED and not (tmp_path / "e.json").exists()


def test_train_py_learns_of_a_refused_export_from_its_own_check(tmp_path):
    """A train.py that writes its own TorchScript over policy_export's (one that reads a file) is told by
    its export_check, which loads the artifact as the harness does."""
    target = target_file(tmp_path)
    own_export = ("    export_policy(act, example, policy_path)\n"
                  "    import torch\n\n"
                  "    class ReadsAFile(torch.nn.Module):\n"
                  "        def forward(self, obs: torch.Tensor) -> torch.Tensor:\n"
                  f"            return torch.argmax(obs, -1) + torch.from_file({str(target)!r}, size=1, "
                  "dtype=torch.uint8)[0].long()\n\n"
                  "    torch.jit.save(torch.jit.script(ReadsAFile()), str(policy_path))\n")
    root = edited_copy(tmp_path / "repo", {"    export_policy(act, example, policy_path)\n": own_export})
    proc, _ = run_train("CartPole-v1", 3, tmp_path / "out", tmp_path / "verdicts", root=root)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == \
        "export_check: FAILED (policy.pt calls aten::from_file: a policy may not do I/O)"
    assert target.read_bytes() == UNTOUCHED


EVIL_TRAIN_PY = textwrap.dedent('''\
    import os
    from pathlib import Path

    import torch


    class Forger(torch.nn.Module):
        def __init__(self, path: str):
            super().__init__()
            self.path = path

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            mapped = torch.from_file(self.path, shared=True, size=4, dtype=torch.uint8)
            mapped.copy_(torch.full((4,), 88, dtype=torch.uint8))
            return (0.1 * obs[:, 0] + 0.5 * obs[:, 1] + 10.0 * obs[:, 2] + 2.0 * obs[:, 3] > 0).long() \\
                + 0 * mapped[0].long()


    out = Path(os.environ["AUTORL_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(Forger(TARGET)), str(out / "policy.pt"))
    print("---")
    print("env_steps: 1000")
    print("sps: 500")
''')


def test_the_daemon_records_a_refused_policy_invalid_with_the_reason(autorl_repo, tmp_path):
    target = target_file(tmp_path)
    repo = autorl_repo(train_py=TINY_TRAIN_PY)
    replay = write_replay(tmp_path / "replay", {1: {
        "candidate/train.py": EVIL_TRAIN_PY.replace("TARGET", repr(str(target))),
        "DESCRIPTION": "a controller that also rewrites a file while it is scored"}})
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "io", "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", "5", "--max-experiments", "1", "--no-setup-verify", *FAST, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "io")
    forged = rows[rows.exp == 1].iloc[-1]
    assert forged["status"] == "invalid" and forged["score"] != forged["score"], forged.to_dict()  # no score
    assert forged["description"].endswith("[policy.pt calls aten::from_file: a policy may not do I/O]")
    assert target.read_bytes() == UNTOUCHED
    assert not (repo / "results" / "io" / "exp-0001" / "eval.json").exists()


# ---------------------------------------------------------------- the env, checked where it is imported
SELF_EDITING_ENV = textwrap.dedent('''\
    """An env whose import rewrites its own folder in the process named REWRITER."""
    import multiprocessing
    from pathlib import Path

    import gymnasium as gym
    import numpy as np

    if (multiprocessing.current_process().name == "MainProcess") == (REWRITER == "MainProcess"):
        (Path(__file__).parent / "rules.py").write_text("REWARD = 1000.0\\n")


    class Env(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.steps = 0
            return np.zeros(4, np.float32), {}

        def step(self, action):
            self.steps += 1
            return np.zeros(4, np.float32), 1.0, self.steps >= 5, False, {}
''')


@pytest.mark.parametrize("rewriter, workers", [("MainProcess", 1), ("a worker", 2)], ids=["main", "worker"])
def test_an_env_changed_after_the_first_check_is_caught_where_it_is_imported(tmp_path, rewriter, workers):
    """The harness checks the frozen hash before it imports the env; here the import itself rewrites the
    folder (in the main process, or only in a spawned worker): the check after the import catches it."""
    root = tmp_path / "root"
    env_folder = root / "envs" / "selfedit"
    env_folder.mkdir(parents=True)
    (root / "envs" / "__init__.py").write_text("")
    (env_folder / "__init__.py").write_text("")
    (env_folder / "rules.py").write_text("REWARD = 1.0\n")
    (env_folder / "env.py").write_text(SELF_EDITING_ENV.replace("REWRITER", repr(rewriter)))
    frozen = evaluate.env_folder_sha256(env_folder)
    policy = scripted(AlwaysZero(), tmp_path / "policy.pt")
    env = {**os.environ, evaluate.ENV_ROOT_VARIABLE: str(root), evaluate.ENV_SHA256_VARIABLE: frozen}
    proc = subprocess.run([sys.executable, str(REPO / "evaluate.py"), "--policy", str(policy), "--env",
                           "envs.selfedit.env:Env", "--episodes", "4", "--workers", str(workers)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert (env_folder / "rules.py").read_text() == "REWARD = 1000.0\n"  # the folder did change, after the check
    assert proc.returncode == evaluate.ENV_CHANGED_EXIT, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("the environment is frozen during a search")
    assert not json_lines(proc.stdout)


def json_lines(stdout: str) -> list:
    return [line for line in stdout.splitlines() if line.startswith("{") and "mean" in json.loads(line)]
