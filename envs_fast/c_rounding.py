"""Evaluate a JAX function with every float operation rounded on its own, as C rounds it.

A translation of a physics engine written in C or C++ (Box2D) is verified bit for bit against it; jitted
on XLA's CPU backend, the same arithmetic rounds otherwise (below), and an iterative solver carries that
last bit on until the trajectories part. `rounded_like_c(fn)` is fn with the same arguments and results,
traced to a jaxpr and evaluated with every rounding C would do kept apart (envs_fast/translations/bipedalwalker_v3.py
runs its step and reset through it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jax_core

__all__ = ["rounded_like_c"]

# XLA's CPU compiler tells LLVM to contract a multiply feeding an add into one fused multiply-add
# (TargetOptions.AllowFPOpFusion = Fast, "always allow FMA fusion", no flag turns it off; XLA_FLAGS
# --xla_cpu_max_isa=AVX only hides the FMA instructions, for the whole process). An FMA rounds a*b+c
# once where Box2D (and the Rust port) round twice, and the solver's 180 iterations carry that last bit
# on. XLA's algebraic simplifier also rewrites float arithmetic it can see through (measured over 1M
# float32 values, 35-55% of them change): (a - c1) - c2 into a - (c1 + c2) for constants, a / b into
# a * (1 / b) when b is a constant or a broadcast scalar, a / b / c into a / (b * c), a / (b / c) into
# a * c / b, a / sqrt(b) into a * rsqrt(b). So rounded_like_c sends every float product, quotient
# and square root, and every sum with a constant, through a select neither LLVM nor XLA can see through,
# and makes a divisor one value per element: each operation is rounded on its own, as in C.

_CALLS = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "checkpoint", "remat"}
_ROUNDED = {"mul", "square", "integer_pow", "div", "sqrt"}
_SUMS = {"add", "sub"}  # rounded when an operand is a constant (XLA folds constants across a chain of them)


def _rounded(x):
    """x, but not an operation's result as far as LLVM's and XLA's simplifiers can tell (NaN stays NaN)."""
    return lax.select(x == x, x, x + x)


def _eval_rounded(jaxpr, consts, *args, constant_args=None):
    """Evaluate a jaxpr with every float operation rounded on its own (above), inside loops, conds and
    calls too. A value is constant when it is a literal, a closed-over constant or made from them alone."""
    env = {}
    constant = set(jaxpr.constvars) | {v for v, c in zip(jaxpr.invars, constant_args or ()) if c}
    read = lambda v: v.val if isinstance(v, jax_core.Literal) else env[v]  # noqa: E731
    is_constant = lambda v: isinstance(v, jax_core.Literal) or v in constant  # noqa: E731
    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        constants = [is_constant(v) for v in eqn.invars]
        name = eqn.primitive.name
        is_float = bool(eqn.outvars) and jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.floating)
        if name in _CALLS:
            inner = next(eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in eqn.params)
            out = _eval_rounded(inner.jaxpr, inner.consts, *values, constant_args=constants)
        else:
            if name == "div" and is_float and not constants[0]:  # one divisor per element, never a broadcast
                numerator, divisor = values
                values = [numerator, jnp.where(numerator == numerator, divisor, numerator)]
            out = eqn.primitive.bind(*values, **{k: _rounding_param(v) for k, v in eqn.params.items()})
            out = out if eqn.primitive.multiple_results else [out]
            if is_float and (name in _ROUNDED or (name in _SUMS and any(constants))) and not all(constants):
                out = [_rounded(out[0])]
        if all(constants):
            constant.update(v for v in eqn.outvars if not isinstance(v, jax_core.DropVar))
        for v, x in zip(eqn.outvars, out):
            if not isinstance(v, jax_core.DropVar):
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _rounding_param(value):
    """A primitive's parameter with its sub-jaxprs (while body and cond, cond branches, scan body) rounding."""
    def rounding(closed):
        avals = [v.aval for v in closed.jaxpr.invars]
        return jax.make_jaxpr(lambda *a: _eval_rounded(closed.jaxpr, closed.consts, *a))(*avals)

    if isinstance(value, jax_core.ClosedJaxpr):
        return rounding(value)
    if isinstance(value, tuple) and value and all(isinstance(v, jax_core.ClosedJaxpr) for v in value):
        return tuple(rounding(v) for v in value)
    return value


def rounded_like_c(fn):
    """fn with every float operation rounded on its own (see above); same arguments and results."""
    def rounded(*args):
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        out = _eval_rounded(closed.jaxpr, closed.consts, *jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), out)
    return rounded
