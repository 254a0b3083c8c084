"""The jax-e2e path trains the torch Agent it is given, or refuses it: every module it translates computes
what torch computes, an edited Agent (ReLU) trains faithfully and passes export_check, and a module or
an Agent method it cannot compute is refused in one line before anything is compiled."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.train_helpers import edited_copy, load_train, run_train, store_passing_verdicts, summary

TRANSLATABLE = [
    nn.Linear(5, 7), nn.Linear(5, 7, bias=False), nn.LayerNorm(5), nn.LayerNorm(5, elementwise_affine=False),
    nn.LayerNorm(5, bias=False), nn.Identity(), nn.Tanh(), nn.ReLU(), nn.LeakyReLU(0.2), nn.ELU(alpha=0.7),
    nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU(), nn.Sigmoid(), nn.Softplus(beta=2.0, threshold=3.0),
    nn.Softsign(), nn.Mish(), nn.Dropout(0.0), nn.Sequential(nn.Linear(5, 3), nn.Tanh()),
]


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    return load_train("CartPole-v1", 10, tmp_path_factory.mktemp("out"))


@pytest.mark.parametrize("module", TRANSLATABLE, ids=repr)
def test_every_translated_module_computes_what_torch_computes(train, module):
    import jax

    with torch.no_grad():  # LayerNorm's affine parameters start at 1 and 0: move them
        for param in module.parameters():
            param.add_(torch.randn_like(param))
    layers = train.jax_layers(nn.Sequential(module), "actor")
    params = [{key: param.detach().numpy().T if transposed else param.detach().numpy()
               for key, (param, transposed) in sources.items()} for sources, _ in layers]

    def apply(params, x):
        for (_, layer), q in zip(layers, params):
            x = layer(q, x)
        return x

    x = np.random.default_rng(0).normal(0.0, 3.0, (64, 5)).astype(np.float32)
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(jax.jit(apply)(params, x)), expected, rtol=1e-5, atol=1e-5)


class ScaledLinear(nn.Linear):  # a subclass may compute anything: not translated as a Linear
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("sequential, where", [
    (nn.Sequential(nn.Linear(4, 4), nn.PReLU()), "agent.actor[1] (PReLU"),
    (nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)), "agent.actor[1] (Dropout"),
    (nn.Sequential(nn.Sequential(nn.Linear(4, 4), ScaledLinear(4, 4))), "agent.actor[0][1] (ScaledLinear"),
    (nn.Linear(4, 4), "agent.actor is a Linear, not an nn.Sequential"),
])
def test_a_module_it_cannot_translate_is_named(train, sequential, where):
    with pytest.raises(train.Untranslatable, match=r"^(the jax-e2e path cannot translate )?" + where.replace("(", r"\(")
                       .replace("[", r"\[").replace("]", r"\]")):
        train.jax_layers(sequential, "actor")


@pytest.mark.parametrize("edit, env_id", [("tanh_mean", "Pendulum-v1"), ("scaled_value", "Pendulum-v1"),
                                          ("tempered_logits", "CartPole-v1")])
def test_an_agent_whose_methods_compute_something_else_is_refused(train, edit, env_id):
    class EditedAgent(train.Agent):
        def distribution(self, x):  # a squashed mean: the jax-e2e path would train the unsquashed one
            if edit == "tempered_logits":
                return torch.distributions.Categorical(logits=self.actor(x) / 1.5)
            if edit != "tanh_mean":
                return super().distribution(x)
            out = torch.tanh(self.actor(x))
            return torch.distributions.Normal(out, self.actor_logstd.expand_as(out).exp())

        def value(self, x):
            return 2 * super().value(x) if edit == "scaled_value" else super().value(x)

    problem = train.Problem(env_id)
    with pytest.raises(train.Untranslatable, match="is not computed as the jax-e2e path computes it"):
        train.check_agent_glue(EditedAgent(problem.obs_dim, problem.act_dim, problem.discrete), problem)
    train.check_agent_glue(train.Agent(problem.obs_dim, problem.act_dim, problem.discrete), problem)  # the shipped one


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
@pytest.mark.parametrize("hidden_size", [256, 2048])
def test_a_wide_shipped_agent_passes_the_glue_check(train, monkeypatch, env_id, hidden_size):
    """The check's inputs and unit weights make a wide layer's logits large, and log-softmax rounds
    at their size: HIDDEN_SIZE 256 on CartPole (inside its usual range) was refused at a fixed 1e-6."""
    monkeypatch.setattr(train, "HIDDEN_SIZE", hidden_size)
    problem = train.Problem(env_id)
    train.check_agent_glue(train.Agent(problem.obs_dim, problem.act_dim, problem.discrete), problem)


def test_an_agent_with_relu_trains_on_the_jax_path_and_its_export_checks(tmp_path):
    root = edited_copy(tmp_path / "repo", {"nn.Tanh()": "nn.ReLU()"})
    cache_dir = store_passing_verdicts(tmp_path / "verdicts", ["CartPole-v1"])
    proc, _ = run_train("CartPole-v1", 12, tmp_path / "out", cache_dir, root=root)  # room for a loaded machine
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = summary(proc.stdout)
    assert stats["path"] == "jax-e2e" and int(stats["updates"]) > 0
    assert stats["export_check"].startswith("ok")  # the JAX network was the ReLU one the export holds
    graph = str(torch.jit.load(str(tmp_path / "out" / "policy.pt")).inlined_graph)
    assert "aten::relu" in graph and "aten::tanh" not in graph


def test_an_untranslatable_module_is_refused_in_one_line_before_training(tmp_path):
    root = edited_copy(tmp_path / "repo", {"layer_init(nn.Linear(HIDDEN_SIZE, act_dim), std=0.01),":
                                           "layer_init(nn.Linear(HIDDEN_SIZE, act_dim), std=0.01), nn.PReLU(),"})
    cache_dir = store_passing_verdicts(tmp_path / "verdicts", ["CartPole-v1"])
    proc, _ = run_train("CartPole-v1", 10, tmp_path / "out", cache_dir, root=root)
    assert proc.returncode != 0
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("refused: the jax-e2e path cannot translate agent.actor[5] (PReLU"), last
    assert "compiled the update" not in proc.stdout and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "policy.pt").exists()
