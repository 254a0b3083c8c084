"""A JAX policy exported as the harness's artifact, a TorchScript module (fixed: a train experiment
that edits this file is `invalid`, as one that edits evaluate.py).

`export_policy(policy, example_obs, path)` traces `policy` (raw observation batch -> deterministic
actions, weights and normalisation closed over) to a jaxpr with a symbolic batch size, runs that
jaxpr equation by equation with the torch op that computes the same thing, and lets torch.jit.trace
record those ops. So any network written with jax.numpy, jax.nn or flax exports as it trained,
within the primitives in TORCH_PRIMITIVES; no translation of layers, no second copy of the network.

Why a jaxpr interpreter rather than a `jax.export` artifact: the harness stays torch only, and its op
allow-list (evaluate.ALLOWED_POLICY_OPS) judges one kind of graph. What the policy may not do is
refused here, before training when train.py calls `check_exportable` first, in one line that names
the primitive: host callbacks (I/O), random numbers (a policy is deterministic), control flow and
gathers this interpreter does not translate.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

BATCH = "batch"  # the name of the symbolic batch dimension


class Unexportable(Exception):
    """The policy uses a primitive the export cannot compute in torch; the message names it."""


def _reduce_over(reduce):
    """A reduction over several axes, one axis at a time (torch's prod, all and any take one)."""
    def apply(x, axes):
        for axis in sorted(axes, reverse=True):
            x = reduce(x, axis)
        return x
    return apply


def _bool_or_bitwise(logical, bitwise):
    return lambda x, y: logical(x, y) if x.dtype == torch.bool else bitwise(x, y)


def _div(x, y):
    """lax.div: integer division rounds towards zero (C), float division is exact."""
    if x.dtype.is_floating_point:
        return torch.div(x, y)
    return torch.div(x, y, rounding_mode="trunc")


def _round(x, rounding_method):
    if int(rounding_method) == 1:  # TO_NEAREST_EVEN, as torch.round
        return torch.round(x)
    return torch.sign(x) * torch.floor(torch.abs(x) + 0.5)  # AWAY_FROM_ZERO, lax.round's default


def _select_n(which, *cases):
    if which.dtype == torch.bool:
        return torch.where(which, cases[1], cases[0]) if len(cases) == 2 else cases[0]
    out = cases[0]
    for index, case in enumerate(cases[1:], 1):
        out = torch.where(which == index, case, out)
    return out


def _dot_general(x, y, dimension_numbers):
    """lax.dot_general as one einsum: batch axes first, then x's free axes, then y's."""
    (x_contract, y_contract), (x_batch, y_batch) = dimension_numbers
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    x_axes, y_axes = [None] * x.dim(), [None] * y.dim()
    out = []
    for i, j in zip(x_batch, y_batch):
        x_axes[i] = y_axes[j] = next(letters)
        out.append(x_axes[i])
    for i, j in zip(x_contract, y_contract):
        x_axes[i] = y_axes[j] = next(letters)
    for axes in (x_axes, y_axes):
        for k, letter in enumerate(axes):
            if letter is None:
                axes[k] = next(letters)
                out.append(axes[k])
    return torch.einsum(f"{''.join(x_axes)},{''.join(y_axes)}->{''.join(out)}", x, y)


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "exp": torch.exp, "exp2": torch.exp2,
    "log": torch.log, "log1p": torch.log1p, "expm1": torch.expm1, "tanh": torch.tanh, "logistic": torch.sigmoid,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "square": torch.square, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "floor": torch.floor,
    "ceil": torch.ceil, "erf": torch.erf, "erfc": torch.erfc, "is_finite": torch.isfinite,
    "not": lambda x: torch.logical_not(x) if x.dtype == torch.bool else torch.bitwise_not(x),
    "copy": lambda x: x, "copy_p": lambda x: x, "optimization_barrier": lambda x: x, "stop_gradient": lambda x: x,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _div, "rem": torch.fmod,
    "max": torch.maximum, "min": torch.minimum, "pow": torch.pow, "atan2": torch.atan2,
    "and": _bool_or_bitwise(torch.logical_and, torch.bitwise_and),
    "or": _bool_or_bitwise(torch.logical_or, torch.bitwise_or),
    "xor": _bool_or_bitwise(torch.logical_xor, torch.bitwise_xor),
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}
REDUCTIONS = {
    "reduce_sum": lambda x, axes: torch.sum(x, dim=tuple(axes)) if axes else x,
    "reduce_max": lambda x, axes: torch.amax(x, dim=tuple(axes)) if axes else x,
    "reduce_min": lambda x, axes: torch.amin(x, dim=tuple(axes)) if axes else x,
    "reduce_prod": _reduce_over(torch.prod),
    "reduce_and": _reduce_over(lambda x, axis: torch.all(x, dim=axis)),
    "reduce_or": _reduce_over(lambda x, axis: torch.any(x, dim=axis)),
}
TORCH_DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
    "bool": torch.bool,
}
# What cannot be in a policy at all, and why (anything else untranslated is refused as unsupported)
FORBIDDEN = {
    "debug_callback": "calls back to the host: a policy may not do I/O",
    "pure_callback": "calls back to the host: a policy may not do I/O",
    "io_callback": "calls back to the host: a policy may not do I/O",
    "debug_print": "prints: a policy may not do I/O",
    "random_bits": "draws random numbers: a policy's actions are deterministic",
    "random_seed": "draws random numbers: a policy's actions are deterministic",
    "random_wrap": "draws random numbers: a policy's actions are deterministic",
    "threefry2x32": "draws random numbers: a policy's actions are deterministic",
}
CALLS = ("jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call")  # primitives that run a jaxpr
STRUCTURAL = ("gather", "convert_element_type", "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose",
              "dot_general", "argmax", "argmin", "iota", "concatenate", "slice", "split", "select_n", "clamp",
              "integer_pow", "round", "jit", "pjit", "closed_call", "custom_jvp_call", "custom_vjp_call")
