"""What a `run` checks before anything is created: a wrong env id, a created env missing from the
start commit, a runner that cannot work (Modal's price, credentials, network, image), walls that
cannot be raised, a translation language without its compiler. Each refusal is a RunError with
one line that says what to do."""
from __future__ import annotations

from typing import Optional

from .config import Options, RunError
from .envfolder import env_folder
from .phases import translate_languages
from .sandbox import Sandbox, SandboxUnavailable, agent_walls_problem
from .workspace import Workspace


def check_created_env(options: Options, workspace: Workspace, from_ref: Optional[str] = None) -> None:
    """A created environment (`envs.<name>.env:Env`) must be in the commit the run starts from."""
    folder = env_folder(options.env_id)
    if folder is None:
        return
    if (options.runner or "local") == "modal":
        raise RunError(f"--runner modal cannot score a created environment ({folder}/) yet: run it locally")
    commit = workspace.start_commit(from_ref)
    if not workspace.has_path(commit, folder):
        name = folder.split("/", 1)[1]
        raise RunError(f"{folder}/ is not in commit {commit[:7]}: create it first (python -m orchestrator create "
                       f"--name {name} --describe TEXT) or commit it")


def check_env_id(env_id: str) -> None:
    if ":" in env_id:
        return  # `module:Env-v0` registers on import; the baseline run will tell
    import gymnasium

    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error:
        raise RunError(f"unknown environment {env_id!r}; closest registered ids: "
                       f"{', '.join(closest_env_ids(env_id)) or 'none'} (or module:Class for an env of your own)") from None


def closest_env_ids(env_id: str, n: int = 3) -> list[str]:
    """The registered gymnasium ids nearest to a mistyped one, case aside (`pendulum-v1`, `Pendulm-v1`)."""
    import difflib

    import gymnasium

    by_lower = {name.lower(): name for name in gymnasium.registry}
    return [by_lower[m] for m in difflib.get_close_matches(env_id.lower(), list(by_lower), n=n, cutoff=0.6)]


def check_runner(name: str, runner_options: Optional[dict] = None) -> None:
    """Before anything is created: a Modal runner needs a price for its GPU (it bills every call),
    credentials, a reachable Modal and the files its image is built from."""
    if name != "modal":
        return
    from .runners.modal.support import check_modal_reachable, modal_credentials_problem
    from .runners.modal.runner import ComputePrices
    from .runners.modal.functions import TRAIN_GPU, image_problem

    options = runner_options or {}
    try:
        price_problem = ComputePrices.load(options.get("price_table")).missing(options.get("gpu") or TRAIN_GPU)
    except ValueError as exc:
        price_problem = str(exc)
    problem = (price_problem or modal_credentials_problem() or check_modal_reachable(timeout_s=20)
               or image_problem())
    if problem:
        raise RunError(problem)


def check_sandbox(mode: str) -> None:
    """`--sandbox require` where bubblewrap cannot run: refuse before anything is created."""
    try:
        Sandbox(mode)
    except SandboxUnavailable as exc:
        raise RunError(f"{exc} (install bubblewrap, or run with --sandbox auto to go on without walls)") from None


def check_agent_walls(mode: str, agent_name: str) -> None:
    problem = agent_walls_problem(mode, agent_name)
    if problem:
        raise RunError(problem)


def check_translate_lang(choice: str) -> None:
    """`--translate-lang rust` without rustc: refuse before anything is created."""
    try:
        translate_languages(choice)
    except ValueError as exc:
        raise RunError(str(exc)) from None
