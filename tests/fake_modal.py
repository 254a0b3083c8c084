"""A fake of the Modal surface the daemon uses, faithful where real Modal fails: no network.

What it models, each after the Modal source (the installed modal 1.6.4, `.venv/.../modal/`) or
documentation it cites:

- The "server" is a folder (`root`): calls and apps live there, so a call outlives the process
  that spawned it and a later daemon finds it with `from_id`, as on Modal.
- `FakeFunction.spawn(*args)` pickles the arguments with Modal's own serializer
  (modal/_serialization.py `serialize`, a cloudpickle Pickler; the container `deserialize`s), and
  each input runs in a container: a `python -m tests.fake_modal container` subprocess that calls
  the real Modal function of orchestrator/runners/modal/functions.py through `.local()` (its real
  signature; `.local` calls the raw function, modal/_functions.py), then pickles the result or the
  exception back (modal/_serialization.py `pickle_exception`).
- Queue delay: an input waits `Plan.queue_s` for a container. While it waits, `get_call_graph()`
  shows it with an empty `task_id` (modal/call_graph.py builds InputInfo from the server's
  InputCallGraphInfo, whose task_id is the container's); a container gets a fresh task id.
- `get(timeout)` raises builtins.TimeoutError while the input is unfinished and
  OutputExpiredError when there is no output and nothing unfinished (modal/_functions.py
  `poll_function`); outputs are kept for `Plan.output_ttl_s` ("accessible via FunctionCall.get()
  for up to 7 days after completion", modal.com/docs/guide/job-queue).
- An input whose container ran past the function's `timeout` (execution time only, "It does not
  include scheduling time", modal.com/docs/guide/timeouts) ends TIMEOUT: get raises
  FunctionTimeoutError (modal/_utils/function_utils.py `_process_result`).
- Pre-emption: "Modal will send an interrupt signal to your container" and "restart it on the same
  input" (modal.com/docs/guide/preemption): SIGINT, a KeyboardInterrupt in the running code
  (as modal.exception.simulate_preemption does), then the input queues again on a new container.
  Past `max_restarts` the input ends INTERNAL_FAILURE, raised as InternalFailure
  ("lost inputs or worker preemption", modal/_functions.py; `_process_result`). How many restarts
  real Modal allows is not in the source: max_restarts is this fake's choice.
- `cancel()` of a running input sends the container SIGUSR1, which Modal's container entrypoint
  turns into InputCancellation raised in the running code (modal/_container_entrypoint.py); the
  input ends TERMINATED (container_io_manager.output_items_cancellation), which get() raises as
  RemoteError (`_process_result`: a non-success status without data).
- The app is ephemeral, as `app.run()` makes it: "stopped automatically when the calling program
  exits, or when the server detects that the client is no longer connected"
  (modal.com/docs/guide/apps). Its containers are then terminated (SIGTERM here: the running code
  unwinds, so what it started dies with it) and its unfinished inputs end TERMINATED. `from_id`
  is lazy and never fails (modal/_functions.py `FunctionCall.from_id`: hydrate_lazily); cancelling
  an input that already ended does nothing here (what real Modal answers is not in the source).
- `FakeVolume`: "you need to explicitly commit any changes you make to the volume for the changes
  to become visible outside the current container" and "explicitly reload the volume to see
  changes made since it was mounted" (modal/volume.py, class _Volume).
- Hardware: each container gets a GPU of the type its function asks for, as nvidia-smi reports it
  (a `nvidia-smi` on its PATH), and a host CPU model (its /proc/cpuinfo). Modal "may upgrade" a
  request for an H100 to an H200 and an A100 to an A100-80GB "unless the request says `!`"
  (modal.com/docs/guide/gpu): containers of an unpinned request alternate between the two; and
  containers of one GPU type land on hosts of several CPU models (HOST_CPUS, in turn).
- `block_network=True` (every candidate container): the container has no network ("block all
  network access", modal.com/docs/reference/modal.App#function); a user namespace of its own
  with no interface up, as `unshare --net` makes it.
- `Function.with_options(gpu=, cpu=, timeout=)` returns the function with those options
  (modal/_functions.py), its calls in the same list.

Hardware and network need `unshare` with user namespaces (`isolation()`); without them containers
run on this machine as it is, and the tests that need them skip, saying so.
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil
from modal._serialization import deserialize, pickle_exception, serialize
from modal.exception import (FunctionTimeoutError, InputCancellation, InternalFailure, OutputExpiredError,
                             RemoteError)
from modal.types import FileEntry, FileEntryType, InputInfo, InputStatus

from orchestrator.results import read_json

AUTORL_ROOT = Path(__file__).resolve().parents[1]
SEVEN_DAYS_S = 7 * 24 * 3600.0
TICK_S = 0.05
FINISHED = ("success", "failure", "terminated", "timeout", "internal_failure")
STATUS_OF = {"pending": InputStatus.PENDING, "success": InputStatus.SUCCESS, "failure": InputStatus.FAILURE,
             "terminated": InputStatus.TERMINATED, "timeout": InputStatus.TIMEOUT,
             "internal_failure": InputStatus.FAILURE}


# What nvidia-smi names in a container of each GPU request: an unpinned request may get either type
GPU_TYPES = {"H100!": ("NVIDIA H100 80GB HBM3",), "H100": ("NVIDIA H100 80GB HBM3", "NVIDIA H200"),
             "H200": ("NVIDIA H200",), "A100-40GB": ("NVIDIA A100-SXM4-40GB",),
             "A100": ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB"), "A100-80GB": ("NVIDIA A100-SXM4-80GB",),
             "L4": ("NVIDIA L4",), "T4": ("Tesla T4",)}
HOST_CPUS = ("AMD EPYC 9454 48-Core Processor", "Intel(R) Xeon(R) Platinum 8480+")
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *driver_version*) echo "{name}, 580.65.06, 81559 MiB" ;;
  *) echo "{name}" ;;
esac
"""


