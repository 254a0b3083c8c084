"""ModalRunner against tests/fake_modal.py: the real Modal functions of modal_functions.py run in
container subprocesses, their arguments and results pickled as Modal pickles them, with what
fails in real life (a queue before a GPU, pre-emption, timeouts, expired outputs, cancellation
raised in the running code, an ephemeral app that dies with the daemon). No network."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.agents.replay import ReplayAgent
from orchestrator.config import Limits, Options, RunConfig, RunError
from orchestrator.inflight import InFlight
from orchestrator.results import ExpFolder, RunFolder
from orchestrator.runners import RunnerSettings, Slot
from orchestrator.runners.base import Measurement, add_evaluation
from orchestrator.runners.modal.runner import ComputePrices, ModalRunner
from orchestrator.runners.modal.calls import CallPolicy
from orchestrator.setup import start
from orchestrator.status import modal_call_lines, render_status
from orchestrator.workspace import Workspace
from tests.conftest import (FAST, PYTHON, daemon_env, read_results, run_daemon, tiny_train_py,
                            unique_sleep, wait_until_gone, write_replay)
from tests.fake_modal import NO_ISOLATION, FakeCall, FakeModal, FakeVolume, Plan, isolation

# Seconds, not Modal's minutes: a call waits for a container at most 60 s, twice, 0.2 s apart.
QUICK = CallPolicy(queue_limit_s=60, tries=2, backoff_s=0.2, answer_margin_s=5, state_poll_s=0.2, poll_s=0.2)
NEVER = 1e9  # a queue that never yields a GPU


def modal_factory(fake: FakeModal, policy: CallPolicy = QUICK, prices: ComputePrices | None = None, cpu: float = 8,
                  host_cpu: float = 0.0):
    def factory(config, folder, workspace, stop, journal, harness_bytes):
        return ModalRunner(RunnerSettings(config, folder), workspace, stop.requested, journal, harness_bytes, fake,
                           fake.from_id, prices or ComputePrices.load(None), gpu="H100", cpu=cpu, close=fake.stop,
                           policy=policy, host_cpu=host_cpu)
    return factory


def options(repo, replay, fake, policy: CallPolicy = QUICK, factory=None, **kw):
    # grace 10: the tiny train.py still imports torch, which a loaded machine must not turn into a kill
    settings = dict(env_id="CartPole-v1", tag="cloud", agent="replay", budget_s=2, grace_s=10, export_margin_s=30,
                    rescore_seeds=0, eval_episodes=10,
                    eval_workers=1, baselines=2, runner="modal", repo=repo, agent_args=Namespace(replay_dir=replay),
                    runner_factory=factory or modal_factory(fake, policy))
    return Options(**{**settings, **kw})


def replay_factory(args, run_dir):
    return ReplayAgent(args.replay_dir)


class OneRunner:
    """A ModalRunner over a fresh run folder, for one measurement at a time (no daemon)."""

    def __init__(self, autorl_repo, base: Path, train_py: str, policy: CallPolicy = QUICK,
                 files: dict[str, str] | None = None, prices: ComputePrices | None = None, **fake_options):
        repo = autorl_repo(train_py, files=files, name=f"{base.name}-checkout")
        self.folder = RunFolder(base / "run")
        self.folder.path.mkdir(parents=True)
        self.harness = (repo / "evaluate.py").read_bytes()
        self.folder.harness.write_bytes(self.harness)
        workspace = Workspace(repo, "t")
        self.commit = workspace.create()
        config = RunConfig(tag="t", env_id="CartPole-v1", budget_s=2, grace_s=10, export_margin_s=30, eval_episodes=5,
                           eval_seed=1000,
                           train_seeds=[1], confirm_seed=2, eval_timeout_s=300, eval_workers=1, schedule=["train"],
                           main_root=str(repo), worktree=str(workspace.path), branch=workspace.branch,
                           base_commit=self.commit, harness_sha256=hashlib.sha256(self.harness).hexdigest(),
                           created="", agent="replay")
        self.fake = FakeModal(base / "modal", **fake_options)
        self.journal = InFlight(self.folder.path)
        self.runner = ModalRunner(RunnerSettings(config, self.folder), workspace, lambda: False, self.journal,
                                  self.harness, self.fake, self.fake.from_id, prices or ComputePrices.load(None),
                                  gpu="H100",
                                  cpu=8, close=self.fake.stop, policy=policy)
        self.slot = Slot(1, ExpFolder(self.folder.path / "exp-0001"), "exp 1")

    def measure(self) -> Measurement:
        self.journal.begin(1, "train", "train", 0, self.commit)
        return self.runner.measure(self.slot, self.commit, 1)

    def in_flight(self) -> list[dict]:
        state = json.loads((self.folder.path / "state.json").read_text())
        return state.get("in_flight") or []


@pytest.fixture
def one_runner(autorl_repo, tmp_path):
    made = []

    def make(train_py: str = tiny_train_py(BIAS=0.0), **kw) -> OneRunner:
        made.append(OneRunner(autorl_repo, tmp_path / f"r{len(made)}", train_py, **kw))
        return made[-1]
    yield make
    for r in made:
        r.runner.close()


# ---------------------------------------------------------------- a night on the fake
@pytest.mark.slow
def test_results_land_in_the_local_layout_and_compute_is_billed(autorl_repo, tmp_path, restore_signals):
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": tiny_train_py(BIAS=0.0),
                                                    "DESCRIPTION": "no bias"}})
    fake = FakeModal(tmp_path / "modal")
    assert start(options(repo, replay, fake), replay_factory, environ={}) == 0

    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["baseline", "baseline", "keep"]
    assert rows["score"].iloc[-1] == 500.0
    assert (rows["cost_usd"] > 0).all(), "Modal compute is billed on every row"
    exp1 = repo / "results" / "cloud" / "exp-0001"
    assert (exp1 / "out" / "policy.pt").is_file() and "env_steps: 1000" in (exp1 / "train.log").read_text()
    assert json.loads((exp1 / "eval.json").read_text())["episodes"] == 10
    assert json.loads((repo / "results" / "cloud" / "run.json").read_text())["runner"] == "modal"
    # 2 baselines, exp 1 and the confirmations the keep rule asked of it (one baseline pair: 1 df)
    confirmations = len(list(exp1.glob("confirm*")))
    assert len(fake.train.calls) == len(fake.evaluate.calls) == 3 + confirmations and confirmations <= 1
    assert not fake.app.alive(), "the session's app stops with the runner"


@pytest.mark.slow
def test_a_night_in_a_modal_container_bills_that_container_into_its_rows(autorl_repo, tmp_path, restore_signals,
                                                                          monkeypatch):
    """The daemon's own container (the night's, 2 cores) is billed into the rows for all the night's
    time, the agent's turns included: here the only price is $1 per core-second and the train and
    scoring containers are given no cores, so the rows add up to 2 x the night's seconds."""
    monkeypatch.setenv("AUTORL_MODAL_EVAL_CPU", "0")
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": tiny_train_py(BIAS=0.0),
                                                    "DESCRIPTION": "no bias"}})
    fake = FakeModal(tmp_path / "modal")
    per_core_second = ComputePrices({"H100": 0.0, "cpu_core": 3600.0})
    assert per_core_second.cost(10, "H100", 0) == 0.0 and per_core_second.cost(10, None, 2) == 20.0
    started = time.monotonic()
    factory = modal_factory(fake, prices=per_core_second, cpu=0, host_cpu=2)
    assert start(options(repo, replay, fake, factory=factory), replay_factory, environ={}) == 0
    elapsed = time.monotonic() - started

    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["baseline", "baseline", "keep"]
    times = pd.to_datetime(rows["time"])
    first_to_last = (times.iloc[-1] - times.iloc[0]).total_seconds()
    assert 2 * (first_to_last - 1) <= rows["cost_usd"].sum() <= 2 * elapsed
    assert (rows["cost_usd"] > 0).all()


