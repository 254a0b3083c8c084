"""The checks a created environment `envs/<name>/` must pass before it is committed.

`check_env_folder(root, name) -> CheckReport`, one named check each (what a failure report shows):

- files: `<name>.py` (the domain), `env.py` (the gymnasium wrapper) and a non-empty `README.md`;
- stdlib imports: the domain module (and `tasks.py`) import nothing outside the standard library
  (read from the AST, before anything is run);
- protocol: the domain's names (NAME, DESCRIPTION, ACTIONS, OBSERVATION_SIZE, OBSERVATION_LOW/HIGH,
  REWARD_RANGE, MAX_STEPS, reset, legal_actions, step, observation, render) with sane values;
- tasks: `tasks.py`, when present, holds `TASKS: list[dict]` and each task starts an episode;
- env class: `Env` is a gymnasium.Env with Discrete(len(ACTIONS)) actions, the Box observation space
  the domain declares, `render_mode=None` accepted and the domain state in `Env.state`;
- gymnasium check_env: `gymnasium.utils.env_checker.check_env`;
- determinism: the same seed and the same actions give identical trajectories (two envs stepped in
  turn, so hidden shared randomness shows);
- random episodes, observations in space, rewards in range, episodes end, render: 1,000 episodes of
  random actions (uniform over the legal actions, one in ten uniform over all of them, so illegal
  moves are exercised) without an exception or a NaN, every observation inside its space, every
  reward inside REWARD_RANGE, every episode terminated or truncated within MAX_STEPS, `render`
  a string.

It runs the agent's code, so the create command runs it in a sandboxed process through a copy of
this file (`python envcheck.py --root R --name N --json OUT`): it imports only the standard
library, numpy and gymnasium.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import math
import random
import re
import sys
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

EPISODES = 1000
DETERMINISM_EPISODES = 20
ILLEGAL_SHARE = 0.1          # of random actions drawn over all actions rather than the legal ones
PROTOCOL_CONSTANTS = ("NAME", "DESCRIPTION", "ACTIONS", "OBSERVATION_SIZE", "OBSERVATION_LOW", "OBSERVATION_HIGH",
                      "REWARD_RANGE", "MAX_STEPS")
PROTOCOL_FUNCTIONS = ("reset", "legal_actions", "step", "observation", "render")
CHECK_NAMES = ("files", "stdlib imports", "protocol", "tasks", "env class", "gymnasium check_env", "determinism",
               "random episodes", "observations in space", "rewards in range", "episodes end", "render")


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""              # what was checked, or the first failure with its episode, step and state


@dataclass
class CheckReport:
    name: str                     # the environment's folder name
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, passed, detail))
        return passed

    def summary(self) -> str:
        if self.passed:
            return f"envs/{self.name}/: all {len(self.checks)} checks passed"
        return f"envs/{self.name}/: FAILED {', '.join(self.failed())}"

    def text(self) -> str:
        lines = [self.summary()]
        for c in self.checks:
            head, *rest = (c.detail or "").splitlines() or [""]
            lines.append(f"{'PASS' if c.passed else 'FAIL'}  {c.name}: {head}")
            lines += [f"      {line}" for line in rest]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, data: dict) -> "CheckReport":
        return cls(data["name"], [Check(**c) for c in data.get("checks", [])])


class _Failed(Exception):
    """A check failed; the message is its detail."""


def check_env_folder(root: Path, name: str, episodes: int = EPISODES) -> CheckReport:
    """Every check of `root/envs/<name>/`; a check whose prerequisites failed is reported as skipped."""
    report = CheckReport(name)
    folder = Path(root) / "envs" / name
    if not report.add("files", *_files(folder, name)):
        return _skip_rest(report)
    report.add("stdlib imports", *_stdlib_imports(folder, name))
    if str(Path(root).resolve()) not in sys.path:
        sys.path.insert(0, str(Path(root).resolve()))
    try:
        domain = importlib.import_module(f"envs.{name}.{name}")
    except BaseException:
        report.add("protocol", False, f"importing envs/{name}/{name}.py failed:\n{_traceback_tail()}")
        return _skip_rest(report)
    if not report.add("protocol", *_protocol(domain, name)):
        return _skip_rest(report)
    tasks = _run_check(report, "tasks", lambda: _tasks(folder, name, domain))
    env_class = _run_check(report, "env class", lambda: _env_class(name, domain))
    if env_class is None:
        return _skip_rest(report)
    _run_check(report, "gymnasium check_env", lambda: _gymnasium_check(env_class))
    _run_check(report, "determinism", lambda: _determinism(env_class, domain, tasks or []))
    _random_episodes(report, env_class, domain, tasks or [], episodes)
    return report


# ---------------------------------------------------------------- static checks
def _files(folder: Path, name: str) -> tuple[bool, str]:
    if not folder.is_dir():
        return False, f"envs/{name}/ does not exist"
    missing = [f for f in (f"{name}.py", "env.py", "README.md") if not (folder / f).is_file()]
    if missing:
        return False, f"missing in envs/{name}/: {', '.join(missing)}"
    if not (folder / "README.md").read_text(errors="replace").strip():
        return False, f"envs/{name}/README.md is empty: state the assumptions you made"
    return True, f"{name}.py, env.py, README.md" + (", tasks.py" if (folder / "tasks.py").is_file() else "")


def stdlib_import_problems(path: Path) -> list[str]:
    """Imports of `path` outside the standard library (relative imports of the folder's own modules
    are allowed), and dynamic imports, as `file:line: what`."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError as exc:
        return [f"{path.name}:{exc.lineno}: SyntaxError: {exc.msg}"]
    problems = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("__import__", "import_module"):
                problems.append(f"{path.name}:{node.lineno}: dynamic import ({called}): import modules by name")
        for module in names:
            if module.split(".")[0] not in sys.stdlib_module_names:
                problems.append(f"{path.name}:{node.lineno}: imports {module} (outside the standard library)")
    return problems