@functools.lru_cache(maxsize=None)
def isolation() -> bool:
    """Whether a container can have a user namespace of its own (its network off, /proc/cpuinfo its
    host's). Probed once, by the client (a container never asks)."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "sh", "-c",
                            "mount --bind /proc/self/status /proc/cpuinfo"], capture_output=True)
    return probe.returncode == 0


NO_ISOLATION = "unshare cannot make a user namespace here: the fake's containers keep this machine's network and CPU"


@dataclass
class Plan:
    """What happens to one spawned input."""
    queue_s: float = 0.0                     # waiting for a container, before each start
    preempt_after_s: Optional[float] = None  # pre-empted this long after each start ...
    preemptions: int = 0                     # ... this many times
    output_ttl_s: float = SEVEN_DAYS_S       # how long its output can be fetched


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class FakeApp:
    """An ephemeral app (app.run()): alive while its client process is and until stopped."""

    def __init__(self, root: Path, app_id: str):
        self.root, self.app_id = root, app_id
        self.path = root / "apps" / f"{app_id}.json"

    @classmethod
    def start(cls, root: Path) -> "FakeApp":
        app = cls(root, f"ap-{uuid.uuid4().hex[:12]}")
        app.path.parent.mkdir(parents=True, exist_ok=True)
        me = psutil.Process()
        _write_json(app.path, {"client_pid": me.pid, "client_started": me.create_time(), "stopped": False})
        return app

    def stop(self) -> None:
        _write_json(self.path, {**read_json(self.path), "stopped": True})

    def alive(self) -> bool:
        state = read_json(self.path)
        if not state or state.get("stopped"):
            return False
        return client_alive(state["client_pid"], state["client_started"])


def client_alive(pid: int, started: float) -> bool:
    """The server's view of a client: connected while its process lives (not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 1e-3 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class FakeCall:
    """modal.FunctionCall over the server folder: whoever holds the id sees the same input."""

    def __init__(self, root: Path, call_id: str):
        self.root, self.object_id = Path(root), call_id
        self.dir = self.root / "calls" / call_id

    def _state(self) -> dict:
        state = read_json(self.dir / "call.json")
        if state.get("status", "pending") == "pending" and not FakeApp(self.root, state.get("app_id", "?")).alive():
            state = {**state, "status": "terminated", "detail": "the app stopped"}  # its containers went with it
        return state

    def get(self, timeout: Optional[float] = None):
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self._state()
            if state.get("status") in FINISHED:
                break
            if end is not None and time.monotonic() >= end:
                raise TimeoutError()
            time.sleep(TICK_S)
        if time.time() > state.get("finished_at", time.time()) + state.get("output_ttl_s", SEVEN_DAYS_S):
            raise OutputExpiredError()
        status = state["status"]
        if status == "success":
            return deserialize((self.dir / "output.pkl").read_bytes(), None)
        if status == "failure":
            raise deserialize((self.dir / "output.pkl").read_bytes(), None)
        if status == "timeout":
            raise FunctionTimeoutError(state.get("detail", ""))
        if status == "internal_failure":
            raise InternalFailure(state.get("detail", ""))
        raise RemoteError(state.get("detail", ""))

    def cancel(self, terminate_containers: bool = False) -> None:
        (self.dir / "cancel").touch()

    def get_call_graph(self) -> list[InputInfo]:
        state = self._state()
        return [InputInfo(state["input_id"], self.object_id, state.get("task_id", ""),
                          STATUS_OF[state.get("status", "pending")], state["function"],
                          "orchestrator.runners.modal.functions", [])]


