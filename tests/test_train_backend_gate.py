"""A backend trains only once this run verified it: envs_fast.make_vec_env and backend.load_functional
apply the gate themselves in a training run, and a BACKEND set by hand in train.py falls back to the
reference (and says why) when the run's verdict cache has no passing verdict for it."""
from __future__ import annotations

import gymnasium as gym
import pytest

import envs_fast
from envs_fast import cache
from envs_fast.backends.load import load_functional
from envs_fast.backends.jax_vector import JaxVectorEnv
from tests.train_helpers import TRANSLATIONS, edited_copy, run_train, store_passing_verdicts, summary

CARTPOLE = str(TRANSLATIONS["CartPole-v1"])


@pytest.fixture
def training_run(tmp_path, monkeypatch):
    """This process as a training run would see it: $AUTORL_OUTPUT_DIR set, an empty verdict cache of its own."""
    monkeypatch.setenv("AUTORL_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv(cache.CACHE_ENV_VAR, str(tmp_path / "verdicts"))
    return tmp_path / "verdicts"


def test_an_unverified_translation_is_not_trained_on(training_run, capfd):
    envs = envs_fast.make_vec_env("jax", "CartPole-v1", 2, seed=0)
    assert isinstance(envs, gym.vector.SyncVectorEnv)  # the reference, not the translation
    assert "has no verdict for CartPole-v1" in capfd.readouterr().err
    with pytest.raises(envs_fast.BackendError, match="not loaded for training: .* has no verdict"):
        load_functional(CARTPOLE, "CartPole-v1")


def test_a_verified_translation_is(training_run):
    store_passing_verdicts(training_run, ["CartPole-v1"])
    assert isinstance(envs_fast.make_vec_env("jax", "CartPole-v1", 2, seed=0), JaxVectorEnv)
    assert load_functional(CARTPOLE, "CartPole-v1").name == CARTPOLE


def test_a_failed_verdict_refuses_even_envpool(training_run):
    assert envs_fast.training_refusal("envpool", "CartPole-v1") is None  # trusted without a verdict
    cache.store_verdict("envpool", "CartPole-v1", [1, 2], False, "L2 failed: rewards differ")
    assert "failed verification for CartPole-v1: L2 failed" in envs_fast.training_refusal("envpool", "CartPole-v1")
    cache.store_verdict(CARTPOLE, "CartPole-v1", [1, 2], False, "L1 failed")
    assert isinstance(envs_fast.make_vec_env(CARTPOLE, "CartPole-v1", 2, seed=0), gym.vector.SyncVectorEnv)


def test_outside_a_training_run_verify_and_bench_load_what_they_measure(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTORL_OUTPUT_DIR", raising=False)
    monkeypatch.setenv(cache.CACHE_ENV_VAR, str(tmp_path / "verdicts"))
    assert isinstance(envs_fast.make_vec_env("jax", "CartPole-v1", 2, seed=0), JaxVectorEnv)
    monkeypatch.setenv("AUTORL_OUTPUT_DIR", str(tmp_path / "out"))  # and with it set, when they say so
    assert isinstance(envs_fast.make_vec_env("jax", "CartPole-v1", 2, seed=0, verified_only=False), JaxVectorEnv)


def test_a_backend_set_by_hand_trains_on_the_reference_until_verified(tmp_path):
    root = edited_copy(tmp_path / "repo", {'BACKEND = "auto"  #': 'BACKEND = "jax"  #'})
    # 20 s as test_train's jax-host runs: at 6 s a loaded CI machine spent it all on imports, training 0 steps
    proc, _ = run_train("CartPole-v1", 20, tmp_path / "out", tmp_path / "empty-cache", root=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = summary(proc.stdout)
    assert stats["backend"] == "reference" and stats["path"] == "jax-host"
    assert "BACKEND = 'jax' is not verified in this run" in stats["backend_reason"]
    assert "has no verdict for CartPole-v1" in stats["backend_reason"]
    assert int(stats["env_steps"]) > 0 and stats["export_check"].startswith("ok")