def _stdlib_imports(folder: Path, name: str) -> tuple[bool, str]:
    files = [folder / f"{name}.py"] + ([folder / "tasks.py"] if (folder / "tasks.py").is_file() else [])
    problems = [p for f in files for p in stdlib_import_problems(f)]
    if problems:
        return False, "the domain must be pure Python (stdlib only):\n" + "\n".join(problems)
    return True, ", ".join(f.name for f in files) + ": standard library only"


# ---------------------------------------------------------------- the domain module
def _protocol(domain, name: str) -> tuple[bool, str]:
    missing = [n for n in PROTOCOL_CONSTANTS + PROTOCOL_FUNCTIONS if not hasattr(domain, n)]
    if missing:
        return False, f"{name}.py does not define {', '.join(missing)}"
    problems = []
    if domain.NAME != name:
        problems.append(f"NAME is {domain.NAME!r}, expected the folder name {name!r}")
    if not isinstance(domain.DESCRIPTION, str) or not domain.DESCRIPTION.strip():
        problems.append("DESCRIPTION must be a non-empty string")
    if not isinstance(domain.ACTIONS, list) or not domain.ACTIONS or \
            not all(isinstance(a, str) and a.strip() for a in domain.ACTIONS):
        problems.append("ACTIONS must be a non-empty list of strings (the actions in words, by index)")
    if not _is_int(domain.OBSERVATION_SIZE) or domain.OBSERVATION_SIZE < 1:
        problems.append(f"OBSERVATION_SIZE must be a positive int, not {domain.OBSERVATION_SIZE!r}")
    if not (_is_number(domain.OBSERVATION_LOW) and _is_number(domain.OBSERVATION_HIGH)
            and domain.OBSERVATION_LOW < domain.OBSERVATION_HIGH):
        problems.append(f"OBSERVATION_LOW < OBSERVATION_HIGH must be finite numbers, not "
                        f"{domain.OBSERVATION_LOW!r}, {domain.OBSERVATION_HIGH!r}")
    reward_range = domain.REWARD_RANGE
    if not (isinstance(reward_range, tuple) and len(reward_range) == 2 and all(map(_is_number, reward_range))
            and reward_range[0] <= reward_range[1]):
        problems.append(f"REWARD_RANGE must be a (low, high) tuple of finite numbers, not {reward_range!r}")
    if not _is_int(domain.MAX_STEPS) or domain.MAX_STEPS < 1:
        problems.append(f"MAX_STEPS must be a positive int, not {domain.MAX_STEPS!r}")
    not_callable = [n for n in PROTOCOL_FUNCTIONS if not callable(getattr(domain, n))]
    if not_callable:
        problems.append(f"not functions: {', '.join(not_callable)}")
    if problems:
        return False, "\n".join(problems)
    return True, (f"{len(domain.ACTIONS)} actions, observation {domain.OBSERVATION_SIZE} numbers in "
                  f"[{domain.OBSERVATION_LOW}, {domain.OBSERVATION_HIGH}], reward in {list(reward_range)}, "
                  f"MAX_STEPS {domain.MAX_STEPS}")


def _tasks(folder: Path, name: str, domain) -> tuple[str, list]:
    if not (folder / "tasks.py").is_file():
        return "no tasks.py (every episode starts from reset(seed))", []
    tasks = getattr(importlib.import_module(f"envs.{name}.tasks"), "TASKS", None)
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, dict) for t in tasks):
        raise _Failed("tasks.py must define TASKS, a non-empty list of dicts")
    for i, task in enumerate(tasks):
        try:
            state = domain.reset(i, task)
            _observation_problem(domain, domain.observation(state))
        except _Failed as exc:
            raise _Failed(f"TASKS[{i}] = {task!r}: {exc}") from None
        except Exception:
            raise _Failed(f"reset({i}, TASKS[{i}]) with TASKS[{i}] = {task!r} raised:\n{_traceback_tail()}") from None
    return f"{len(tasks)} task(s), each starts an episode", tasks