class FakeFunction:
    """A modal.Function of the app: spawn runs its input as Modal would (see the module's docstring),
    in a container of its `gpu` request (None: no GPU) with its network blocked where it says so."""

    def __init__(self, modal: "FakeModal", name: str, timeout_s: float, gpu: Optional[str] = None,
                 cpu: Optional[float] = None, block_network: bool = False):
        self.modal, self.name, self.timeout_s = modal, name, timeout_s
        self.gpu, self.cpu, self.block_network = gpu, cpu, block_network
        self.plans: list[Plan] = []          # one per spawn, in order; then Plan()
        self.calls: list[FakeCall] = []

    def with_options(self, *, gpu: Optional[str] = None, cpu: Optional[float] = None,
                     timeout: Optional[float] = None) -> "FakeFunction":
        """The function with other resources (what is not given stays), sharing its plans and calls."""
        other = FakeFunction(self.modal, self.name, timeout if timeout is not None else self.timeout_s,
                             gpu if gpu is not None else self.gpu, cpu if cpu is not None else self.cpu,
                             self.block_network)
        other.plans, other.calls = self.plans, self.calls
        return other

    def spawn(self, *args, **kwargs) -> FakeCall:
        if not self.modal.app.alive():
            raise RemoteError("the app is stopped")
        call_id = f"fc-{uuid.uuid4().hex[:16]}"
        call = FakeCall(self.modal.root, call_id)
        call.dir.mkdir(parents=True)
        (call.dir / "input.pkl").write_bytes(serialize((args, kwargs)))
        plan = self.plans.pop(0) if self.plans else Plan()
        _write_json(call.dir / "call.json", {"function": self.name, "app_id": self.modal.app.app_id,
                                             "input_id": f"in-{call_id[3:]}", "status": "pending", "task_id": "",
                                             "output_ttl_s": plan.output_ttl_s, "restarts": 0})
        self.calls.append(call)
        threading.Thread(target=_Scheduler(self.modal, call, plan, self.timeout_s, self).run, daemon=True,
                         name=f"fake-modal-{call_id}").start()
        return call