def test_max_cost_is_checked_before_each_call_not_between_experiments(autorl_repo, tmp_path, restore_signals):
    """At $1 per GPU-second the first baseline's training call alone passes --max-cost 0.5: its scoring
    call is never launched, nor anything after it, and the night ends saying why. (Checked between
    experiments only, the baseline was scored and the second one trained.)"""
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    fake = FakeModal(tmp_path / "modal")
    factory = modal_factory(fake, prices=ComputePrices({"H100": 3600.0, "cpu_core": 0.0}))
    night = options(repo, write_replay(tmp_path / "replay", {}), fake, factory=factory, setup_verify=False,
                    limits=Limits(max_cost=0.5))
    start(night, replay_factory, environ={})
    assert len(fake.train.calls) == 1 and len(fake.evaluate.calls) == 0
    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["interrupted"] and rows["cost_usd"].iloc[0] > 0.5
    assert "--max-cost reached" in (repo / "results" / "cloud" / "daemon.log").read_text()


def test_check_calls_are_billed_into_the_next_row(one_runner):
    """Asking a container what it runs, verifying and benchmarking cost GPU time too: the next row
    written carries it (`unbilled_usd`), once."""
    r = one_runner(prices=ComputePrices({"H100": 3600.0, "cpu_core": 0.0}))
    r.runner.environment()   # a check call
    billed = r.runner.unbilled_usd(0.0)
    assert billed > 0 and len(r.fake.check.calls) == 1
    assert r.runner.unbilled_usd(0.0) == 0.0


