"""Does a Modal GPU container train on its GPU? What `modal run modal_app.py::doctor` runs there, as
plain Python: the driver, what torch and JAX see (and the CUDA major each was built for), then the
checkout's train.py for a short budget on CartPole on each path (the jax-host path, JAX learning from a
host env; the jax-e2e path, after verifying the shipped JAX translation there), each saying which
device it trained on, then the raw speed of every other fast path a night could take (FAST_PATHS: the
JAX physics port, mjx for a MuJoCo env, the Rust port built here). The jax-e2e run is a night's
training call exactly: the verdict reached by `check_archive` (what a night's verify runs) handed over
as a night hands its records over.

Nothing here imports modal: `gpu_doctor` of functions.py calls `diagnose`, and tests call it
directly (on a machine without a GPU it reports exactly that, as problems).
"""
from __future__ import annotations

import importlib.metadata
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from ...lockfile import differences, installed_versions
from .experiment import check_archive, extract_archive, train_archive

DOCTOR_ENV = "CartPole-v1"   # a shipped JAX translation exists for it, so both paths can run
DOCTOR_BUDGET_S = 20.0
VERIFY_TIMEOUT_S = 900
# Every other fast path a night could take here, (env, kind), each stepping its env under random actions:
# the JAX physics port shipped for GPUs, mjx for a MuJoCo env, and the Rust port (built here, as setup
# builds it: the image must carry the toolchain).
FAST_PATHS = (("BipedalWalker-v3", "jax"), ("HalfCheetah-v5", "mjx"), ("BipedalWalker-v3", "rust"))
PORT_NUM_ENVS = 4096
RUST_NUM_ENVS = 64   # host envs: a Rust port steps on the container's CPUs
PORT_SECONDS = 10.0


