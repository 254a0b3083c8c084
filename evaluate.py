"""The FIXED evaluation harness of autorl. Nobody edits this file during a run.

It owns the constants of the experiment, the reference environment factories, the loading of
an exported policy artifact (without importing any candidate code), and the evaluation that
produces the score. The daemon runs a hashed copy of this file in a fresh process:

    python evaluate.py --policy PATH [--env ENV_ID] [--episodes N] [--seed S] [--out FILE.json]

The last line of stdout (and --out) is one JSON object: mean, std, se, iqm, min, max,
episodes, returns, lengths, ... It exits non-zero with a one-line reason on a missing or
unreadable artifact, a wrong output shape, NaN actions or an unknown env id.

`module:Class` ids (a created environment, `envs.<name>.env:Env`) are imported from the repository
root: $AUTORL_ENV_ROOT when the daemon names one (the commit's snapshot), else the directory
holding this file. With $AUTORL_ENV_SHA256 set, the env's folder must still have that content
hash (the environment is frozen during a search), else it exits 3 with one line saying so; each
evaluation process checks it again once it has imported the env.

A policy is pure computation. Before the artifact is ever called, every op of its graph is held to
ALLOWED_POLICY_OPS (pure tensor ops); an artifact that would run anything else (file I/O, printing,
code at load) is refused: it exits 4 with one line naming the op.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import operator
import os
import pickle
import re
import sys
import time
import warnings
import zipfile
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Sequence

import gymnasium as gym
import numpy as np

# ---------------------------------------------------------------- the experiment's constants
TIME_BUDGET = float(os.environ.get("AUTORL_TIME_BUDGET", 720))  # seconds of training
if TIME_BUDGET.is_integer():
    TIME_BUDGET = int(TIME_BUDGET)
ENV_ID = os.environ.get("AUTORL_ENV_ID", "BipedalWalker-v3")
NUM_EVAL_EPISODES = 100
# An env registered without a time limit is capped here, so an episode that never ends cannot
# hang an evaluation or a training run.
MAX_EPISODE_STEPS = 10_000

POLICY_SUFFIXES = (".pt", ".pt2")
ENV_ROOT_VARIABLE = "AUTORL_ENV_ROOT"      # where `module:Class` ids are imported from
ENV_SHA256_VARIABLE = "AUTORL_ENV_SHA256"  # the frozen content hash of that module's folder
ENV_CHANGED_EXIT = 3
POLICY_REFUSED_EXIT = 4


class HarnessError(Exception):
    """A bad artifact, env id or policy output: the message is the one-line reason."""


class EnvChanged(HarnessError):
    """The env's folder is not the one the run started with."""


class PolicyRefused(HarnessError):
    """The artifact would run something other than pure tensor computation: refused before it runs."""


# ---------------------------------------------------------------- environments
def _check_supported_spaces(env: gym.Env, env_id: str) -> None:
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise HarnessError(f"{env_id}: observation space {obs_space} is not Box or Discrete")
    if not isinstance(act_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise HarnessError(f"{env_id}: action space {act_space} is not Box or Discrete")


def make_env(env_id: str = ENV_ID, seed: int | None = None) -> gym.Env:
    """The reference gymnasium env, its episodes capped at MAX_EPISODE_STEPS if unlimited.

    `module:EnvName-v0` ids import `module` first (gymnasium's own syntax), `module:Class` ids
    make that gymnasium.Env subclass; the module is imported from `repository_root()`."""
    try:
        env = gym.make(_make_argument(env_id))
    except (gym.error.Error, ModuleNotFoundError, ImportError) as exc:
        raise HarnessError(f"unknown env id {env_id!r}: {exc}") from None
    if env.spec is None or env.spec.max_episode_steps is None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=MAX_EPISODE_STEPS)
    _check_supported_spaces(env, env_id)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def repository_root() -> Path:
    """Where `module:...` ids are imported from: the root the daemon names, else this file's directory."""
    return Path(os.environ.get(ENV_ROOT_VARIABLE) or Path(__file__).resolve().parent)