@pytest.mark.parametrize("image_rust", [False, True])
def test_setup_ships_a_rust_port_only_where_the_containers_can_build_it(one_runner, image_rust):
    """A container has the image's PATH, not this machine's: setup asks the containers for their rustc
    (this machine had one, and a night sent the Rust port to containers that could not build it)."""
    from envs_fast.rust.build import rustc_available
    from orchestrator.shipped import shipped_specs

    if not rustc_available():
        pytest.skip("no rustc on this machine to stand in for the image's")
    r = one_runner(image_rust=image_rust)
    environment = r.runner.environment()
    assert (environment["rustc"] != "no rustc") == image_rust, environment["rustc"]
    specs = shipped_specs("BipedalWalker-v3", r.runner.workspace, r.commit, r.runner.record_environment())
    assert ("envs_fast/translations/bipedalwalker_v3.rs" in specs) == image_rust, specs


def test_a_baseline_the_infrastructure_never_ran_ends_the_night_saying_so(autorl_repo, tmp_path, restore_signals):
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    fake = FakeModal(tmp_path / "modal")
    fake.train.plans = [Plan(queue_s=NEVER), Plan(queue_s=NEVER)]
    policy = CallPolicy(queue_limit_s=2, tries=2, backoff_s=0.2, answer_margin_s=5, state_poll_s=0.2, poll_s=0.2)
    with pytest.raises(RunError, match=r"baseline 1/2 was not measured \(infrastructure: .*never started.*--resume"):
        start(options(repo, write_replay(tmp_path / "replay", {}), fake, policy), replay_factory, environ={})
    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["interrupted"] and "not your code" in rows["description"].iloc[0]


def hang_with_child(sleep_arg: str) -> str:
    """train.py that starts `sleep <sleep_arg>` and waits on it: a run whose end must kill it."""
    return tiny_train_py(BIAS=0.5).replace(
        "out = Path(", f"import subprocess\nsubprocess.run(['sleep', '{sleep_arg}'])\nout = Path(", 1)


