"""policy_export: a JAX policy becomes the harness's TorchScript artifact by running its jaxpr with
torch ops, so any network written in jax.numpy / jax.nn (or flax) acts, once exported and loaded as
the harness loads it, as it acted in training; what a policy may not do is refused by name."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evaluate
from policy_export import Unexportable, check_exportable, export_policy

RNG = np.random.default_rng(0)
W1 = RNG.normal(0, 0.5, size=(6, 32)).astype(np.float32)
W2 = RNG.normal(0, 0.5, size=(32, 3)).astype(np.float32)
MEAN, VAR = RNG.normal(size=6).astype(np.float32), (RNG.random(6) + 0.5).astype(np.float32)


def layer_norm(x):
    centred = x - x.mean(-1, keepdims=True)
    return centred * jax.lax.rsqrt((centred**2).mean(-1, keepdims=True) + 1e-5)


def box_policy(obs):
    """Observations [B, 2, 3] normalised and clipped, then an MLP through most of jax.nn's activations."""
    x = jnp.clip((obs.reshape(obs.shape[0], -1) - MEAN) / jnp.sqrt(VAR + 1e-8), -10.0, 10.0)
    h = layer_norm(jnp.tanh(x @ W1))
    h = jax.nn.gelu(h) + jax.nn.relu(h) + jax.nn.softplus(h) + jax.nn.silu(h) + jax.nn.elu(h) + jax.nn.sigmoid(h)
    h = jnp.concatenate([h[:, :16], jax.nn.leaky_relu(h[:, 16:])], axis=-1)  # jnp indexing: gathers
    h = h + h[:, ::2].sum(-1, keepdims=True) - h[:, 3][:, None]
    return jnp.where(h.sum(-1, keepdims=True) > 0, h, -h) @ W2


def discrete_policy(obs):
    """Discrete observations [B] one-hot encoded, the action the argmax of the logits."""
    x = jax.nn.one_hot(obs.astype(jnp.int32), 6)
    return jnp.argmax(jax.nn.log_softmax(jnp.tanh(x @ W1) @ W2), axis=-1)


def exported(tmp_path, policy, example):
    path = tmp_path / "policy.pt"
    export_policy(policy, example, path)
    return evaluate.load_policy(path)  # as the harness loads it: the op allow-list holds the graph


def test_a_continuous_policy_acts_as_it_trained_at_every_batch_size(tmp_path):
    loaded = exported(tmp_path, box_policy, RNG.normal(size=(2, 2, 3)).astype(np.float32))
    for batch in (1, 3, 50):
        obs = RNG.normal(size=(batch, 2, 3)).astype(np.float32)
        actions = np.asarray(loaded(obs), np.float64)
        assert actions.shape == (batch, 3)
        np.testing.assert_allclose(actions, np.asarray(jax.jit(box_policy)(obs)), atol=1e-5, rtol=1e-5)


def test_a_discrete_policy_picks_the_same_actions(tmp_path):
    loaded = exported(tmp_path, discrete_policy, np.array([0, 5]))
    obs = RNG.integers(0, 6, size=40)
    actions = np.asarray(loaded(obs.astype(np.float32)))  # the harness feeds Discrete observations as floats
    assert actions.shape == (40,) and actions.dtype.kind in "iu"
    np.testing.assert_array_equal(actions, np.asarray(discrete_policy(jnp.asarray(obs))))


def test_a_flax_network_exports_as_it_computes(tmp_path):
    nn = pytest.importorskip("flax.linen", reason="flax (gymnax's dependency) is not installed")

    class Actor(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.LayerNorm()(nn.relu(nn.Dense(16)(x)))
            return nn.Dense(2)(nn.tanh(nn.Dense(16)(x)))

    params = Actor().init(jax.random.key(1), jnp.zeros((1, 4)))
    policy = lambda obs: Actor().apply(params, obs)  # noqa: E731
    loaded = exported(tmp_path, policy, np.zeros((2, 4), np.float32))
    obs = RNG.normal(size=(7, 4)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(loaded(obs), np.float64), np.asarray(policy(obs)), atol=1e-5)


@pytest.mark.parametrize("policy, refusal", [
    (lambda obs: jax.pure_callback(lambda x: x, jax.ShapeDtypeStruct(obs.shape, obs.dtype), obs),
     "calls pure_callback: it calls back to the host: a policy may not do I/O"),
    (lambda obs: (jax.debug.print("{}", obs), obs)[1], "calls debug_print: it prints: a policy may not do I/O"),
    (lambda obs: obs + jax.random.normal(jax.random.key(0), obs.shape), "a policy's actions are deterministic"),
    (lambda obs: jnp.sort(obs, axis=-1), "uses the JAX primitive sort, which the TorchScript export does not"),
    (lambda obs: (obs, obs), "returns 2 arrays; it must return one action batch"),
    (lambda obs: jnp.take_along_axis(obs, jnp.argmax(obs, -1, keepdims=True), -1), "indexes with positions computed from the observation"),
])
def test_what_a_policy_may_not_do_is_refused_by_name_and_nothing_is_written(tmp_path, policy, refusal):
    example = np.zeros((2, 4), np.float32)
    with pytest.raises(Unexportable, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        check_exportable(policy, example)
    with pytest.raises(Unexportable):
        export_policy(policy, example, tmp_path / "policy.pt")
    assert not (tmp_path / "policy.pt").exists()
