"""On Modal the GPU trains end to end: setup verifies and benchmarks the shipped backends in a
container of the run's GPU type, every training call carries the run's verdicts, and a translation
kept during the night is the backend of the next training call. Against tests/fake_modal.py (its
containers are subprocesses of this machine, running the real Modal functions); no network."""
from __future__ import annotations

import json
import re
from argparse import Namespace

import git
import pytest

from orchestrator.config import Limits
from orchestrator.setup import start
from tests.conftest import AUTORL_ROOT, read_results, write_replay
from tests.fake_modal import FakeModal
from tests.test_modal_runner import modal_factory, options, replay_factory

BUDGET, ALLOWANCE = 15, 20   # seconds: train.py's imports count in its budget, so some must be left to train


def summary_value(train_log: str, key: str) -> str:
    return re.findall(rf"^{key}: (.*)$", train_log, re.MULTILINE)[-1]


def env_steps(run_dir, folder: str) -> int:
    return int(summary_value((run_dir / folder / "train.log").read_text(), "env_steps"))


@pytest.mark.long
@pytest.mark.slow
def test_a_modal_night_trains_on_the_verified_jax_path_and_uses_a_translation_it_keeps(autorl_repo, tmp_path,
                                                                                         restore_signals):
    # Night 1: the shipped checkout. Setup verifies its backends in containers; the baselines train
    # end to end on the shipped JAX translation, in the container.
    repo = autorl_repo(name="shipped")
    fake = FakeModal(tmp_path / "modal")
    (tmp_path / "no-replay").mkdir()
    night = options(repo, tmp_path / "no-replay", fake, tag="fast", budget_s=BUDGET, grace_s=ALLOWANCE,
                    limits=Limits(max_experiments=0))
    assert start(night, replay_factory, environ={}) == 0
    run_dir = repo / "results" / "fast"
    backend = json.loads((run_dir / "backend.json").read_text())
    assert backend["path"] == "jax-e2e" and backend["backend"].endswith("cartpole_v1.py"), backend
    environment = json.loads((run_dir / "modal-environment.json").read_text())
    assert environment["versions"]["jax"] and "machine" in environment   # what the containers run
    assert len(fake.check.calls) >= 2, "setup verified and benchmarked in containers"
    fast_steps = []
    for folder in ("exp-0000", "exp-0000/run-2"):
        log = (run_dir / folder / "train.log").read_text()
        assert summary_value(log, "path") == "jax-e2e", log[-2000:]
        fast_steps.append(env_steps(run_dir, folder))

    # Night 2: no translation shipped, nothing verified at setup: the baselines train on the host
    # path. A translate experiment writes the JAX translation; verified and benchmarked in
    # containers, it is kept, and the re-baseline and the next train experiment use it.
    bare = autorl_repo(name="bare")
    for name in ("cartpole_v1.py", "cartpole_v1.rs", "cartpole_v1_sync.py"):
        (bare / "envs_fast" / "translations" / name).unlink()
    git.Repo(bare).git.commit("-qam", "no CartPole translation")
    replay = write_replay(tmp_path / "replay", {
        1: {"envs_fast/translations/cartpole_v1.py": (AUTORL_ROOT / "envs_fast" / "translations" / "cartpole_v1.py").read_text(),
            "DESCRIPTION": "translate CartPole to JAX"},
        3: {"candidate/train.py": (bare / "candidate" / "train.py").read_text() + "\n# the next train experiment\n",
            "DESCRIPTION": "a train experiment after the translation"},
    })
    fake2 = FakeModal(tmp_path / "modal-2")
    night2 = options(bare, replay, fake2, tag="bare", budget_s=BUDGET, grace_s=ALLOWANCE, setup_verify=False,
                     bench_seconds=0.5, agent_args=Namespace(replay_dir=replay), runner_factory=modal_factory(fake2))
    assert start(night2, replay_factory, environ={}) == 0
    rows = read_results(bare, "bare")
    assert list(rows.phase) == ["train", "train", "translate", "train", "train"], rows
    assert list(rows.status)[:4] == ["baseline", "baseline", "keep", "baseline"], rows.description.tolist()
    run2 = bare / "results" / "bare"
    host_steps = []
    for folder in ("exp-0000", "exp-0000/run-2"):
        assert summary_value((run2 / folder / "train.log").read_text(), "path") == "jax-host"
        host_steps.append(env_steps(run2, folder))
    for exp in (2, 3):  # the re-baseline, then the next train experiment: the kept translation, end to end
        log = (run2 / f"exp-{exp:04d}" / "train.log").read_text()
        assert summary_value(log, "path") == "jax-e2e", log[-2000:]
        assert summary_value(log, "backend").endswith("envs_fast/translations/cartpole_v1.py")
    assert len(fake2.check.calls) >= 3   # verify, bench, the incumbent's bench: in containers
    # the fast path, measured in one test: >= 3x the jax-host path's env steps in the same budget. (The
    # one JAX learner steps envpool's CartPole from Python at ~40k steps/s on 2 cores; end to end it
    # trained 6.0x that in this test's first run, 1.03M steps against 171k: 3x leaves room for load.)
    assert max(host_steps) > 0, host_steps   # (a budget all spent on imports would compare nothing)
    assert min(fast_steps) >= 3 * max(host_steps), (fast_steps, host_steps)
    assert env_steps(run2, "exp-0002") >= 3 * max(host_steps), (env_steps(run2, "exp-0002"), host_steps)