def test_stop_cancels_the_call_and_the_cancellation_is_raised_in_the_running_code(autorl_repo, tmp_path,
                                                                                   restore_signals):
    sleep_arg = unique_sleep()
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": hang_with_child(sleep_arg),
                                                    "DESCRIPTION": "hangs"}})
    fake = FakeModal(tmp_path / "modal")
    run_dir = repo / "results" / "cloud"

    def stop_when_exp_1_runs():
        import psutil

        deadline = time.time() + 120
        while time.time() < deadline:
            state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").exists() else {}
            for record in state.get("in_flight") or []:
                # train.py is under way in its container: its child runs (a container's own start-up, on
                # a loaded machine seconds of imports, is not what this test cancels)
                if record["exp"] == 1 and any(h.get("state") == "running" for h in record["handles"]) and any(
                        p.info["cmdline"] == ["sleep", sleep_arg] for p in psutil.process_iter(["cmdline"])):
                    (run_dir / "STOP").write_text("test\n")
                    return
            time.sleep(0.1)
    threading.Thread(target=stop_when_exp_1_runs, daemon=True).start()
    assert start(options(repo, replay, fake, budget_s=120), replay_factory, environ={}) == 0

    assert read_results(repo, "cloud")["status"].tolist() == ["baseline", "baseline", "interrupted"]
    hung = fake.train.calls[-1]
    results = list(hung.dir.glob("result-*.json"))
    assert [json.loads(r.read_text()) for r in results] == [{"status": "terminated", "detail": "cancelled"}], \
        "InputCancellation reached train_experiment's code"
    with pytest.raises(Exception) as ended:
        hung.get(timeout=0)
    assert type(ended.value).__name__ == "RemoteError"  # a TERMINATED input, as Modal returns it
    wait_until_gone(sleep_arg, timeout_s=10)  # run_group killed what train.py started as the exception unwound


# ---------------------------------------------------------------- queue time is not the candidate's
@pytest.mark.slow
def test_a_queue_longer_than_budget_and_grace_does_not_time_the_candidate_out(one_runner):
    r = one_runner()
    run_limit = 2 + 10 + QUICK.answer_margin_s  # budget + grace + margin, counted from the start
    r.fake.train.plans = [Plan(queue_s=run_limit + 5)]
    seen: list[str] = []

    def watch_status():
        while not r.fake.train.calls or not (r.fake.train.calls[0].dir / "output.pkl").exists():
            try:
                seen.extend(line for record in r.in_flight() for line in modal_call_lines(record))
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
    watcher = threading.Thread(target=watch_status, daemon=True)
    watcher.start()
    m = r.measure()
    watcher.join(timeout=5)

    assert m.status is None and m.score == 500.0, m.note
    assert len(r.fake.train.calls) == 1, "waited on, not spawned again"
    assert any("waiting for a GPU (H100)" in line for line in seen), seen
    assert any(" running for " in line for line in seen), seen
    assert "waiting for a container" in r.slot.folder.train_log.read_text()  # the log says where the time went
    # billed: what ran, not the queue
    assert m.compute_usd < ComputePrices.load(None).cost(run_limit + 5, "H100", 8)


def test_a_preempted_input_restarts_and_scores(one_runner):
    r = one_runner(tiny_train_py(BIAS=0.0, SLEEP=3.0))
    r.fake.train.plans = [Plan(preempt_after_s=1.5, preemptions=1)]
    m = r.measure()
    assert m.status is None and m.score == 500.0, m.note
    state = json.loads((r.fake.train.calls[0].dir / "call.json").read_text())
    assert state["restarts"] == 1 and len(r.fake.train.calls) == 1  # Modal restarted it on the same input


def test_preempted_beyond_modals_restarts_is_spawned_again_and_scores(one_runner):
    r = one_runner(tiny_train_py(BIAS=0.0, SLEEP=3.0), max_restarts=1)
    r.fake.train.plans = [Plan(preempt_after_s=1.0, preemptions=5)]  # then an input that runs in peace
    m = r.measure()
    assert m.status is None and m.score == 500.0, m.note
    assert len(r.fake.train.calls) == 2
    with pytest.raises(Exception) as lost:
        r.fake.train.calls[0].get(timeout=0)
    assert type(lost.value).__name__ == "InternalFailure"
    assert "InternalFailure" in r.slot.folder.train_log.read_text()