# ---------------------------------------------------------------- the gymnasium wrapper
def _env_class(name: str, domain):
    import gymnasium as gym
    import numpy as np

    try:
        module = importlib.import_module(f"envs.{name}.env")
    except Exception:
        raise _Failed(f"importing envs/{name}/env.py failed:\n{_traceback_tail()}") from None
    env_class = getattr(module, "Env", None)
    if not (isinstance(env_class, type) and issubclass(env_class, gym.Env)):
        raise _Failed(f"envs/{name}/env.py must define `class Env(gymnasium.Env)`")
    env = env_class(render_mode=None)
    expected_obs = gym.spaces.Box(domain.OBSERVATION_LOW, domain.OBSERVATION_HIGH, (domain.OBSERVATION_SIZE,),
                                  np.float32)
    problems = []
    if env.action_space != gym.spaces.Discrete(len(domain.ACTIONS)):
        problems.append(f"action_space is {env.action_space}, expected Discrete({len(domain.ACTIONS)})")
    if env.observation_space != expected_obs:
        problems.append(f"observation_space is {env.observation_space}, expected {expected_obs}")
    env.reset(seed=0)
    if getattr(env, "state", None) is None:
        problems.append("after reset, Env.state must hold the domain state (the checks read its legal actions)")
    env.close()
    if problems:
        raise _Failed("\n".join(problems))
    return "Env(render_mode=None): spaces match the domain", env_class


