"""Whether an environment's physics can be translated here at all.

A translation (JAX or Rust) reimplements the reference's step and must sync state with it. That is
possible for environments written in Python (classic control, toy text, `envs/<name>/` created ones),
not for ones that step a compiled physics engine with no port to translate to: MuJoCo has one (MJX)
only when `mujoco-mjx` is installed, and Box2D has none in general. A Box2D env for which this
checkout ships a port of its scene (BipedalWalker-v3: envs_fast/translations/bipedalwalker_v3.rs, Box2D 2.3's
solver translated) is translatable: translate experiments improve that port. The daemon asks this
before it schedules translate experiments for a code-writing agent. Decided by the env spec's entry
point module and the shipped files alone: nothing is instantiated. MuJoCo envs that
envs_fast/mujoco/batch.py covers have verifiable backends without any translation (`engine_backends`):
"mujoco_batch", the reference's own engine stepped in batches on CPU threads (mujoco >= 4.0), and "mjx",
the same env's Python over MJX, MuJoCo's JAX port (the mujoco-mjx package), which compiles for a GPU.
Setup verifies them and training may use them; the bench's train_sps decides between them on the
device training uses (on a CPU mujoco_batch wins).
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Optional

from envs_fast.protocol import translation_path

# entry point module prefix -> (engine, the importable port that makes it translatable, or None)
ENGINES = {
    "gymnasium.envs.box2d": ("Box2D", None),
    "gymnasium.envs.mujoco": ("MuJoCo", "mujoco.mjx"),
}


def entry_module(env_id: str) -> Optional[str]:
    """The module of the env's registered entry point ("gymnasium.envs.box2d.bipedal_walker"), or
    None for an unknown id or a callable entry point."""
    import gymnasium

    try:
        entry = gymnasium.spec(env_id).entry_point
    except Exception:  # gymnasium raises several error types for unknown or deprecated ids
        return None
    return entry.split(":", 1)[0] if isinstance(entry, str) else getattr(entry, "__module__", None)


def engine_of(env_id: str) -> Optional[str]:
    """The compiled physics engine `env_id` steps ("Box2D", "MuJoCo"), or None."""
    module = entry_module(env_id)
    for prefix, (engine, _) in ENGINES.items():
        if module is not None and (module == prefix or module.startswith(prefix + ".")):
            return engine
    return None


def shipped_port(env_id: str, root: Optional[Path] = None) -> Optional[Path]:
    """The translation of `env_id` shipped in `root`/envs_fast (default: this package), Rust first
    (the language an engine's scene is ported to), or None."""
    for lang in ("rust", "jax"):
        path = translation_path(env_id, root, lang)
        if path.is_file():
            return path
    return None


def engine_backends(env_id: str) -> list[str]:
    """The backends that run `env_id` on its reference's engine with the env's Python translated
    around it and state synced, so verified step by step like a translation (no agent writes them),
    for the MuJoCo v5 envs envs_fast/mujoco/locomotion.py translates: "mujoco_batch" where mujoco.batch imports
    (mujoco >= 4.0), "mjx" where mujoco.mjx does (the mujoco-mjx package). Empty for other envs."""
    if engine_of(env_id) != "MuJoCo":
        return []
    from envs_fast.mujoco.locomotion import supports

    if not supports(env_id):
        return []
    return [spec for spec, module in (("mujoco_batch", "mujoco.batch"), ("mjx", "mujoco.mjx")) if _importable(module)]


def engine_backend(env_id: str) -> Optional[str]:
    """The CPU one of `engine_backends` ("mujoco_batch"), or None: what trains where no GPU is."""
    return "mujoco_batch" if "mujoco_batch" in engine_backends(env_id) else None


def no_port_reason(env_id: str, root: Optional[Path] = None) -> Optional[str]:
    """Why no translation of `env_id` can pass verification here (one sentence), or None when its
    physics is plain Python (or unknown: then translating is worth a try) or ported in `root`."""
    module = entry_module(env_id)
    if module is None:
        return None
    for prefix, (engine, port) in ENGINES.items():
        if module == prefix or module.startswith(prefix + "."):
            if port is None:
                shipped = shipped_port(env_id, root)
                if shipped is None:
                    return f"{env_id} steps the {engine} physics engine ({module}), which has no JAX or Rust port"
                if shipped.suffix == ".rs" and shutil.which("rustc") is None:
                    return (f"{env_id} steps the {engine} physics engine ({module}); its port "
                            f"envs_fast/translations/{shipped.name} is Rust and rustc is not on PATH (install it: rustup.rs)")
                return None
            if not _importable(port):
                batched = engine_backend(env_id)
                return (f"{env_id} steps the {engine} physics engine ({module}) and its port {port} is not "
                        f"installed (pip install {port.replace('.', '-')})"
                        + (f"; it trains on {batched} (the reference's engine batched) once verified" if batched else ""))
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
