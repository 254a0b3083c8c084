"""envs_fast.c_rounding: a jitted JAX function rounds every float operation on its own, as C does (the JAX
BipedalWalker port's step runs through it to equal Box2D and the Rust port bit for bit)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from envs_fast.c_rounding import rounded_like_c


def test_a_product_is_rounded_before_the_add():
    """XLA's CPU compiler fuses a*b - c*d into a fused multiply-add (one rounding); rounded_like_c rounds
    every product first, as Box2D does, also inside loops and under vmap (jax issue 18507's numbers)."""
    def determinant(a, b):
        return lax.fori_loop(0, 2, lambda i, total: total + (a * b - a * b), a * b - a * b)

    a, b = np.float32(2396747.0), np.float32(7.0)
    assert float(jax.jit(rounded_like_c(determinant))(a, b)) == 0.0
    batched = jax.jit(jax.vmap(rounded_like_c(determinant)))(np.full(3, a), np.full(3, b))
    np.testing.assert_array_equal(np.asarray(batched), np.zeros(3, np.float32))


def test_each_operation_is_rounded_as_c_rounds_it():
    """XLA's algebraic simplifier rewrites float arithmetic: (x - r) - r into x - 2r for a constant r (the
    position solver's separation minus both radii), x / 7 into x * (1/7), a / b / c into a / (b * c) and
    a / sqrt(b) into a * rsqrt(b). Each rounds otherwise than C for a third to a half of all values. A
    function run through rounded_like_c evaluates each operation as written, jitted, inside a loop and under vmap."""
    radius, seven = np.float32(0.01), np.float32(7.0)

    def written(x, y):
        def body(i, total):
            return total + ((x - radius) - radius) + x / seven + x / y / x + x / jnp.sqrt(y)
        return lax.fori_loop(0, 1, body, jnp.zeros_like(x))

    x = np.random.default_rng(0).uniform(0.1, 1.0, 4096).astype(np.float32)
    y = np.random.default_rng(1).uniform(0.1, 1.0, 4096).astype(np.float32)
    in_c = np.float32(0) + ((x - radius) - radius) + x / seven + (x / y) / x + x / np.sqrt(y)
    assert np.any(np.asarray(jax.jit(jax.vmap(written))(x, y)) != in_c)  # XLA still rewrites (else this test is moot)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(rounded_like_c(written)))(x, y)), in_c)
