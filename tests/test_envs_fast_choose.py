"""envs_fast.choose_backend: the one answer to "which verified backend trains this env at this env count",
read from real cached verdicts and throughput figures (a private cache per test)."""
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import envs_fast
import evaluate
from envs_fast import cache
from envs_fast.backends.envpool_backend import EnvpoolVectorEnv
from envs_fast.backends.jax_vector import JaxVectorEnv
from envs_fast.verify import Settings, verify

pytestmark = pytest.mark.usefixtures("private_cache")

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "envs_fast" / "translations" / "cartpole_v1.py"
QUICK = Settings(reset_samples=300, l2_target=600, l3_trajectories=8, rollout_steps=120)
ENV = "CartPole-v1"  # envpool has it, gymnax has it, a translation ships for it


@pytest.fixture
def root(tmp_path):
    """A repository root whose envs_fast/translations/ holds a copy of the shipped CartPole translation."""
    root = tmp_path / "repo"
    (root / "envs_fast" / "translations").mkdir(parents=True)
    shutil.copy(SHIPPED, root / "envs_fast" / "translations" / "cartpole_v1.py")
    return root


def passes(spec):
    cache.store_verdict(str(spec), ENV, [1, 2, 3], True, "test verdict")


def test_only_a_translation_verified_for_its_current_content_is_chosen(root):
    translation = root / "envs_fast" / "translations" / "cartpole_v1.py"
    assert envs_fast.choose_backend(ENV, 8, root=root) == "envpool"  # unverified: envpool, the default

    assert verify(ENV, "jax", (1, 2, 3), QUICK, root=root).passed
    assert envs_fast.choose_backend(ENV, 8, root=root) == str(translation)  # neither benchmarked: default order

    # an edited translation is no longer verified; a failing one never is
    translation.write_text(translation.read_text().replace("X_THRESHOLD = 2.4\n", "X_THRESHOLD = 2.5\n"))
    assert envs_fast.choose_backend(ENV, 8, root=root) == "envpool"
    assert not verify(ENV, "jax", (1, 2, 3), QUICK, root=root).passed
    assert envs_fast.choose_backend(ENV, 8, root=root) == "envpool"


def test_the_fastest_at_the_nearest_measured_env_count_wins(root):
    translation = str(root / "envs_fast" / "translations" / "cartpole_v1.py")
    passes(translation)
    cache.store_throughput("envpool", ENV, 8, 300_000)  # benchmarked beats never benchmarked
    assert envs_fast.choose_backend(ENV, 8, root=root) == "envpool"

    # JAX dispatch costs dominate at few envs; the batch wins at many
    cache.store_throughput(translation, ENV, 8, 60_000)
    cache.store_throughput(translation, ENV, 1024, 5_000_000)
    cache.store_throughput("envpool", ENV, 1024, 900_000)
    assert envs_fast.choose_backend(ENV, 8, root=root) == "envpool"
    assert envs_fast.choose_backend(ENV, 2, root=root) == "envpool"
    assert envs_fast.choose_backend(ENV, 1024, root=root) == translation
    assert envs_fast.choose_backend(ENV, 4096, root=root) == translation

    # gymnax counts only once verified; verified only statistically, it must be a quarter faster than
    # the translation (verified state by state) to win over it
    cache.store_throughput("gymnax", ENV, 1024, 9_000_000)
    assert envs_fast.choose_backend(ENV, 1024, root=root) == translation
    passes("gymnax")
    assert envs_fast.choose_backend(ENV, 1024, root=root) == "gymnax"
    cache.store_throughput("gymnax", ENV, 1024, 6_000_000)  # 1.2x the translation: within the margin
    assert envs_fast.choose_backend(ENV, 1024, root=root) == translation
    cache.store_throughput("gymnax", ENV, 1024, 6_500_000)  # 1.3x
    assert envs_fast.choose_backend(ENV, 1024, root=root) == "gymnax"