def _make_argument(env_id: str):
    """What gym.make gets: the id, or for `module:Class` (a class, not a registered id) a spec of it."""
    if ":" not in env_id:
        return env_id
    root = str(repository_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    module_name, _, attribute = env_id.partition(":")
    candidate = getattr(importlib.import_module(module_name), attribute, None)
    if isinstance(candidate, type) and issubclass(candidate, gym.Env):
        return gym.envs.registration.EnvSpec(id=env_id, entry_point=candidate)
    return env_id


def env_folder_sha256(folder: Path) -> str:
    """The content hash of an env folder (the same as orchestrator/envfolder.py's): sha256 over its
    files in sorted order of relative path, each as path, NUL, size, NUL, bytes; __pycache__ ignored."""
    digest = hashlib.sha256()
    files = sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob("*")
                   if p.is_file() and "__pycache__" not in p.relative_to(folder).parts)
    for relative, path in files:
        data = path.read_bytes()
        digest.update(f"{relative}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def check_env_frozen(env_id: str) -> None:
    """With $AUTORL_ENV_SHA256 set, refuse when the folder of `module:...`'s module changed."""
    expected = os.environ.get(ENV_SHA256_VARIABLE)
    if not expected:
        return
    package = env_id.partition(":")[0].split(".")[:-1]
    if ":" not in env_id or not package:
        raise HarnessError(f"{ENV_SHA256_VARIABLE} is set but {env_id!r} is not `package.module:Class`")
    folder = repository_root().joinpath(*package)
    actual = env_folder_sha256(folder) if folder.is_dir() else "(missing)"
    if actual != expected:
        raise EnvChanged(f"{'/'.join(package)}/ changed since the run started (sha256 {actual[:12]}, expected "
                         f"{expected[:12]}): the environment is frozen during a search")


def make_vec_env(env_id: str = ENV_ID, num_envs: int = 8, seed: int = 0, backend: str = "auto"):
    """A `gymnasium.vector.VectorEnv` over the fastest *verified* backend.

    backend: "auto" (`envs_fast.choose_backend`: the fastest of a verified envs_fast translation,
    verified gymnax and envpool, else gymnasium), "gymnasium", "envpool", or any envs_fast spec (a
    translation file, "jax", "gymnax"). Autoreset follows gymnasium's NEXT_STEP mode on every backend."""
    if backend == "auto":
        backend = _auto_backend(env_id, num_envs)
    if backend in ("gymnasium", "reference"):
        make_env(env_id)  # fail early and clearly on a bad id
        vec = gym.vector.SyncVectorEnv(
            [lambda: make_env(env_id) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
        vec.reset(seed=seed)
        vec.action_space.seed(seed)
        return vec
    import envs_fast  # envpool and the fast backends share one factory

    return envs_fast.make_vec_env(backend, env_id, num_envs, seed)


def _auto_backend(env_id: str, num_envs: int) -> str:
    """envs_fast's choice. The harness copy in a run folder has no envs_fast beside it: envpool
    where it has the env, else gymnasium."""
    try:
        from envs_fast import choose_backend
    except ImportError:
        return "envpool" if _envpool_supports(env_id) else "gymnasium"
    return choose_backend(env_id, num_envs)


def _envpool_supports(env_id: str) -> bool:
    try:
        from envs_fast.backends.envpool_backend import envpool_supports
    except ImportError:
        return False
    return envpool_supports(env_id)


# ---------------------------------------------------------------- what a policy may compute
# A policy maps observations to actions and nothing else. Every op of an artifact's graph must be in
# this explicit list, checked before the artifact is first called (names as TorchScript's node kinds
# and torch.export's op schemas spell them; the overload is not part of the name). Anything not listed
# is refused: file/process/network I/O, printing, custom classes and their methods, and calls left
# opaque after inlining. Random sampling is allowed: it reads nothing outside the process, and a
# uniformly random policy is the floor bench/random_policy.py scores with this harness.
ALLOWED_POLICY_OPS = frozenset({
    # TorchScript's own language: constants, attributes of the module, containers, control flow,
    # scalar arithmetic and the checks torch's own layers raise from. They touch nothing outside.
    "prim::Constant", "prim::GetAttr", "prim::If", "prim::Loop", "prim::ListConstruct", "prim::ListUnpack",
    "prim::TupleConstruct", "prim::TupleUnpack", "prim::TupleIndex", "prim::DictConstruct", "prim::NumToTensor",
    "prim::device", "prim::dtype", "prim::layout", "prim::unchecked_cast", "prim::RaiseException",
    "prim::Uninitialized", "prim::min", "prim::max", "prim::abs", "prim::type", "prim::is_nested",
    "prim::is_cuda", "prim::requires_grad", "prim::data", "aten::__getitem__", "aten::__is__", "aten::__isnot__",
    "aten::__not__", "aten::__contains__", "aten::__and__", "aten::__or__", "aten::__xor__", "aten::len",
    "aten::append", "aten::list", "aten::format", "aten::Int", "aten::Float", "aten::Bool", "aten::ScalarImplicit",
    "aten::IntImplicit", "aten::FloatImplicit", "aten::__range_length", "aten::__derive_index", "aten::floordiv",
    "aten::size", "aten::dim", "aten::numel", "aten::item", "aten::is_floating_point", "aten::is_grad_enabled",
    "aten::is_autocast_enabled", "aten::sym_size", "aten::sym_numel", "aten::_assert_scalar",
    "aten::_assert_tensor_metadata", "aten::sym_constrain_range_for_size",
    # aten::warn sits in dead branches of torch's own scripted layers (nn.Softmax's dim=None path,
    # MultiheadAttention): Policy.__call__ silences warnings, so it cannot write anything.
    "aten::warn",
    # elementwise math and comparisons: a function of the input tensors only
    "aten::add", "aten::sub", "aten::rsub", "aten::mul", "aten::div", "aten::true_divide", "aten::floor_divide",
    "aten::remainder", "aten::fmod", "aten::neg", "aten::abs", "aten::sign", "aten::sgn", "aten::exp", "aten::exp2",
    "aten::expm1", "aten::log", "aten::log1p", "aten::log2", "aten::log10", "aten::sqrt", "aten::rsqrt", "aten::pow",
    "aten::square", "aten::reciprocal", "aten::sin", "aten::cos", "aten::tan", "aten::asin", "aten::acos",
    "aten::atan", "aten::atan2", "aten::sinh", "aten::cosh", "aten::asinh", "aten::acosh", "aten::atanh",
    "aten::floor", "aten::ceil", "aten::round", "aten::trunc", "aten::frac", "aten::lerp", "aten::addcmul",
    "aten::addcdiv", "aten::hypot", "aten::erf", "aten::erfc", "aten::maximum", "aten::minimum", "aten::fmax",
    "aten::fmin", "aten::copysign", "aten::nan_to_num", "aten::clamp", "aten::clamp_min", "aten::clamp_max",
    "aten::clip", "aten::logaddexp", "aten::xlogy", "aten::bitwise_and", "aten::bitwise_or", "aten::bitwise_xor",
    "aten::bitwise_not", "aten::logical_and", "aten::logical_or", "aten::logical_xor", "aten::logical_not",
    "aten::isnan", "aten::isinf", "aten::isfinite", "aten::signbit", "aten::eq", "aten::ne", "aten::lt", "aten::le",
    "aten::gt", "aten::ge", "aten::equal", "aten::isclose", "aten::allclose", "aten::where", "aten::masked_fill",
    # in-place forms write only into tensors the graph already holds
    "aten::add_", "aten::sub_", "aten::mul_", "aten::div_", "aten::neg_", "aten::abs_", "aten::exp_", "aten::pow_",
    "aten::clamp_", "aten::clamp_min_", "aten::clamp_max_", "aten::masked_fill_", "aten::copy_", "aten::fill_",
    "aten::zero_", "aten::index_put_", "aten::relu_", "aten::tanh_", "aten::sigmoid_", "aten::silu_", "aten::elu_",
    "aten::leaky_relu_", "aten::hardtanh_", "aten::hardswish_", "aten::hardsigmoid_", "aten::mish_", "aten::gelu_",
    "aten::dropout_",
    # reductions, sorting and selection
    "aten::sum", "aten::mean", "aten::prod", "aten::max", "aten::min", "aten::amax", "aten::amin", "aten::aminmax",
    "aten::argmax", "aten::argmin", "aten::std", "aten::var", "aten::std_mean", "aten::var_mean", "aten::norm",
    "aten::linalg_vector_norm", "aten::logsumexp", "aten::cumsum", "aten::cumprod", "aten::all", "aten::any",
    "aten::median", "aten::topk", "aten::sort", "aten::argsort", "aten::count_nonzero",
    # shapes, views and indexing: rearrange values already in the graph
    "aten::view", "aten::reshape", "aten::flatten", "aten::unflatten", "aten::squeeze", "aten::unsqueeze",
    "aten::permute", "aten::transpose", "aten::t", "aten::contiguous", "aten::expand", "aten::expand_as",
    "aten::repeat", "aten::tile", "aten::cat", "aten::concat", "aten::concatenate", "aten::stack", "aten::hstack",
    "aten::vstack", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unsafe_chunk", "aten::unbind",
    "aten::select", "aten::slice", "aten::narrow", "aten::index", "aten::index_select", "aten::gather",
    "aten::take_along_dim", "aten::diagonal", "aten::diag", "aten::tril", "aten::triu", "aten::flip", "aten::roll",
    "aten::movedim", "aten::view_as", "aten::reshape_as", "aten::broadcast_to", "aten::broadcast_tensors",
    "aten::one_hot", "aten::embedding", "aten::pad", "aten::constant_pad_nd", "aten::clone", "aten::detach",
    "aten::alias", "aten::index_put", "aten::scatter", "aten::scatter_add", "aten::masked_select",
    # creation of new tensors from sizes and values (not from files, not random)
    "aten::zeros", "aten::ones", "aten::full", "aten::empty", "aten::zeros_like", "aten::ones_like",
    "aten::full_like", "aten::empty_like", "aten::arange", "aten::linspace", "aten::eye", "aten::tensor",
    "aten::scalar_tensor", "aten::as_tensor", "aten::new_zeros", "aten::new_ones", "aten::new_full",
    "aten::new_empty", "aten::new_tensor", "aten::lift_fresh_copy",
    # dtype and device conversions
    "aten::to", "aten::_to_copy", "aten::type_as", "aten::float", "aten::double", "aten::half", "aten::long",
    "aten::int", "aten::bool", "aten::cpu",
    # linear algebra
    "aten::linear", "aten::matmul", "aten::mm", "aten::bmm", "aten::addmm", "aten::addmv", "aten::mv",
    "aten::dot", "aten::einsum", "aten::baddbmm", "aten::outer", "aten::bilinear", "aten::tensordot",
    # activations
    "aten::relu", "aten::relu6", "aten::tanh", "aten::sigmoid", "aten::gelu", "aten::silu", "aten::softplus",
    "aten::elu", "aten::selu", "aten::celu", "aten::leaky_relu", "aten::hardtanh", "aten::hardsigmoid",
    "aten::hardswish", "aten::mish", "aten::log_sigmoid", "aten::prelu", "aten::glu", "aten::threshold",
    "aten::softmax", "aten::log_softmax", "aten::_softmax", "aten::_log_softmax",
    # normalization, dropout (the identity in eval mode), convolution, pooling, attention, RNN cells
    "aten::layer_norm", "aten::native_layer_norm", "aten::batch_norm", "aten::_native_batch_norm_legit_no_training",
    "aten::group_norm", "aten::instance_norm", "aten::rms_norm", "aten::dropout", "aten::feature_dropout",
    "aten::alpha_dropout", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
    "aten::_convolution", "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::max_pool1d",
    "aten::max_pool2d", "aten::max_pool3d", "aten::max_pool2d_with_indices", "aten::avg_pool1d", "aten::avg_pool2d",
    "aten::avg_pool3d", "aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::adaptive_max_pool1d",
    "aten::adaptive_max_pool2d", "aten::scaled_dot_product_attention", "aten::_native_multi_head_attention",
    "aten::gru_cell", "aten::lstm_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell", "aten::gru", "aten::lstm",
    # random sampling from torch's generator in this process (a stochastic policy; nothing is read)
    "aten::rand", "aten::randn", "aten::randint", "aten::rand_like", "aten::randn_like", "aten::randint_like",
    "aten::bernoulli", "aten::multinomial", "aten::normal", "aten::uniform_", "aten::normal_",
})
# Ops that reach outside the process: named so that the refusal says so.
POLICY_IO_OPS = frozenset({
    "aten::from_file", "aten::save", "aten::_print", "prim::Print", "debugprims::load_tensor", "prim::rpc_async",
    "prim::rpc_remote", "prim::rpc_sync",
})
# torch.export graphs also call a few Python functions on sizes (SymInts); these compute nothing else.
_PURE_PYTHON_TARGETS = {
    operator.getitem: "operator.getitem", operator.add: "operator.add", operator.sub: "operator.sub",
    operator.mul: "operator.mul", operator.floordiv: "operator.floordiv", operator.mod: "operator.mod",
    operator.truediv: "operator.truediv", operator.neg: "operator.neg", operator.eq: "operator.eq",
    operator.ne: "operator.ne", operator.lt: "operator.lt", operator.le: "operator.le", operator.gt: "operator.gt",
    operator.ge: "operator.ge",
}


def _refuse_op(artifact: str, op: str) -> None:
    if op not in ALLOWED_POLICY_OPS:
        if op in POLICY_IO_OPS:
            raise PolicyRefused(f"{artifact} calls {op}: a policy may not do I/O")
        raise PolicyRefused(f"{artifact} calls {op}: not a pure tensor op a policy may use")


def _check_torchscript_block(artifact: str, block) -> None:
    for node in block.nodes():
        _refuse_op(artifact, node.kind())
        for inner in node.blocks():  # the branches of prim::If, the body of prim::Loop
            _check_torchscript_block(artifact, inner)


def check_torchscript_policy(module, artifact: str = "policy.pt") -> None:
    """Every op forward can run: its graph with every method and function it calls inlined (a call left
    opaque, on an interface or a custom class, is itself refused), and the module's own forward hooks."""
    _check_torchscript_block(artifact, module.inlined_graph)
    for hook in [*module._c._get_forward_pre_hooks(), *module._c._get_forward_hooks()]:
        _check_torchscript_block(artifact, hook.inlined_graph)


def _export_op_name(target) -> str:
    schema = getattr(target, "_schema", None)  # an OpOverload: aten::linear, ...
    if schema is not None:
        return schema.name
    if target in _PURE_PYTHON_TARGETS:
        return _PURE_PYTHON_TARGETS[target]
    name = getattr(target, "__name__", None) or type(target).__name__
    return f"{getattr(target, '__module__', None) or type(target).__module__}.{name}"


def check_export_policy(module, artifact: str = "policy.pt2") -> None:
    """Every call_function of the graph module and of every graph nested in it (the branches of a
    torch.cond are graph modules too); a call of a module or a method is refused, whatever it is."""
    import torch

    pure_control_flow = {torch.ops.higher_order.cond, torch.ops.higher_order.while_loop}
    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            if node.op != "call_function":
                raise PolicyRefused(f"{artifact} calls {node.op} {node.target}: not a pure tensor op a policy may "
                                    "use")
            if node.target in _PURE_PYTHON_TARGETS or node.target in pure_control_flow:
                continue
            _refuse_op(artifact, _export_op_name(node.target))


def _refuse_code_run_at_load(path: Path) -> None:
    """A TorchScript archive whose code defines __setstate__ runs it inside torch.jit.load, before any
    graph could be checked: refused unread. The zip's every entry is read, duplicates included."""
    try:
        with zipfile.ZipFile(path) as archive:
            for entry in archive.infolist():
                if entry.filename.endswith(".py") and re.search(rb"\b__setstate__\b", archive.read(entry)):
                    raise PolicyRefused(f"{path.name} defines __setstate__, which runs as it loads: a policy may "
                                        "not run code when loaded")
    except (zipfile.BadZipFile, OSError, ValueError, RuntimeError) as exc:
        raise HarnessError(f"unreadable policy artifact {path}: {exc}") from None


@contextmanager
def _weights_only_unpickling(torch, artifact: str):
    """torch.export.load unpickles some payloads with plain pickle (pickle.loads, or torch.load with
    weights_only=False after a weights-only try failed), which runs whatever the pickle names: while it
    loads, every torch.load is the weights-only one and any other unpickling is refused."""
    refusal = f"{artifact} holds a pickled object that is not plain tensors: a policy may not run code when loaded"

    def weights_only_load(*args, **kwargs):
        kwargs["weights_only"] = True
        try:
            return real_torch_load(*args, **kwargs)
        except pickle.UnpicklingError:  # what weights_only raises for anything but tensors and containers
            raise PolicyRefused(refusal) from None

    def refuse(*args, **kwargs):
        raise PolicyRefused(refusal)

    real_torch_load, real_pickle_loads, real_pickle_load_obj = torch.load, pickle.loads, torch._C._pickle_load_obj
    torch.load, pickle.loads, torch._C._pickle_load_obj = weights_only_load, refuse, refuse
    try:
        yield
    finally:
        torch.load, pickle.loads, torch._C._pickle_load_obj = real_torch_load, real_pickle_loads, real_pickle_load_obj


# ---------------------------------------------------------------- the policy artifact
class Policy:
    """A loaded artifact: maps an observation batch to an action batch (numpy in, numpy out).

    TorchScript (`policy.pt`, torch.jit.save) or torch.export (`policy.pt2`). Neither format
    runs Python code from the candidate when loaded (what could, is refused), and its graph is held to
    ALLOWED_POLICY_OPS before it is first called: PolicyRefused names the first op that is not."""

    def __init__(self, path: str | os.PathLike):
        import torch

        self.path = Path(path)
        if not self.path.is_file():
            raise HarnessError(f"policy artifact not found: {self.path}")
        if self.path.suffix not in POLICY_SUFFIXES:
            raise HarnessError(f"policy artifact must be .pt (TorchScript) or .pt2 (torch.export): {self.path}")
        self._torch = torch
        exported = self.path.suffix == ".pt2"
        if not exported:
            _refuse_code_run_at_load(self.path)
        try:
            if exported:
                with _weights_only_unpickling(torch, self.path.name):
                    program = torch.export.load(str(self.path))
                try:  # no guard function: it would be code built from the archive's strings
                    self.module = program.module(check_guards=False)
                except TypeError:  # a torch that has no guard function
                    self.module = program.module()
            else:
                with warnings.catch_warnings():  # TorchScript is deprecated upstream, still our format
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self.module = torch.jit.load(str(self.path), map_location="cpu")
            if exported:
                check_export_policy(self.module, self.path.name)
            else:
                check_torchscript_policy(self.module, self.path.name)
        except PolicyRefused:
            raise
        except Exception as exc:  # torch raises many kinds for a corrupt archive
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise HarnessError(f"unreadable policy artifact {self.path}: {first_line}") from None
        if hasattr(self.module, "eval"):
            try:
                self.module.eval()
            except Exception:
                pass  # exported modules may refuse eval(); they carry no train-mode state

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        torch = self._torch
        # silenced: the only output a policy could make (aten::warn) goes nowhere
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = self.module(torch.as_tensor(np.asarray(obs), dtype=torch.float32))
            except Exception as exc:
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise HarnessError(f"policy failed on an observation batch of shape {obs.shape}: {first_line}") from None
        if not isinstance(out, torch.Tensor):
            raise HarnessError(f"policy must return one tensor, got {type(out).__name__}")
        return out.detach().cpu().numpy()


def load_policy(path: str | os.PathLike) -> Policy:
    return Policy(path)


def _observation_batch(observations: Sequence, obs_space: gym.Space) -> np.ndarray:
    if isinstance(obs_space, gym.spaces.Discrete):
        return np.asarray(observations, dtype=np.float32).reshape(-1)
    return np.stack([np.asarray(o, dtype=np.float32) for o in observations])


def _actions_from_output(out: np.ndarray, batch: int, act_space: gym.Space) -> np.ndarray:
    """Check the policy's output against the action space; clip Box actions to the bounds."""
    if isinstance(act_space, gym.spaces.Discrete):
        if out.shape != (batch,):
            raise HarnessError(f"policy output shape {out.shape}, expected ({batch},) discrete actions")
        if np.issubdtype(out.dtype, np.floating):
            if not np.all(np.isfinite(out)):
                raise HarnessError("policy returned NaN or infinite actions")
            if not np.all(out == np.round(out)):
                raise HarnessError("policy returned non-integer discrete actions")
        actions = out.astype(np.int64)
        low, high = act_space.start, act_space.start + act_space.n - 1
        if actions.min() < low or actions.max() > high:
            raise HarnessError(f"policy returned discrete actions outside [{low}, {high}]")
        return actions
    expected = (batch, *act_space.shape)
    if out.shape != expected:
        raise HarnessError(f"policy output shape {out.shape}, expected {expected}")
    if not np.all(np.isfinite(out)):
        raise HarnessError("policy returned NaN or infinite actions")
    return np.clip(out, act_space.low, act_space.high).astype(act_space.dtype)


# ---------------------------------------------------------------- evaluation
def _play_episodes(policy: Policy, env_id: str, episode_seeds: Sequence[int], parallel: int):
    """Plays one episode per seed, `parallel` envs stepped in lockstep with one policy call.

    Episode i always runs on its own env reset with episode_seeds[i]: results do not depend on
    how episodes are scheduled."""
    envs = [make_env(env_id) for _ in range(min(parallel, len(episode_seeds)))]
    check_env_frozen(env_id)  # what this process imported is the frozen env (a worker imports it anew)
    returns = np.zeros(len(episode_seeds), dtype=np.float64)
    lengths = np.zeros(len(episode_seeds), dtype=np.int64)
    next_episode = 0
    slots: list[int | None] = []  # episode index running in each env
    observations = []
    for env in envs:
        obs, _ = env.reset(seed=int(episode_seeds[next_episode]))
        slots.append(next_episode)
        observations.append(obs)
        next_episode += 1
    obs_space, act_space = envs[0].observation_space, envs[0].action_space
    while any(slot is not None for slot in slots):
        active = [i for i, slot in enumerate(slots) if slot is not None]
        batch = _observation_batch([observations[i] for i in active], obs_space)
        actions = _actions_from_output(policy(batch), len(active), act_space)
        for action, i in zip(actions, active):
            obs, reward, terminated, truncated, _ = envs[i].step(action)
            episode = slots[i]
            returns[episode] += float(reward)
            lengths[episode] += 1
            if terminated or truncated:
                if next_episode < len(episode_seeds):
                    obs, _ = envs[i].reset(seed=int(episode_seeds[next_episode]))
                    slots[i] = next_episode
                    next_episode += 1
                else:
                    slots[i] = None
            observations[i] = obs
    for env in envs:
        env.close()
    check_env_frozen(env_id)  # nor did it change while the episodes ran
    return returns, lengths


def _worker_play(args):
    policy_path, env_id, episode_seeds, parallel = args
    import torch

    torch.set_num_threads(1)
    try:
        return _play_episodes(load_policy(policy_path), env_id, episode_seeds, parallel)
    except HarnessError as exc:  # sent back as text: the class may not unpickle across processes
        return type(exc).__name__, str(exc)


def interquartile_mean(values: np.ndarray) -> float:
    from scipy.stats import trim_mean

    return float(trim_mean(values, 0.25))


def evaluate_policy(
    policy: Policy | str | os.PathLike,
    env_id: str = ENV_ID,
    episodes: int = NUM_EVAL_EPISODES,
    seeds: int | Sequence[int] = 0,
    workers: int | None = None,
) -> dict:
    """Plays `episodes` deterministic episodes on the reference env and summarises the returns.

    seeds: a base seed (episode i uses seed + i) or one seed per episode. workers: processes
    to spread episodes over (default: one per core, one when the artifact's path is unknown)."""
    if not isinstance(policy, Policy):
        policy = load_policy(policy)
    if isinstance(seeds, (int, np.integer)):
        episode_seeds = [int(seeds) + i for i in range(episodes)]
    else:
        episode_seeds = [int(s) for s in seeds][:episodes]
        if len(episode_seeds) < episodes:
            raise HarnessError(f"{episodes} episodes need {episodes} seeds, got {len(episode_seeds)}")
    if episodes < 1:
        raise HarnessError("episodes must be at least 1")
    env = make_env(env_id)  # refuses a bad id before any work
    # One batch of two observations checks the output shape before any episode is played.
    probe_obs = [env.observation_space.sample() for _ in range(2)]
    env.close()
    _actions_from_output(policy(_observation_batch(probe_obs, env.observation_space)), 2, env.action_space)

    if workers is None:
        workers = int(os.environ.get("AUTORL_EVAL_WORKERS", os.cpu_count() or 1))
    workers = max(1, min(workers, episodes))
    parallel = 16  # envs per worker stepped in lockstep: one policy call serves them all
    started = time.time()
    if workers == 1:
        returns, lengths = _play_episodes(policy, env_id, episode_seeds, parallel)
    else:
        # Contiguous shares keep each episode on its own seed whatever the worker count.
        shares = np.array_split(np.arange(episodes), workers)
        jobs = [(str(policy.path), env_id, [episode_seeds[i] for i in share], parallel) for share in shares]
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            parts = list(pool.map(_worker_play, jobs))
        for part in parts:
            if isinstance(part[0], str):  # (class name, message) of a worker's HarnessError
                error = {"EnvChanged": EnvChanged, "PolicyRefused": PolicyRefused}.get(part[0], HarnessError)
                raise error(part[1])
        returns = np.concatenate([p[0] for p in parts])
        lengths = np.concatenate([p[1] for p in parts])
    std = float(returns.std(ddof=1)) if episodes > 1 else 0.0
    return {
        "env_id": env_id,
        "policy": str(policy.path),
        "episodes": episodes,
        "seed": episode_seeds[0],
        "mean": float(returns.mean()),
        "std": std,
        "se": std / math.sqrt(episodes),
        "iqm": interquartile_mean(returns),
        "min": float(returns.min()),
        "max": float(returns.max()),
        "mean_length": float(lengths.mean()),
        "returns": [float(r) for r in returns],
        "lengths": [int(n) for n in lengths],
        "eval_seconds": round(time.time() - started, 3),
    }


# ---------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score an exported policy on the reference env.")
    parser.add_argument("--policy", required=True, help="policy.pt (TorchScript) or policy.pt2 (torch.export)")
    parser.add_argument("--env", default=ENV_ID, help=f"gymnasium env id (default {ENV_ID})")
    parser.add_argument("--episodes", type=int, default=NUM_EVAL_EPISODES)
    parser.add_argument("--seed", type=int, default=0, help="episode i is reset with seed + i")
    parser.add_argument("--out", help="also write the JSON result here")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    args = parser.parse_args(argv)
    # A batch of at most 16 observations gains nothing from intra-op threads, which only spin: one
    # thread per process, as in the workers (this process plays the episodes when --workers is 1).
    import torch

    torch.set_num_threads(1)
    try:
        check_env_frozen(args.env)
        result = evaluate_policy(args.policy, args.env, args.episodes, args.seed, workers=args.workers)
    except HarnessError as exc:
        print(f"evaluate.py: error: {exc}", file=sys.stderr)
        if isinstance(exc, EnvChanged):
            return ENV_CHANGED_EXIT
        return POLICY_REFUSED_EXIT if isinstance(exc, PolicyRefused) else 1
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(
        f"{args.env}: mean {result['mean']:.2f} ± {result['se']:.2f} (se) over {args.episodes} episodes, "
        f"iqm {result['iqm']:.2f}, min {result['min']:.2f}, max {result['max']:.2f}"
    )
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
