"""The one JAX learner trains the network the agent writes, and the export carries it as it trained:
an edited network (ReLU, LayerNorm) trains on either path and passes export_check; an edit the export
cannot carry, or the learner cannot compile, is refused in one line before training."""
from __future__ import annotations

import torch

from tests.train_helpers import edited_copy, run_train, store_passing_verdicts, summary

TANH_LAYER = '        x = jnp.tanh(x @ layer["w"] + layer["b"])\n'


def test_an_agent_with_relu_trains_on_the_jax_path_and_its_export_checks(tmp_path):
    root = edited_copy(tmp_path / "repo", {TANH_LAYER: '        x = jax.nn.relu(x @ layer["w"] + layer["b"])\n'})
    cache_dir = store_passing_verdicts(tmp_path / "verdicts", ["CartPole-v1"])
    proc, _ = run_train("CartPole-v1", 12, tmp_path / "out", cache_dir, root=root)  # room for a loaded machine
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = summary(proc.stdout)
    assert stats["path"] == "jax-e2e" and int(stats["updates"]) > 0
    assert stats["export_check"].startswith("ok")  # the JAX network was the ReLU one the export holds
    graph = str(torch.jit.load(str(tmp_path / "out" / "policy.pt")).inlined_graph)
    assert "aten::maximum" in graph and "aten::tanh" not in graph


def test_a_layer_normalised_gelu_network_trains_from_the_host_and_its_export_checks(tmp_path):
    layer_norm = ('        x = x @ layer["w"] + layer["b"]\n'
                  '        x = (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)\n'
                  '        x = jax.nn.gelu(x, approximate=False)\n')
    root = edited_copy(tmp_path / "repo", {TANH_LAYER: layer_norm})
    proc, _ = run_train("Pendulum-v1", 20, tmp_path / "out", tmp_path / "empty-cache", root=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = summary(proc.stdout)
    assert stats["path"] == "jax-host" and int(stats["updates"]) > 0 and stats["export_check"].startswith("ok")
    graph = str(torch.jit.load(str(tmp_path / "out" / "policy.pt")).inlined_graph)
    assert "aten::rsqrt" in graph and "aten::erf" in graph  # the layer norm and the exact GELU, as trained


def refused(tmp_path, replacements):
    root = edited_copy(tmp_path / "repo", replacements)
    cache_dir = store_passing_verdicts(tmp_path / "verdicts", ["CartPole-v1"])
    proc, _ = run_train("CartPole-v1", 10, tmp_path / "out", cache_dir, root=root)
    assert proc.returncode != 0
    assert "compiled in" not in proc.stdout and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out" / "policy.pt").exists()
    return proc.stdout.strip().splitlines()[-1]


def test_a_network_the_export_cannot_carry_is_refused_in_one_line_before_training(tmp_path):
    last = refused(tmp_path, {TANH_LAYER: '        x = jnp.sort(jnp.tanh(x @ layer["w"] + layer["b"]), axis=-1)\n'})
    assert last.startswith("refused: the policy uses the JAX primitive sort, which the TorchScript export does not "
                           "translate"), last


def test_a_learner_jax_cannot_compile_is_refused_in_one_line_before_training(tmp_path):
    """An edit to the loss that breaks shapes: the policy exports, the update does not trace."""
    last = refused(tmp_path, {"            target = adv + old_value\n": "            target = adv + old_value[:7]\n"})
    assert last.startswith("refused: the learner does not compile: TypeError: "), last