def test_reference_when_no_backend_is_verified_or_available(tmp_path):
    import tests.endless_env  # noqa: F401  registers Endless-v0, which envpool and gymnax lack

    assert envs_fast.choose_backend("Endless-v0", 8) == "reference"
    assert envs_fast.choose_backend("tests.endless_env:Endless-v0", 8) == "reference"
    # envpool is trusted unless a cached verdict says it fails
    no_translation = tmp_path / "empty"
    assert envs_fast.choose_backend(ENV, 8, root=no_translation) == "envpool"
    cache.store_verdict("envpool", ENV, [1, 2, 3], False, "test verdict")
    assert envs_fast.choose_backend(ENV, 8, root=no_translation) == "reference"


def test_bench_auto_measures_what_auto_would_train_on(tmp_path):
    """The translate phase's incumbent: `bench --backend auto` in a checkout resolves choose_backend there."""
    from envs_fast.bench import bench

    passes(SHIPPED)
    result = bench(ENV, "auto", num_envs=64, seconds=0.2, adapter_num_envs=8)
    assert result["backend"] == str(SHIPPED) and result["adapter_sps"] > 0
    result = bench(ENV, "auto", num_envs=64, seconds=0.2, adapter_num_envs=8, root=tmp_path / "empty")
    assert result["backend"] == "envpool"


def test_evaluate_auto_trains_on_the_chosen_backend():
    venv = evaluate.make_vec_env(ENV, 4, 0)
    assert isinstance(venv, EnvpoolVectorEnv)
    venv.close()
    passes(SHIPPED)
    venv = evaluate.make_vec_env(ENV, 4, 0)
    assert isinstance(venv, JaxVectorEnv) and venv.backend.name == str(SHIPPED)
    venv = evaluate.make_vec_env("tests.endless_env:Endless-v0", 2, 0)  # "reference": the harness's own
    assert isinstance(venv, gym.vector.SyncVectorEnv)
    assert venv.envs[0].spec.max_episode_steps == evaluate.MAX_EPISODE_STEPS
    venv.close()


def test_harness_copy_without_envs_fast_falls_back_to_gymnasium(tmp_path):
    shutil.copy(REPO / "evaluate.py", tmp_path / "evaluate.py")
    proc = subprocess.run([sys.executable, "-c", "import evaluate; print(type(evaluate.make_vec_env('CartPole-v1', 2, 0)).__name__)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "SyncVectorEnv"


def _envs_fast_imports(path: Path, known: set[str]) -> set[str]:
    """The envs_fast modules `path` imports anywhere (top level or inside functions): a module named
    by `from package import module` is that module; any other name imported from a package is an
    edge to the package's __init__."""
    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {owner(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {owner(f"{node.module}.{alias.name}") for alias in node.names}
    return {name for name in found if name and name.startswith("envs_fast")}


def test_envs_fast_modules_import_each_other_without_cycles():
    """No circle among envs_fast's modules at any depth, a package's __init__ counted as a module: one
    imports it by a name it defines, and by any module under it (which the architecture test's graph
    leaves out when the importer is inside the package)."""
    from tests.test_architecture import cycles, module_name, python_files

    files = {".".join(filter(None, ("envs_fast", module_name(p, REPO / "envs_fast")))): p
             for p in python_files(REPO / "envs_fast")}
    def with_packages(name: str, targets: set[str]) -> set[str]:
        """Importing a.b.c runs a/__init__ and a/b/__init__ first (but for the importer's own packages)."""
        parts = {".".join(t.split(".")[:k]) for t in targets for k in range(1, t.count(".") + 1)}
        return (targets | {q for q in parts if not name.startswith(q + ".")}) - {name}

    graph = {name: with_packages(name, _envs_fast_imports(path, set(files))) for name, path in files.items()}
    assert graph["envs_fast.protocol"] == set()   # the vocabulary: any module may import it
    assert "envs_fast.backends.load" not in graph["envs_fast.backends.gymnax_backend"]
    assert not cycles(graph), cycles(graph)
    for module in ("envs_fast.backends.gymnax_backend", "envs_fast.backends.load", "envs_fast.protocol"):
        proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