@pytest.mark.parametrize("plan, reason", [
    (Plan(queue_s=NEVER), "never started: waited"),
    (Plan(output_ttl_s=0.0), "OutputExpiredError"),
])
def test_a_call_the_infrastructure_fails_every_time_is_recorded_as_not_the_candidates(one_runner, plan, reason):
    r = one_runner(policy=CallPolicy(queue_limit_s=2, tries=2, backoff_s=0.2, answer_margin_s=5, state_poll_s=0.2,
                                     poll_s=0.2))
    r.fake.train.plans = [plan, plan]
    m = r.measure()
    assert len(r.fake.train.calls) == 2 and not r.fake.evaluate.calls
    assert m.status == "interrupted" and m.score is None
    assert m.note.startswith("infrastructure: ") and reason in m.note and "(tried 2 times)" in m.note
    assert m.note.endswith("not your code")
    assert "says nothing about your code" in m.failure and "timed out" not in m.failure


def test_the_functions_own_timeout_is_the_infrastructures_and_the_candidates_own_kill_is_its_own(one_runner):
    r = one_runner(tiny_train_py(BIAS=0.0, SLEEP=120.0), train_timeout_s=1.0)
    m = r.measure()
    assert m.status == "interrupted" and "FunctionTimeoutError" in m.note, m.note
    r2 = one_runner(tiny_train_py(BIAS=0.0, SLEEP=120.0))
    m = r2.measure()
    # still training (asleep) at budget + allowance: it stretched its budget
    assert m.status == "invalid" and m.note == "trained >= 12 s of a 2 s budget, allowance 10 s", m.note


def test_scoring_is_billed_at_the_eval_containers_cores_and_a_wrong_harness_hash_is_invalid(one_runner,
                                                                                              monkeypatch):
    r = one_runner()
    monkeypatch.setenv("AUTORL_MODAL_EVAL_CPU", "2")
    m = r.measure()
    assert m.status is None and m.score == 500.0, m.note
    r.runner.harness_bytes = r.harness + b"\n# changed\n"   # the bytes sent no longer match the recorded hash
    outcome = r.runner.evaluate(r.slot, r.slot.folder.out / "policy.pt")
    assert outcome.tampered and "HarnessRefused" in outcome.error
    assert 0 < outcome.compute_usd <= outcome.wall_s / 3600 * 2 * 0.047  # 2 cores, no GPU, the queue not billed
    assert add_evaluation(Measurement(), outcome, r.slot.folder).status == "invalid"


# ---------------------------------------------------------------- the daemon dies with its app
def night_with_fake_modal(spec_path: str) -> None:
    """A daemon in this process (python -c ...), its experiments on a FakeModal over spec's root."""
    spec = json.loads(Path(spec_path).read_text())
    fake = FakeModal(Path(spec["modal_root"]))
    opts = options(Path(spec["repo"]), Path(spec["replay"]), fake, budget_s=spec["budget_s"],
                   limits=Limits(max_experiments=spec["max_experiments"]))
    sys.exit(start(opts, replay_factory, environ={}))


