"""ModalRunner against an in-process fake of the Modal surface it uses (spawn, get with a
timeout, cancel, FunctionCall.from_id): no network. The fake runs the Modal functions' own train
and score logic (runners/modal_experiment.py) in threads, so results are real; what is fake is
only the container."""
from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from argparse import Namespace

import pytest

from orchestrator.config import Limits, Options
from orchestrator.agents.replay import ReplayAgent
from orchestrator.daemon import write_state
from orchestrator.runners.modal import ComputePrices, ModalRunner
from orchestrator.runners.modal_experiment import score_policy, train_archive
from orchestrator.runners import RunnerSettings
from orchestrator.setup import start
from tests.conftest import FAST, read_results, run_daemon, tiny_train_py, write_replay


class FakeCall:
    ids = itertools.count(1)

    def __init__(self, registry: dict, target, *args):
        self.object_id = f"fc-fake{next(self.ids)}"
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.value = self.error = None
        registry[self.object_id] = self

        def work():
            try:
                self.value = target(*args, should_stop=self.cancelled.is_set)
            except BaseException as exc:  # the remote function raised: get() re-raises it
                self.error = exc
            self.done.set()
        threading.Thread(target=work, daemon=True).start()

    def get(self, timeout=None):
        if not self.done.wait(timeout):
            raise TimeoutError()
        if self.cancelled.is_set():
            raise RuntimeError("the call was cancelled")
        if self.error:
            raise self.error
        return self.value

    def cancel(self, terminate_containers=False):
        self.cancelled.set()


class FakeFunction:
    def __init__(self, registry, target):
        self.registry, self.target = registry, target

    def spawn(self, *args):
        return FakeCall(self.registry, self.target, *args)


class FakeModal:
    """train/evaluate with Modal's spawn surface; from_id as modal.FunctionCall.from_id."""

    def __init__(self):
        self.calls: dict[str, FakeCall] = {}

        def score(*args, should_stop):
            return score_policy(*args, workers=1)
        self.train = FakeFunction(self.calls, train_archive)
        self.evaluate = FakeFunction(self.calls, score)

    def from_id(self, call_id):
        return self.calls[call_id]


def modal_factory(fake: FakeModal):
    def factory(config, folder, workspace, stop, journal, harness_bytes):
        return ModalRunner(RunnerSettings(config, folder), workspace, stop.requested, journal, harness_bytes, fake, fake.from_id,
                           ComputePrices.load(None), gpu="H100", cpu=8)
    return factory


def options(repo, replay, fake, **kw):
    # grace 10: the tiny train.py still imports torch, which a loaded machine must not turn into a kill
    settings = dict(env_id="CartPole-v1", tag="cloud", agent="replay", budget_s=2, grace_s=10, eval_episodes=10,
                    eval_workers=1, runner="modal", repo=repo, agent_args=Namespace(replay_dir=replay),
                    runner_factory=modal_factory(fake))
    return Options(**{**settings, **kw})


def replay_factory(args, run_dir):
    return ReplayAgent(args.replay_dir)


def test_results_land_in_the_local_layout_and_compute_is_billed(autorl_repo, tmp_path, restore_signals):
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": tiny_train_py(BIAS=0.0),
                                                    "DESCRIPTION": "no bias"}})
    fake = FakeModal()
    assert start(options(repo, replay, fake), replay_factory, environ={}) == 0

    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["baseline", "baseline", "keep"]
    assert rows["score"].iloc[-1] == 500.0
    assert (rows["cost_usd"] > 0).all(), "Modal compute is billed on every row"
    exp1 = repo / "results" / "cloud" / "exp-0001"
    assert (exp1 / "out" / "policy.pt").is_file() and "env_steps: 1000" in (exp1 / "train.log").read_text()
    assert json.loads((exp1 / "eval.json").read_text())["episodes"] == 10
    assert json.loads((repo / "results" / "cloud" / "run.json").read_text())["runner"] == "modal"
    assert len(fake.calls) == 6  # train + evaluate for 2 baselines and exp 1


HANG = tiny_train_py(BIAS=0.5).replace("out = Path(", "time.sleep(600)\nout = Path(", 1)


def test_stop_cancels_the_call_in_flight(autorl_repo, tmp_path, restore_signals):
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": HANG, "DESCRIPTION": "hangs"}})
    fake = FakeModal()
    run_dir = repo / "results" / "cloud"

    def stop_when_exp_1_trains():
        deadline = time.time() + 120
        while time.time() < deadline:
            state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").exists() else {}
            if any(r["exp"] == 1 and r.get("stage") == "train" for r in state.get("in_flight") or []):
                (run_dir / "STOP").write_text("test\n")
                return
            time.sleep(0.1)
    threading.Thread(target=stop_when_exp_1_trains, daemon=True).start()
    assert start(options(repo, replay, fake, budget_s=120), replay_factory, environ={}) == 0

    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["baseline", "baseline", "interrupted"]
    hung = [c for c in fake.calls.values() if not c.done.is_set() or c.cancelled.is_set()]
    assert hung and all(c.cancelled.is_set() for c in hung), "the training call of exp 1 was cancelled"