def driver() -> str:
    """The NVIDIA driver and GPU, as nvidia-smi reports them, or why it could not."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no nvidia-smi ({exc.__class__.__name__}: {exc})"
    return (out.stdout.strip() or out.stderr.strip() or f"nvidia-smi exited with {out.returncode}").replace("\n", "; ")


def _major(version: Optional[str]) -> Optional[int]:
    match = re.match(r"(\d+)", version or "")
    return int(match.group(1)) if match else None


def torch_view() -> dict:
    import torch

    view = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_major": _major(torch.version.cuda),
            "gpu": torch.cuda.is_available()}
    if view["gpu"]:
        view["device"] = torch.cuda.get_device_name(0)
    return view


def jax_cuda_plugins() -> list[str]:
    """The installed JAX CUDA plugins, e.g. ["jax-cuda13-plugin 0.10.2"]."""
    found = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if re.fullmatch(r"jax-cuda\d+-plugin", name):
            found.add(f"{name} {dist.version}")
    return sorted(found)


def jax_view() -> dict:
    import jax

    plugins = jax_cuda_plugins()
    majors = sorted({int(re.search(r"cuda(\d+)", p).group(1)) for p in plugins})
    try:
        devices = [str(d) for d in jax.devices()]
        backend = jax.default_backend()
    except RuntimeError as exc:  # a CUDA plugin that cannot start says why here
        devices, backend = [f"error: {exc}".splitlines()[0]], "none"
    return {"version": jax.__version__, "backend": backend, "devices": devices, "plugins": plugins,
            "cuda_majors": majors}


def _verify_shipped(archive: bytes, env_id: str) -> tuple[bool, str, dict, dict]:
    """Verify (L1-L3) the archive's JAX translation of `env_id` here, as a night's setup does on Modal:
    (passed, its first line, the records it left, this container's environment)."""
    from envs_fast.protocol import translation_path
    from envs_fast.verify.report import report_lines

    with tempfile.TemporaryDirectory(prefix="autorl-doctor-") as tmp:
        checkout = Path(tmp)
        extract_archive(archive, checkout)
        spec = translation_path(env_id, checkout)
        if not spec.is_file():
            return False, f"the checkout ships no JAX translation of {env_id}", {}, {}
        relative = str(spec.relative_to(checkout))
    reply = check_archive(archive, env_id, "verify", ["--backend", relative, "--levels", "1,2,3"], {}, VERIFY_TIMEOUT_S)
    lines = report_lines(reply["log"])
    passed = reply["returncode"] == 0
    summary = next((line for line in lines if "FAIL" in line), lines[-1] if lines else f"exit {reply['returncode']}")
    return passed, (lines[0] if passed and lines else summary), reply["records"], reply["environment"]


def _train(archive: bytes, env_id: str, budget: float, verdicts: Optional[dict] = None,
           keyed_for: Optional[dict] = None) -> dict:
    result = train_archive(archive, env_id, budget, seed=1, verdicts=verdicts, keyed_for=keyed_for)
    metrics = result["metrics"]
    return {key: metrics.get(key) for key in ("path", "device", "backend", "env_steps", "sps", "compile_seconds",
                                              "episode_return")} | {
        "returncode": result["returncode"], "trained": result["returncode"] == 0 and result["policy"] is not None,
        "log_tail": "\n".join(result["log"].strip().splitlines()[-5:])}


def path_speed(archive: bytes, env_id: str, kind: str = "jax", num_envs: int = PORT_NUM_ENVS,
               seconds: float = PORT_SECONDS) -> dict:
    """One fast path of the archive stepping `env_id` here under random actions (auto-reset included:
    what bench's backend figure times): kind "jax" its JAX translation under a jitted scan of `num_envs`
    envs, "mjx" MuJoCo's JAX port the same way, "rust" its Rust translation built here and stepped
    over RUST_NUM_ENVS envs. Steps/s after the build or compile, its seconds and the device; or why it
    could not run."""
    import time

    import jax

    from envs_fast.protocol import translation_path
    from envs_fast.bench.throughput import jax_runner, measure, rust_runner

    with tempfile.TemporaryDirectory(prefix="autorl-doctor-port-") as tmp:
        checkout = Path(tmp)
        extract_archive(archive, checkout)
        spec = "mjx" if kind == "mjx" else str(translation_path(env_id, checkout, lang=kind))
        if kind != "mjx" and not Path(spec).is_file():
            return {"env_id": env_id, "kind": kind, "error": f"the checkout ships no {kind} translation of {env_id}"}
        envs = RUST_NUM_ENVS if kind == "rust" else num_envs
        try:
            started = time.perf_counter()
            runner = rust_runner(spec, env_id, envs) if kind == "rust" else jax_runner(spec, env_id, envs,
                                                                                     scan_steps=32)
            runner.run_once()   # compiles (or built above)
            compile_s = time.perf_counter() - started
            sps = measure({"port": runner}, seconds, rounds=1)["port"]
        except Exception as exc:  # the doctor reports it, as a problem, and goes on
            return {"env_id": env_id, "kind": kind,
                    "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {"env_id": env_id, "kind": kind, "num_envs": envs, "sps": round(sps), "compile_seconds": round(compile_s, 1),
            "device": "cpu" if kind == "rust" else str(jax.devices()[0])}


PATH_NAMES = {"jax": "JAX port", "mjx": "mjx backend", "rust": "Rust port"}


def diagnose(archive: bytes, env_id: str = DOCTOR_ENV, budget: float = DOCTOR_BUDGET_S,
             paths: tuple[tuple[str, str], ...] = FAST_PATHS, port_envs: int = PORT_NUM_ENVS) -> dict:
    """Everything the doctor looks at, in the container it runs in."""
    report = {"driver": driver(), "torch": torch_view(), "jax": jax_view(), "env_id": env_id, "budget_s": budget,
              "unlocked": differences(installed_versions())}
    report["jax_host"] = _train(archive, env_id, budget)
    passed, summary, records, environment = _verify_shipped(archive, env_id)
    report["verify"] = {"passed": passed, "summary": summary}
    if passed:
        report["jax_e2e"] = _train(archive, env_id, budget, records, environment)
    report["ports"] = [path_speed(archive, env, kind, port_envs) for env, kind in paths]
    report["problems"] = problems(report)
    return report


def on_gpu(device) -> bool:
    """Whether train.py's `device:` (JAX's platform) is a GPU."""
    return any(name in str(device or "").lower() for name in ("gpu", "cuda"))


def problems(report: dict) -> list[str]:
    """What keeps a night from using the GPU, one line each; empty when both paths trained on it."""
    found = []
    if report.get("unlocked"):
        found.append(f"the image is not the tested set of constraints.txt: {', '.join(report['unlocked'])}")
    torch_, jax_ = report["torch"], report["jax"]  # (torch only loads and checks the artifact: no GPU needed)
    if jax_["backend"] != "gpu":
        found.append(f"JAX {jax_['version']} runs on {jax_['backend']} ({', '.join(jax_['devices'])}), not a GPU")
    if torch_["cuda_major"] and jax_["cuda_majors"] and jax_["cuda_majors"] != [torch_["cuda_major"]]:
        found.append(f"two CUDA majors: torch is built for CUDA {torch_['cuda']}, JAX's plugins are "
                     f"{', '.join(jax_['plugins'])}")
    host = report["jax_host"]
    if not host["trained"]:
        found.append(f"the jax-host path did not train (exit {host['returncode']}): {host['log_tail'][-300:]}")
    elif not on_gpu(host["device"]):
        found.append(f"the jax-host path trained on {host['device']}, not the GPU")
    if not report["verify"]["passed"]:
        found.append(f"the shipped JAX translation did not verify here: {report['verify']['summary']}")
    else:
        e2e = report["jax_e2e"]
        if not e2e["trained"]:
            found.append(f"the jax-e2e path did not train (exit {e2e['returncode']}): {e2e['log_tail'][-300:]}")
        elif e2e["path"] != "jax-e2e":
            found.append(f"with a verified JAX translation training took the {e2e['path']} path, not jax-e2e")
        elif not on_gpu(e2e["device"]):
            found.append(f"the jax-e2e path trained on {e2e['device']}, not the GPU")
    found += [f"the {PATH_NAMES[port.get('kind', 'jax')]} of {port['env_id']} did not run here: {port['error']}"
              for port in report.get("ports", []) if "error" in port]
    return found


def format_report(report: dict) -> str:
    t, j = report["torch"], report["jax"]
    lines = [f"driver:  {report['driver']}",
             f"torch:   {t['version']}, built for CUDA {t['cuda']}, sees "
             f"{t.get('device') or 'no GPU'}",
             f"jax:     {j['version']} on {j['backend']} ({', '.join(j['devices'])}); CUDA plugins: "
             f"{', '.join(j['plugins']) or 'none'}"]
    runs = [("jax-host", report["jax_host"])]
    lines.append(f"verify:  {'passed' if report['verify']['passed'] else 'FAILED'}: {report['verify']['summary']}")
    if "jax_e2e" in report:
        runs.append(("jax-e2e", report["jax_e2e"]))
    for name, run in runs:
        compile_s = f", compile {run['compile_seconds']} s" if run.get("compile_seconds") else ""
        lines.append(f"{name + ':':8} {report['env_id']} {report['budget_s']:g} s -> path {run['path']} on "
                     f"{run['device']}: {run['env_steps']} env steps, {run['sps']} sps{compile_s}, "
                     f"return {run['episode_return']}")
    for port in report.get("ports", []):
        if "error" not in port:
            lines.append(f"{'port:':8} {port['env_id']}'s {PATH_NAMES[port.get('kind', 'jax')]}, {port['num_envs']} "
                         f"envs on {port['device']}: {port['sps']} env steps/s (compile {port['compile_seconds']} s)")
    lines += [f"PROBLEM: {line}" for line in report["problems"]] or ["ok: train.py's JAX learner trains on the GPU on both paths"]
    return "\n".join(lines)