def test_resume_after_the_daemon_died_with_its_ephemeral_app(autorl_repo, tmp_path, restore_signals):
    """kill -9 of a local daemon: Modal stops its ephemeral app and terminates the call it ran;
    --resume records that experiment interrupted, and the night goes on in a new app."""
    sleep_arg = unique_sleep()
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": hang_with_child(sleep_arg),
                                                    "DESCRIPTION": "hangs"},
                                                2: {"candidate/train.py": tiny_train_py(BIAS=0.0),
                                                    "DESCRIPTION": "no bias"}})
    spec = tmp_path / "night.json"
    spec.write_text(json.dumps({"modal_root": str(tmp_path / "modal"), "repo": str(repo), "replay": str(replay),
                                "budget_s": 120, "max_experiments": 1}))
    code = "import sys; from tests.test_modal_runner import night_with_fake_modal as n; n(sys.argv[1])"
    daemon = subprocess.Popen([PYTHON, "-c", code, str(spec)], cwd=repo, env=daemon_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    run_dir = repo / "results" / "cloud"
    deadline = time.time() + 150
    running = None
    while running is None and time.time() < deadline and daemon.poll() is None:
        state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").exists() else {}
        running = next((h for r in state.get("in_flight") or [] if r["exp"] == 1 for h in r["handles"]
                        if h.get("state") == "running"), None)
        time.sleep(0.2)
    assert running, "exp 1 never ran on the fake Modal"
    time.sleep(1.0)
    os.kill(daemon.pid, signal.SIGKILL)  # the daemon alone: its containers are Modal's to end
    daemon.wait()

    wait_until_gone(sleep_arg, timeout_s=15)  # the app stopped: its container and what it ran are gone
    orphan = FakeCall(tmp_path / "modal", running["call_id"])
    assert orphan.get_call_graph()[0].status.name == "TERMINATED"
    text, _ = render_status(repo / "results", "cloud")
    assert "in flight when the daemon died" in text

    fake = FakeModal(tmp_path / "modal")  # the resumed daemon's own app
    resumed = options(repo, replay, fake, resume=True, budget_s=120, limits=Limits(max_experiments=2))
    assert start(resumed, replay_factory, environ={}) == 0
    rows = read_results(repo, "cloud")
    assert rows["status"].tolist() == ["baseline", "baseline", "interrupted", "keep"]
    assert "the daemon died during train" in rows["description"].iloc[2]
    confirmations = len(list((repo / "results" / "cloud" / "exp-0002").glob("confirm*")))
    assert rows["score"].iloc[3] == 500.0 and len(fake.train.calls) == 1 + confirmations and confirmations <= 1


# ---------------------------------------------------------------- the volume
def test_a_changed_container_verifies_each_passing_backend_again_under_the_name_verify_takes():
    """A translation file's verdict names the snapshot it was verified in: verified again as the commit's
    envs_fast/<file>. A built-in backend's is verified as itself: `envs_fast/mujoco_batch` is no file
    (verify exits 2), which cost a night its MuJoCo fast path after any container change."""
    from orchestrator.runners.modal.runner import reverify_specs

    records = [{"spec": "/runs/.snapshots/t/exp-0003-verify-1a2b3c/envs_fast/translations/cartpole_v1.py", "passed": True},
               {"spec": "envs_fast/translations/cartpole_v1.rs", "passed": True},
               {"spec": "mujoco_batch", "passed": True}, {"spec": "mjx", "passed": True},
               {"spec": "gymnax", "passed": True}, {"spec": "envpool", "passed": True},
               {"spec": "envs_fast/translations/acrobot_v1.py", "passed": False}, {"spec": "", "passed": True}, None]
    assert reverify_specs(records) == ["envpool", "envs_fast/translations/cartpole_v1.py", "envs_fast/translations/cartpole_v1.rs", "gymnax",
                                       "mjx", "mujoco_batch"]


def test_the_volume_shows_a_containers_files_only_after_commit_and_reload(tmp_path):
    volume = FakeVolume(tmp_path / "storage")
    writer, reader = volume.mount(tmp_path / "night"), volume.mount(tmp_path / "other")
    (writer.path / "t1").mkdir()
    (writer.path / "t1" / "results.tsv").write_text("exp\n1\n")
    with pytest.raises(FileNotFoundError):
        volume.listdir("t1")
    writer.commit()
    assert [e.path for e in volume.listdir("t1")] == ["t1/results.tsv"]
    assert not (reader.path / "t1").exists(), "a mounted container sees the commit only after reload()"
    reader.reload()
    assert (reader.path / "t1" / "results.tsv").read_text() == "exp\n1\n"


# ---------------------------------------------------------------- no Modal, prices
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
    prices = ComputePrices.load(None)
    assert prices.cost(3600, "H100!", 0) == pytest.approx(3.95)   # the pinned request bills as the type
    assert prices.cost(3600, "h100:2", 0) == pytest.approx(7.90)
    # a GPU the table has no rate for is refused, not billed at the H100 rate
    assert "--modal-price-table" in prices.missing("RTX-PRO-6000") and prices.missing("A100-80GB") is None
    with pytest.raises(ValueError, match="no price for the GPU 'RTX-PRO-6000'"):
        prices.cost(60, "RTX-PRO-6000", 8)


def test_runner_modal_on_a_gpu_without_a_price_fails_before_anything(autorl_repo, tmp_path):
    repo = autorl_repo(tiny_train_py())
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": "", "MODAL_CONFIG_PATH": str(home / "none")}
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "cloud", "--runner", "modal", "--modal-gpu",
                        "RTX-PRO-6000", "--max-experiments", "1", *FAST, env=env, timeout=60)
    assert result.returncode != 0 and "no price for the GPU 'RTX-PRO-6000'" in result.stderr, result.stderr
    assert "--modal-price-table" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (repo / "results" / "cloud").exists() and not (repo / "runs" / "cloud").exists()
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"RTX-PRO-6000": 3.0}))
    priced = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "cloud", "--runner", "modal", "--modal-gpu",
                        "RTX-PRO-6000", "--modal-price-table", str(table), "--max-experiments", "1", *FAST, env=env,
                        timeout=60)
    assert priced.returncode != 0 and "modal token new" in priced.stderr   # priced: on to the credentials