def test_resume_cancels_a_recorded_call(autorl_repo, tmp_path, restore_signals):
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": tiny_train_py(BIAS=0.5),
                                                    "DESCRIPTION": "less bias"}})
    fake = FakeModal()
    assert start(options(repo, replay, fake, limits=Limits(max_experiments=1)), replay_factory, environ={}) == 0
    # What a daemon killed mid-experiment leaves: exp 2 in flight with a live Modal call.
    orphan = fake.train.spawn(b"not an archive", "CartPole-v1", 600, 1, 5)
    orphan.done.clear()
    run_dir = repo / "results" / "cloud"
    write_state(run_dir, {"pid": 1, "in_flight": [{"exp": 2, "phase": "train", "stage": "train", "rows_before": 3,
                                                   "commit": None, "handles": [{"kind": "modal", "stage": "train",
                                                                                "call_id": orphan.object_id}]}]})
    resumed = options(repo, replay, fake, resume=True, limits=Limits(max_experiments=2))
    assert start(resumed, replay_factory, environ={}) == 0
    assert orphan.cancelled.is_set()
    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["baseline", "baseline", "keep", "interrupted"]


def test_runner_modal_without_a_token_fails_fast_and_leaves_nothing(autorl_repo, tmp_path):
    repo = autorl_repo(tiny_train_py())
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": "", "MODAL_CONFIG_PATH": str(home / "none")}
    started = time.monotonic()
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "cloud", "--runner", "modal",
                        "--max-experiments", "1", *FAST, env=env, timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode != 0 and "modal token new" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (repo / "results" / "cloud").exists() and not (repo / "runs" / "cloud").exists()


def test_price_table_override(tmp_path):
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"H100": 1.0, "cpu_core": 0.0}))
    assert ComputePrices.load(str(table)).cost(3600, "H100", 8) == pytest.approx(1.0)
    assert ComputePrices.load(None).cost(3600, "H100", 0) == pytest.approx(3.95)
    with pytest.raises(ValueError, match="modal-price-table"):
        ComputePrices.load(str(tmp_path / "missing.json"))


def test_pull_without_a_token_says_how_to_get_one(autorl_repo, tmp_path):
    repo = autorl_repo(tiny_train_py())
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": "", "MODAL_CONFIG_PATH": str(home / "none")}
    result = run_daemon(repo, "pull", "--tag", "cloud", env=env, timeout=60)
    assert result.returncode == 1 and "modal token new" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (repo / "results" / "cloud").exists()


def test_prices_count_every_gpu_of_a_container_and_ignore_the_case_of_its_name(monkeypatch):
    prices = ComputePrices.load(None)
    assert prices.cost(3600, "H100:2", 0) == pytest.approx(2 * 3.95)
    assert prices.cost(3600, "a100-80gb", 0) == pytest.approx(2.50)  # not the H100 fallback
    assert prices.cost(3600, "l4", 2) == pytest.approx(0.80 + 2 * 0.047)


def test_scoring_is_billed_at_the_eval_containers_cores_and_a_wrong_harness_hash_is_invalid(
        autorl_repo, tmp_path, monkeypatch):
    from orchestrator.config import RunConfig
    from orchestrator.inflight import InFlight
    from orchestrator.results import ExpFolder, RunFolder
    from orchestrator.runners import Slot
    from orchestrator.runners.base import Measurement, add_evaluation
    from orchestrator.workspace import Workspace

    repo = autorl_repo(tiny_train_py(BIAS=0.0))
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    harness = (repo / "evaluate.py").read_bytes()
    folder.harness.write_bytes(harness)
    workspace = Workspace(repo, "t")
    base = workspace.create()
    config = RunConfig(tag="t", env_id="CartPole-v1", budget_s=3, grace_s=10, eval_episodes=5, eval_seed=1000,
                       train_seeds=[1], confirm_seed=2, eval_timeout_s=300, eval_workers=1, schedule=["train"],
                       main_root=str(repo), worktree=str(workspace.path), branch=workspace.branch, base_commit=base,
                       harness_sha256=hashlib.sha256(harness).hexdigest(), created="", agent="replay")
    fake = FakeModal()
    runner = ModalRunner(RunnerSettings(config, folder), workspace, lambda: False, InFlight(folder.path), harness,
                         fake, fake.from_id, ComputePrices.load(None), gpu="H100", cpu=8)
    monkeypatch.setenv("AUTORL_MODAL_EVAL_CPU", "2")
    try:
        slot = Slot(1, ExpFolder(folder.path / "exp-0001"), "exp 1")
        m = runner.measure(slot, base, 1)
        assert m.status is None and m.score == 500.0, m.note
        policy = slot.folder.out / "policy.pt"
        runner.harness_bytes = harness + b"\n# changed\n"   # the bytes sent no longer match the recorded hash
        outcome = runner.evaluate(slot, policy)
        assert outcome.tampered and "HarnessRefused" in outcome.error
        assert outcome.compute_usd == pytest.approx(outcome.wall_s / 3600 * 2 * 0.047)
        assert add_evaluation(Measurement(), outcome, slot.folder).status == "invalid"
    finally:
        runner.close()