TORCH_PRIMITIVES = frozenset(UNARY) | frozenset(BINARY) | frozenset(REDUCTIONS) | frozenset(STRUCTURAL)


def torch_dtype(dtype) -> torch.dtype:
    name = np.dtype(dtype).name
    if name not in TORCH_DTYPES:
        raise Unexportable(f"the policy computes in {name}, which the TorchScript export has no dtype for")
    return TORCH_DTYPES[name]


def _sub_jaxpr(eqn):
    """The closed jaxpr a call-like equation runs (jit, custom_jvp_call, custom_vjp_call)."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return eqn.params[key]
    raise Unexportable(f"the policy calls {eqn.primitive.name} without a jaxpr the export can read")


def check_primitives(closed_jaxpr, where: str = "policy", static_inputs=None) -> None:
    """Raises Unexportable naming the first primitive (in any nested jaxpr) the export cannot compute.
    `static_inputs`: which of the jaxpr's inputs are known at export (not computed from the
    observation); a gather (what jnp indexing becomes) is exported only at indices known at export."""
    from jax.extend.core import Literal

    jaxpr = closed_jaxpr.jaxpr
    static = set(jaxpr.constvars) | {var for var, known in zip(jaxpr.invars, static_inputs or []) if known}
    is_static = lambda atom: isinstance(atom, Literal) or atom in static  # noqa: E731
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in FORBIDDEN or "callback" in name:  # callbacks to come are as forbidden as these
            reason = FORBIDDEN.get(name, "calls back to the host: a policy may not do I/O")
            raise Unexportable(f"the {where} calls {name}: it {reason}")
        if name not in TORCH_PRIMITIVES:
            raise Unexportable(f"the {where} uses the JAX primitive {name}, which the TorchScript export does not "
                               "translate (policy_export.TORCH_PRIMITIVES lists those it does)")
        if name == "gather":
            _check_gather(eqn, is_static(eqn.invars[1]), where)
        if name in CALLS:
            check_primitives(_sub_jaxpr(eqn), where, [is_static(atom) for atom in eqn.invars])
        if all(is_static(atom) for atom in eqn.invars):
            static.update(eqn.outvars)


def _check_gather(eqn, indices_known: bool, where: str) -> None:
    """The gathers jnp indexing makes with indices known at export: a slice (one index vector), or a
    selection of single entries along one axis (`x[:, [0, 2]]`, `x[:, ::2]` over a symbolic batch)."""
    numbers = eqn.params["dimension_numbers"]
    indices = eqn.invars[1].aval
    if not indices_known:
        raise Unexportable(f"the {where} indexes with positions computed from the observation (gather); the "
                           f"export translates indexing at positions known when it exports")
    one_vector = indices.ndim == 1
    one_axis = (indices.ndim == 2 and indices.shape[-1] == 1 and tuple(numbers.collapsed_slice_dims)
                == tuple(numbers.start_index_map))
    if numbers.operand_batching_dims or not (one_vector or one_axis):
        raise Unexportable(f"the {where} indexes in a way (gather {numbers}) the export does not translate: slice "
                           f"with jax.lax.slice or select one axis's entries instead")


class JaxprPolicy(torch.nn.Module):
    """A closed jaxpr of a batch -> actions function, computed with torch ops. Its constants (the
    weights, the normalisation statistics) are buffers; the batch size is read from the input."""

    def __init__(self, closed_jaxpr, batch_symbol, input_dtype: torch.dtype):
        super().__init__()
        self.closed_jaxpr, self.batch_symbol, self.input_dtype = closed_jaxpr, batch_symbol, input_dtype
        self.constant_names = {}
        self._register_constants(closed_jaxpr)

    def _register_constants(self, closed_jaxpr):
        for var, value in zip(closed_jaxpr.jaxpr.constvars, closed_jaxpr.consts):
            name = f"constant_{len(self.constant_names)}"
            array = np.asarray(value)
            self.register_buffer(name, torch.from_numpy(array.copy()).to(torch_dtype(array.dtype)))
            self.constant_names[var] = name
        for eqn in closed_jaxpr.jaxpr.eqns:
            if eqn.primitive.name in CALLS:
                self._register_constants(_sub_jaxpr(eqn))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        batch = obs.shape[0]
        return self._run(self.closed_jaxpr, [obs.to(self.input_dtype)], batch)[0]

    def _size(self, dim, batch):
        """A dimension of the traced jaxpr: an int, or an expression of the symbolic batch size."""
        if isinstance(dim, int):
            return dim
        return dim._evaluate({str(self.batch_symbol): batch})

    def _shape(self, shape, batch):
        return [self._size(dim, batch) for dim in shape]

    def _gather(self, x, indices, params, batch):
        """The gathers _check_gather lets through: a slice, or entries along one axis."""
        numbers, sizes = params["dimension_numbers"], self._shape(params["slice_sizes"], batch)
        starts = _static_indices(indices)
        if indices.dim() == 1:  # one index vector: a slice of slice_sizes from these starts, collapsed axes dropped
            index = [slice(None)] * x.dim()
            for axis, start in zip(numbers.start_index_map, starts):
                start = min(max(int(start), 0), x.shape[axis] - sizes[axis])  # as XLA clamps a slice in bounds
                index[axis] = slice(start, start + sizes[axis])
            out = x[tuple(index)]
            return torch.squeeze(out, tuple(numbers.collapsed_slice_dims)) if numbers.collapsed_slice_dims else out
        (axis,) = numbers.start_index_map
        picked = torch.index_select(x, axis, torch.tensor([int(row[0]) for row in starts], dtype=torch.long))
        free = [position for position in range(x.dim()) if position not in numbers.offset_dims][0]
        return torch.movedim(picked, axis, free)

    def _run(self, closed_jaxpr, args, batch):
        from jax.extend.core import Literal

        jaxpr = closed_jaxpr.jaxpr
        values = {var: getattr(self, self.constant_names[var]) for var in jaxpr.constvars}
        values.update(zip(jaxpr.invars, args))

        def read(atom):
            if isinstance(atom, Literal):
                return torch.tensor(np.asarray(atom.val).item(), dtype=torch_dtype(atom.aval.dtype))
            return values[atom]

        for eqn in jaxpr.eqns:
            outs = self._apply(eqn, [read(atom) for atom in eqn.invars], batch)
            values.update(zip(eqn.outvars, outs))
        return [read(atom) for atom in jaxpr.outvars]

    def _apply(self, eqn, ins, batch):
        name, params = eqn.primitive.name, eqn.params
        if name in UNARY:
            return [UNARY[name](ins[0])]
        if name in BINARY:
            return [BINARY[name](ins[0], ins[1])]
        if name in REDUCTIONS:
            return [REDUCTIONS[name](ins[0], params["axes"])]
        if name in CALLS:
            sub = _sub_jaxpr(eqn)
            return self._run(sub, ins[: len(sub.jaxpr.invars)], batch)
        x = ins[0] if ins else None
        if name == "convert_element_type":
            return [x.to(torch_dtype(params["new_dtype"]))]
        if name == "broadcast_in_dim":
            shape, kept = self._shape(params["shape"], batch), params["broadcast_dimensions"]
            view = [1] * len(shape)
            for axis, size in zip(kept, x.shape):
                view[axis] = size
            return [x.reshape(view).expand(shape)]
        if name == "reshape":
            if params.get("dimensions"):
                x = x.permute(*params["dimensions"])
            return [x.reshape(self._shape(params["new_sizes"], batch))]
        if name == "squeeze":
            return [torch.squeeze(x, tuple(params["dimensions"]))] if params["dimensions"] else [x]
        if name == "expand_dims":
            for axis in sorted(params["dimensions"]):
                x = x.unsqueeze(axis)
            return [x]
        if name == "transpose":
            return [x.permute(*params["permutation"])]
        if name == "dot_general":
            out = _dot_general(x, ins[1], params["dimension_numbers"])
            wanted = params.get("preferred_element_type")
            return [out.to(torch_dtype(wanted)) if wanted is not None else out]
        if name in ("argmax", "argmin"):
            (axis,) = params["axes"]
            pick = torch.argmax if name == "argmax" else torch.argmin
            return [pick(x, dim=axis).to(torch_dtype(params["index_dtype"]))]
        if name == "iota":
            shape, axis = self._shape(params["shape"], batch), params["dimension"]
            view = [1] * len(shape)
            view[axis] = shape[axis]
            return [torch.arange(shape[axis]).reshape(view).expand(shape).to(torch_dtype(params["dtype"]))]
        if name == "concatenate":
            return [torch.cat(ins, dim=params["dimension"])]
        if name == "slice":
            strides = params["strides"] or (1,) * x.dim()
            index = tuple(slice(self._size(start, batch), self._size(limit, batch), stride) for start, limit, stride
                          in zip(params["start_indices"], params["limit_indices"], strides))
            return [x[index]]
        if name == "split":
            return list(torch.split(x, self._shape(params["sizes"], batch), dim=params["axis"]))
        if name == "gather":
            return [self._gather(x, ins[1], params, batch)]
        if name == "select_n":
            return [_select_n(*ins)]
        if name == "clamp":
            low, x, high = ins
            return [torch.minimum(torch.maximum(x, low), high)]
        if name == "integer_pow":
            return [torch.pow(x, params["y"])]
        if name == "round":
            return [_round(x, params["rounding_method"])]
        raise Unexportable(f"the policy uses the JAX primitive {name}, which the TorchScript export does not translate")


def _static_indices(indices: torch.Tensor) -> list:
    """Indices known at export (check_primitives saw to it) as Python ints: constants of the trace."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that a traced value becomes a constant: here it is one
        return indices.tolist()