@pytest.mark.long
def test_verdicts_made_where_the_containers_now_differ_are_verified_again_there(autorl_repo, tmp_path, caplog):
    """The image was rebuilt (other package versions) since the run's verdicts were made: the
    training container refuses them and says why, the daemon verifies them again in a container,
    and the call trains on the verified backend."""
    from envs_fast.cache import record_name
    from tests.test_modal_runner import OneRunner

    r = OneRunner(autorl_repo, tmp_path / "r", (AUTORL_ROOT / "candidate" / "train.py").read_text())
    try:
        environment = r.runner.environment()   # asked of a container
        assert (r.folder.path / "modal-environment.json").is_file() and environment["versions"]["jax"]
        older = {**environment, "versions": {**environment["versions"], "jax": "0.0.1"}}
        translation = r.runner.workspace.path / "envs_fast" / "translations" / "cartpole_v1.py"
        cache = r.folder.verify_cache
        cache.mkdir(parents=True, exist_ok=True)
        (cache / record_name("verdict", str(translation), "CartPole-v1", older)).write_text(json.dumps(
            {"spec": str(translation), "env_id": "CartPole-v1", "levels": [1, 2, 3], "passed": True,
             "summary": "verified L1-L3 in an older image"}))
        (r.folder.path / "modal-environment.json").write_text(json.dumps(older))
        r.runner._environment = older
        r.runner.settings.config.budget_s, r.runner.settings.config.grace_s = BUDGET, ALLOWANCE
        m = r.measure()
        assert "the run's verdicts were made where jax 0.0.1 ->" in caplog.text and "again in a container" in caplog.text
        assert [c.dir.name for c in r.fake.train.calls][:1] and len(r.fake.train.calls) == 2   # refused, then trained
        assert summary_value((r.folder.path / "exp-0001" / "train.log").read_text(), "path") == "jax-e2e", m
        assert json.loads((r.folder.path / "modal-environment.json").read_text())["versions"]["jax"] != "0.0.1"
    finally:
        r.runner.close()


@pytest.mark.long
def test_a_run_whose_envs_fast_is_not_the_images_still_trains_on_what_it_verifies(autorl_repo, tmp_path):
    """The image carries the daemon checkout's envs_fast; a night --from an older ref, or from a checkout
    edited since the image was built, runs another. The containers key their records by the commit's
    envs_fast and the daemon names them so: the verdict merges into the run's cache and training takes
    the fast path (named by the image's, nothing merged and training silently took the host path)."""
    from envs_fast.cache import source_hashes
    from orchestrator.results import ExpFolder
    from orchestrator.runners.base import Slot
    from tests.test_modal_runner import OneRunner

    stats = (AUTORL_ROOT / "envs_fast" / "verify" / "stats.py").read_text() + "\n# edited after the image was built\n"
    r = OneRunner(autorl_repo, tmp_path / "r", (AUTORL_ROOT / "candidate" / "train.py").read_text(),
                  files={"envs_fast/verify/stats.py": stats})
    try:
        run_envs_fast = source_hashes(r.runner.workspace.path / "envs_fast")
        assert run_envs_fast != source_hashes()   # the fake's containers import this checkout's, as an image would
        setup = Slot(0, ExpFolder(r.folder.path / "setup"), "setup")
        assert r.runner.environment(setup)["envs_fast"] == run_envs_fast
        outcome = r.runner.verify(setup, r.commit, "envs_fast/translations/cartpole_v1.py", 1)
        assert outcome.passed, outcome.report[-2000:]
        merged = [json.loads(p.read_text()) for p in r.folder.verify_cache.glob("verdict-*.json")]
        assert [v["passed"] for v in merged if v["spec"].endswith("cartpole_v1.py")] == [True], merged
        r.runner.settings.config.budget_s, r.runner.settings.config.grace_s = BUDGET, ALLOWANCE
        m = r.measure()
        log = (r.folder.path / "exp-0001" / "train.log").read_text()
        assert summary_value(log, "path") == "jax-e2e", (m, log[-2000:])
        assert len(r.fake.train.calls) == 1   # not refused as made elsewhere
    finally:
        r.runner.close()