class _Scheduler:
    """Modal's side of one input, run in the client's process: queue, container, restarts. A
    container also watches the client itself, so a client that dies takes its containers along."""

    def __init__(self, modal: "FakeModal", call: FakeCall, plan: Plan, timeout_s: float, function: FakeFunction):
        self.modal, self.call, self.plan, self.timeout_s, self.function = modal, call, plan, timeout_s, function
        self.state_path = call.dir / "call.json"

    def update(self, **fields) -> None:
        _write_json(self.state_path, {**read_json(self.state_path), **fields})

    def finish(self, status: str, detail: str = "") -> None:
        self.update(status=status, detail=detail, finished_at=time.time())

    def cancelled(self) -> bool:
        return (self.call.dir / "cancel").exists()

    def run(self) -> None:
        restarts = 0
        while True:
            queued_until = time.monotonic() + self.plan.queue_s
            while time.monotonic() < queued_until:
                if self.cancelled() or not self.modal.app.alive():
                    return self.finish("terminated")
                time.sleep(TICK_S)
            task = f"ta-{uuid.uuid4().hex[:12]}"
            self.update(task_id=task)
            ending = self.container(task, preempt=restarts < self.plan.preemptions)
            if ending != "preempted":
                return
            restarts += 1
            self.update(task_id="", restarts=restarts)
            if restarts > self.modal.max_restarts:
                return self.finish("internal_failure", f"input lost: pre-empted {restarts} times")

    def container(self, task: str, preempt: bool) -> str:
        env, isolate = self.modal.container_env(), []
        gpu, cpu_model = self.modal.hardware(self.function.gpu)
        if isolation():
            host = self.call.dir / f"host-{task}"
            (host / "bin").mkdir(parents=True)
            if gpu:
                smi = host / "bin" / "nvidia-smi"
                smi.write_text(NVIDIA_SMI.format(name=gpu))
                smi.chmod(0o755)
                env["PATH"] = f"{host / 'bin'}{os.pathsep}{env['PATH']}"
            (host / "cpuinfo").write_text(f"processor\t: 0\nmodel name\t: {cpu_model}\n")
            isolate = ["unshare", "--user", "--map-root-user", "--mount"] + (["--net"] if self.function.block_network
                                                                            else [])
            isolate += ["sh", "-c", f'mount --bind "{host / "cpuinfo"}" /proc/cpuinfo && exec "$@"', "sh"]
        self.update(gpu=gpu, cpu_model=cpu_model)
        with open(self.call.dir / f"container-{task}.log", "wb") as log:  # what `modal app logs` would show
            proc = subprocess.Popen(isolate + [sys.executable, "-m", "tests.fake_modal", "container", str(self.call.dir),
                                               task], cwd=self.call.dir, env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        started, signalled = time.monotonic(), None
        while proc.poll() is None:
            ran = time.monotonic() - started
            if signalled is None:
                if self.cancelled():
                    signalled = "cancelled"
                    proc.send_signal(signal.SIGUSR1)   # -> InputCancellation in the running code
                elif not self.modal.app.alive():
                    signalled = "terminated"
                    proc.terminate()
                elif ran > self.timeout_s:
                    signalled = "timeout"
                    proc.terminate()
                elif preempt and self.plan.preempt_after_s is not None and ran > self.plan.preempt_after_s:
                    signalled = "preempted"
                    proc.send_signal(signal.SIGINT)    # Modal's interrupt signal on pre-emption
            time.sleep(TICK_S)
        if signalled == "preempted":
            return "preempted"
        if signalled == "timeout":
            self.finish("timeout", f"the input ran past the function's timeout of {self.timeout_s:g}s")
            return "timeout"
        result = read_json(self.call.dir / f"result-{task}.json")
        self.finish(result.get("status", "terminated"), result.get("detail", f"container exited {proc.returncode}"))
        return "ended"


class FakeModal:
    """The app `autorl` of one daemon (an ephemeral app.run()): `.train`, `.evaluate` and `.check` as
    ModalRunner gets them, `from_id` as modal.FunctionCall.from_id, `stop()` as leaving app.run().
    `root` is the server: pass the same folder to a later FakeModal to find earlier calls."""

    def __init__(self, root: Path, max_restarts: int = 2, train_timeout_s: Optional[float] = None,
                 eval_timeout_s: Optional[float] = None, image_rust: Optional[bool] = None):
        from orchestrator.runners.modal import experiment as modal_experiment, functions as modal_functions

        # whether the image installs a Rust toolchain (as modal_functions.image does, unless told otherwise)
        self.image_rust = bool(modal_functions.RUST_TOOLCHAIN) if image_rust is None else image_rust
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_restarts = max_restarts
        self.app = FakeApp.start(self.root)
        # the functions' own timeouts, as declared in modal_functions.py
        # the functions as modal_functions.py declares them: their timeouts, GPU requests and walls
        gpu, walled = modal_functions.exact_gpu(modal_functions.TRAIN_GPU), modal_functions.CANDIDATE_CONTAINER
        self.train = FakeFunction(self, "train_experiment", train_timeout_s or modal_functions.TRAIN_TIMEOUT_S, gpu,
                                  modal_functions.TRAIN_CPU, walled["block_network"])
        self.evaluate = FakeFunction(self, "evaluate_policy", eval_timeout_s or modal_experiment.EVAL_TIMEOUT_S + 300,
                                     None, modal_functions.EVAL_CPU, walled["block_network"])
        self.check = FakeFunction(self, "check_backend", modal_functions.CHECK_TIMEOUT_S, gpu,
                                  modal_functions.TRAIN_CPU, walled["block_network"])
        self._containers = itertools.count()
        self._hardware_lock = threading.Lock()

    def from_id(self, call_id: str) -> FakeCall:
        return FakeCall(self.root, call_id)

    def hardware(self, request: Optional[str]) -> tuple[str, str]:
        """(the GPU nvidia-smi names, "" for none; the host's CPU model) of the next container for a GPU
        `request`: an unpinned request's types and the hosts' CPU models each in turn."""
        with self._hardware_lock:
            k = next(self._containers)
        if not request:
            return "", HOST_CPUS[k % len(HOST_CPUS)]
        name, _, _ = request.upper().partition(":")
        types = GPU_TYPES.get(name) or (name,)
        return types[k % len(types)], HOST_CPUS[(k // len(types)) % len(HOST_CPUS)]

    def stop(self) -> None:
        self.app.stop()

    def container_env(self) -> dict:
        """A container's environment: the image's, not the daemon's (no run of the daemon's; one
        scoring core, as a container declared with cpu=1 would have). Its PATH is the image's: no
        rustc of this machine's, only the toolchain the image installs (`image_rust`; this machine's
        stands in for it)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORL_", "MODAL_"))}
        state = read_json(self.app.path)
        return {**env, "PYTHONPATH": str(AUTORL_ROOT), "AUTORL_MODAL_EVAL_CPU": "1", "PATH": self._image_path(),
                "FAKE_MODAL_CLIENT": f"{state['client_pid']}:{state['client_started']}"}

    def _image_path(self) -> str:
        folders = [f for f in os.environ.get("PATH", "").split(os.pathsep) if f and not (Path(f) / "rustc").exists()]
        rustc = shutil.which("rustc")
        if self.image_rust and rustc:
            folders.append(str(Path(rustc).parent))
        return os.pathsep.join(folders)


# ---------------------------------------------------------------- inside a container
def run_container(call_dir: Path, task: str) -> None:
    """One container running one input: the real Modal function, through `.local()`."""
    def cancel_input(signum, frame):  # as modal/_container_entrypoint.py does for a sync function
        raise InputCancellation("Input was cancelled by user")

    def terminate(signum, frame):
        raise SystemExit(143)

    signal.signal(signal.SIGUSR1, cancel_input)
    signal.signal(signal.SIGTERM, terminate)
    pid, started = os.environ["FAKE_MODAL_CLIENT"].split(":")
    threading.Thread(target=_watch_client, args=(int(pid), float(started)), daemon=True).start()

    from orchestrator.runners.modal import functions as modal_functions

    state = read_json(call_dir / "call.json")
    args, kwargs = deserialize((call_dir / "input.pkl").read_bytes(), None)
    result_path = call_dir / f"result-{task}.json"
    try:
        value = getattr(modal_functions, state["function"]).local(*args, **kwargs)
        (call_dir / "output.pkl").write_bytes(serialize(value))
        _write_json(result_path, {"status": "success"})
    except InputCancellation:
        _write_json(result_path, {"status": "terminated", "detail": "cancelled"})
    except KeyboardInterrupt:  # pre-empted: no output, Modal restarts the input elsewhere
        sys.exit(130)
    except SystemExit:
        _write_json(result_path, {"status": "terminated", "detail": "the container was terminated"})
    except Exception as exc:
        (call_dir / "output.pkl").write_bytes(pickle_exception(exc))
        _write_json(result_path, {"status": "failure"})


def _watch_client(pid: int, started: float) -> None:
    """The server noticing its client is gone: the app stops and this container is terminated."""
    while client_alive(pid, started):
        time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGTERM)


# ---------------------------------------------------------------- volumes
class FakeVolume:
    """modal.Volume: durable storage in `storage`. Containers mount it (`mount(path)`: a copy of
    what was committed), see others' changes after `reload()` and publish theirs with `commit()`;
    `listdir` / `read_file` from outside (as `pull` reads) see only what was committed."""

    def __init__(self, storage: Path):
        self.root = Path(storage)
        self.root.mkdir(parents=True, exist_ok=True)
        self.reads: list[str] = []

    def mount(self, path: Path) -> "VolumeMount":
        mount = VolumeMount(self, Path(path))
        mount.reload()
        return mount

    def listdir(self, path: str, *, recursive: bool = False) -> list[FileEntry]:
        base = self.root / path
        if not base.exists():
            raise FileNotFoundError(path)
        paths = sorted(base.rglob("*") if recursive else base.iterdir())
        return [FileEntry(path=p.relative_to(self.root).as_posix(),
                          type=FileEntryType.FILE if p.is_file() else FileEntryType.DIRECTORY,
                          mtime=int(p.stat().st_mtime), size=p.stat().st_size) for p in paths]

    def read_file(self, path: str):
        self.reads.append(path)
        with open(self.root / path, "rb") as f:
            while chunk := f.read(7):
                yield chunk


class VolumeMount:
    """A container's view of a volume at `path`."""

    def __init__(self, volume: FakeVolume, path: Path):
        self.volume, self.path = volume, path

    def commit(self) -> None:
        _replace_tree(self.path, self.volume.root)

    def reload(self) -> None:
        _replace_tree(self.volume.root, self.path)


def _replace_tree(source: Path, dest: Path) -> None:
    """`dest` becomes a copy of `source` (mtimes kept, as a volume keeps them)."""
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
    shutil.copytree(source, tmp, dirs_exist_ok=True) if source.exists() else tmp.mkdir(parents=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


if __name__ == "__main__" and sys.argv[1:2] == ["container"]:
    run_container(Path(sys.argv[2]), sys.argv[3])