def _gymnasium_check(env_class) -> str:
    from gymnasium.utils.env_checker import check_env

    env = env_class(render_mode=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_env(env, skip_render_check=True)
        except Exception:
            raise _Failed(f"check_env(Env()) raised:\n{_traceback_tail()}") from None
    notes = sorted({re.sub(r"\x1b\[[0-9;]*m", "", str(w.message)).splitlines()[0][:160] for w in caught})
    return "passed" + (f" (warnings: {'; '.join(notes)})" if notes else "")


def _determinism(env_class, domain, tasks: list) -> str:
    import numpy as np

    first, second = env_class(render_mode=None), env_class(render_mode=None)
    for episode in range(DETERMINISM_EPISODES):
        rng = random.Random(10_000 + episode)
        options = {"task": tasks[episode % len(tasks)]} if tasks else None
        obs_a, _ = first.reset(seed=episode, options=options)
        obs_b, _ = second.reset(seed=episode, options=options)
        trajectory = []
        for t in range(domain.MAX_STEPS + 1):
            if not np.array_equal(obs_a, obs_b):
                raise _Failed(f"seed {episode}, after actions {trajectory}: the two observations differ\n"
                              f"first:  {np.asarray(obs_a).tolist()}\nsecond: {np.asarray(obs_b).tolist()}")
            if t == domain.MAX_STEPS:
                break
            action = _random_action(rng, domain, first.state)
            trajectory.append(action)
            obs_a, r_a, term_a, trunc_a, _ = first.step(action)
            obs_b, r_b, term_b, trunc_b, _ = second.step(action)
            if (r_a, term_a, trunc_a) != (r_b, term_b, trunc_b):
                raise _Failed(f"seed {episode}, actions {trajectory}: (reward, terminated, truncated) "
                              f"{(r_a, term_a, trunc_a)} vs {(r_b, term_b, trunc_b)}")
            if term_a or trunc_a:
                break
    return (f"{DETERMINISM_EPISODES} seeds: two envs, the same seed and the same actions, identical "
            "observations, rewards and ends")


# ---------------------------------------------------------------- random episodes
def _random_episodes(report: CheckReport, env_class, domain, tasks: list, episodes: int) -> None:

    env = env_class(render_mode=None)
    low, high = domain.REWARD_RANGE
    first = {name: None for name in ("observations in space", "rewards in range", "episodes end", "render")}
    crash, steps, ended = None, 0, {"terminated": 0, "truncated": 0}
    rng = random.Random(20_000)

    def note(check: str, where: str, what: str) -> None:
        if first[check] is None:
            first[check] = f"{where}: {what}\nstate:\n{_render_safely(domain, env.state)}"

    for episode in range(episodes):
        where, actions = f"episode {episode} (reset(seed={episode}))", []
        try:
            options = {"task": tasks[episode % len(tasks)]} if tasks and episode % 2 else None
            obs, _ = env.reset(seed=episode, options=options)
            problem = _observation_problem(domain, obs, env.observation_space)
            if problem:
                note("observations in space", f"{where}, the first observation", problem)
            for t in range(1, domain.MAX_STEPS + 2):
                if t == 1 and episode < 50 and not isinstance(domain.render(env.state), str):
                    note("render", where, "render(state) must return a str")
                action = _random_action(rng, domain, env.state)
                actions.append(action)
                obs, reward, terminated, truncated, _ = env.step(action)
                steps += 1
                at = f"{where}, step {t} after actions {actions}"
                problem = _observation_problem(domain, obs, env.observation_space)
                if problem:
                    note("observations in space", at, problem)
                if not _is_number(reward) or not low - 1e-9 <= float(reward) <= high + 1e-9:
                    note("rewards in range", at, f"reward {reward!r} outside REWARD_RANGE {domain.REWARD_RANGE}")
                if terminated or truncated:
                    ended["terminated" if terminated else "truncated"] += 1
                    break
                if t >= domain.MAX_STEPS:
                    note("episodes end", at, f"neither terminated nor truncated after MAX_STEPS = {domain.MAX_STEPS} "
                                             "steps (Env.step must truncate at MAX_STEPS)")
                    break
        except Exception:
            crash = f"{where}, after actions {actions}:\n{_traceback_tail()}"
            break
    done = episode + (0 if crash else 1)
    report.add("random episodes", crash is None,
               crash or f"{done} episodes, {steps} steps of random actions ({ended['terminated']} terminated, "
                        f"{ended['truncated']} truncated), no exception, no NaN")
    details = {"observations in space": f"every observation has {domain.OBSERVATION_SIZE} finite float32 numbers in "
                                        f"[{domain.OBSERVATION_LOW}, {domain.OBSERVATION_HIGH}]",
               "rewards in range": f"every reward in {list(domain.REWARD_RANGE)}",
               "episodes end": f"every episode ended within MAX_STEPS = {domain.MAX_STEPS}",
               "render": "render(state) is a str"}
    for check, failure in first.items():
        report.add(check, failure is None, failure or (details[check] + (" (until the exception)" if crash else "")))


def _random_action(rng: random.Random, domain, state) -> int:
    legal = domain.legal_actions(state)
    if legal and rng.random() >= ILLEGAL_SHARE:
        action = rng.choice(legal)
        if not _is_int(action) or not 0 <= action < len(domain.ACTIONS):
            raise _Failed(f"legal_actions returned {legal!r}: action indices in [0, {len(domain.ACTIONS)}) expected")
        return int(action)
    return rng.randrange(len(domain.ACTIONS))


def _observation_problem(domain, obs, space=None) -> str:
    import numpy as np

    values = np.asarray(obs, dtype=np.float64)
    if values.shape != (domain.OBSERVATION_SIZE,):
        return f"observation shape {values.shape}, expected ({domain.OBSERVATION_SIZE},)"
    if not np.all(np.isfinite(values)):
        return f"observation has NaN or infinite values: {values.tolist()}"
    outside = [(i, v) for i, v in enumerate(values.tolist())
               if not domain.OBSERVATION_LOW <= v <= domain.OBSERVATION_HIGH]
    if outside:
        i, v = outside[0]
        return (f"observation[{i}] = {v} outside [{domain.OBSERVATION_LOW}, {domain.OBSERVATION_HIGH}] "
                f"({len(outside)} value(s) outside)")
    if space is not None and not space.contains(obs):
        return f"observation_space.contains(obs) is False (dtype {getattr(obs, 'dtype', type(obs).__name__)})"
    return ""


# ---------------------------------------------------------------- helpers
def _run_check(report: CheckReport, name: str, body):
    """Run one check: `body()` returns (detail, value) or detail; _Failed or any exception fails it."""
    try:
        result = body()
    except _Failed as exc:
        report.add(name, False, str(exc))
        return None
    except Exception:
        report.add(name, False, f"raised:\n{_traceback_tail()}")
        return None
    detail, value = result if isinstance(result, tuple) else (result, True)
    report.add(name, True, detail)
    return value


def _skip_rest(report: CheckReport) -> CheckReport:
    done = {c.name for c in report.checks}
    for name in CHECK_NAMES:
        if name not in done:
            report.add(name, False, "skipped: an earlier check failed")
    return report


def _render_safely(domain, state) -> str:
    try:
        return str(domain.render(state))
    except Exception as exc:
        return f"(render failed: {type(exc).__name__}: {exc})"


def _traceback_tail(lines: int = 8) -> str:
    text = traceback.format_exc().strip().splitlines()
    return "\n".join(text[-lines:])


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Check envs/<name>/ of a repository (the create command's checks).")
    parser.add_argument("--root", required=True, help="the repository (or snapshot) holding envs/<name>/")
    parser.add_argument("--name", required=True)
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--episodes", type=int, default=EPISODES)
    args = parser.parse_args(argv)
    report = check_env_folder(Path(args.root), args.name, args.episodes)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    print(report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