def test_pull_without_a_token_says_how_to_get_one(autorl_repo, tmp_path):
    repo = autorl_repo(tiny_train_py())
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": "", "MODAL_CONFIG_PATH": str(home / "none")}
    result = run_daemon(repo, "pull", "--tag", "cloud", env=env, timeout=60)
    assert result.returncode == 1 and "modal token new" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (repo / "results" / "cloud").exists()


def test_an_unpinned_gpu_request_gets_either_type_and_a_pinned_one_never(tmp_path):
    """The fake hands out hardware as Modal does: an "H100" request may run on an H200, "H100!" never;
    hosts of one GPU type have several CPU models. The functions ask for exactly the type named."""
    if not isolation():
        pytest.skip(NO_ISOLATION)
    fake = FakeModal(tmp_path / "modal")
    try:
        def machines(function) -> list[dict]:
            calls = [function.spawn(b"", "CartPole-v1", "environment", [], {}, 60.0) for _ in range(2)]
            return [call.get(timeout=120)["environment"]["machine"] for call in calls]

        unpinned = machines(fake.check.with_options(gpu="H100"))
        assert {m["gpus"] for m in unpinned} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
        assert fake.check.gpu == "H100!"   # as modal_functions declares it
        pinned = machines(fake.check)
        assert {m["gpus"] for m in pinned} == {"NVIDIA H100 80GB HBM3"} and len({m["cpu"] for m in pinned}) == 2
        assert len(fake.check.calls) == 4   # with_options shares the function's calls
    finally:
        fake.stop()


NETWORK_TRAIN_PY = """import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5)
    print("network: reached")
except OSError as exc:
    print("network: blocked:", exc)
"""


def test_a_candidate_container_has_no_network(one_runner):
    """train.py in its container cannot reach even a server on the daemon's machine (block_network)."""
    if not isolation():
        pytest.skip(NO_ISOLATION)
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        r = one_runner(NETWORK_TRAIN_PY.format(port=server.getsockname()[1]))
        r.measure()
        log = (r.folder.path / "exp-0001" / "train.log").read_text()
    assert "network: blocked" in log and "network: reached" not in log, log


def test_the_doctor_states_a_nights_hourly_cost_from_the_billing_table():
    line = ComputePrices.load(None).hourly_line("H100", 8, 4, 2)
    assert "$4.33 per hour of each training container (H100 with 8 cores" in line   # 3.95 + 8 x 0.047
    assert "$0.19 per hour of scoring (4 cores)" in line and "$0.09 per hour for the daemon's container" in line


def test_prices_count_every_gpu_of_a_container_and_ignore_the_case_of_its_name():
    prices = ComputePrices.load(None)
    assert prices.cost(3600, "H100:2", 0) == pytest.approx(2 * 3.95)
    assert prices.cost(3600, "a100-80gb", 0) == pytest.approx(2.50)  # not the H100 fallback
    assert prices.cost(3600, "l4", 2) == pytest.approx(0.80 + 2 * 0.047)