def trace_policy(policy: Callable, example_obs: np.ndarray):
    """(closed jaxpr, batch symbol) of `policy` over a batch of any size shaped like `example_obs`."""
    import jax
    from jax import export as jax_export

    (batch,) = jax_export.symbolic_shape(BATCH)
    example = np.asarray(example_obs)
    spec = jax.ShapeDtypeStruct((batch,) + example.shape[1:], example.dtype)
    try:
        closed = jax.make_jaxpr(policy)(spec)
    except Exception as exc:  # e.g. a shape computed from the batch size with an op shape polymorphism refuses
        raise Unexportable(f"the policy cannot be traced over a batch of any size: {str(exc).splitlines()[0]}") \
            from exc
    if len(closed.jaxpr.outvars) != 1:
        raise Unexportable(f"the policy returns {len(closed.jaxpr.outvars)} arrays; it must return one action batch")
    return closed, batch


def check_exportable(policy: Callable, example_obs: np.ndarray) -> None:
    """Raises Unexportable, naming the primitive, for a policy the export would refuse: train.py calls
    this before training, so that a network the export cannot carry fails in its first second."""
    closed, _ = trace_policy(policy, example_obs)
    check_primitives(closed)


def export_policy(policy: Callable, example_obs: np.ndarray, path: Path) -> None:
    """Write `policy` (raw observations [B, *obs_shape] -> actions) as TorchScript at `path`. The
    harness feeds float32; the module converts to the observations' own dtype first."""
    closed, batch = trace_policy(policy, example_obs)
    check_primitives(closed)
    example = np.asarray(example_obs)
    module = JaxprPolicy(closed, batch, torch_dtype(closed.jaxpr.invars[0].aval.dtype)).eval()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # TorchScript is deprecated upstream but is the artifact format
        warnings.simplefilter("ignore")
        # traced: no source file is needed, so the export cannot break if train.py changes on disk; torch's
        # own trace check imports torch.distributed (a second), and export_check (train_plumbing) is stronger
        traced = torch.jit.trace(module, torch.as_tensor(example, dtype=torch.float32), check_trace=False)
        torch.jit.save(traced, str(path))
