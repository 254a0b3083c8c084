"""The walls around candidate code (orchestrator/sandbox.py) and what run_group guarantees
(orchestrator/processes.py): real processes, a real bubblewrap, real sockets.

The layout mirrors a real run, outside /tmp (the sandbox's /tmp is a private tmpfs, which would
hide a run folder under /tmp for the wrong reason): a checkout with its run folder
`results/night/` (run.json with the held-out seed, results.tsv), the worktree `runs/night/` as
the read-only code snapshot, the output dir `results/night/exp-0001/out/`, and a $HOME with a
secret in it."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from orchestrator import cgroups, processes
from orchestrator.processes import MARKER_VAR, kill_orphaned_group, new_marker, run_group, scrubbed_env
from orchestrator.sandbox import Sandbox, SandboxUnavailable, Walls, python_paths

REPO = Path(__file__).resolve().parents[1]
SANDBOX = Sandbox("auto")
needs_bwrap = pytest.mark.skipif(not SANDBOX.available, reason=f"no sandbox: {SANDBOX.reason}")

PROBE = textwrap.dedent('''\
    """Try everything a score-hungry train.py might; print what worked as JSON."""
    import json, os, sys
    from pathlib import Path
    out = Path(os.environ["AUTORL_OUTPUT_DIR"])
    run_dir = out.parent.parent
    checkout = Path(sys.argv[1])
    result = {}

    def attempt(name, action):
        try:
            value = action()
            result[name] = True if value is None else value
        except OSError as exc:
            result[name] = False

    attempt("read_run_json", lambda: (run_dir / "run.json").read_text())
    attempt("read_home_secret", lambda: (Path.home() / ".ssh" / "id_rsa").read_text())
    attempt("read_checkout_harness", lambda: (checkout / "evaluate.py").read_text())
    attempt("read_repo_harness", lambda: (Path(sys.argv[2]) / "evaluate.py").read_text())
    attempt("list_repo", lambda: sorted(os.listdir(sys.argv[2])))
    attempt("write_snapshot", lambda: Path("planted.py").write_text("x") and None)
    attempt("write_results_tsv", lambda: open(run_dir / "results.tsv", "a").write("1\\tkeep\\n") and None)
    attempt("write_run_json", lambda: (run_dir / "run.json").write_text("{}") and None)
    attempt("mkdir_in_checkout", lambda: (checkout / "results" / "other").mkdir(parents=True))
    attempt("write_output", lambda: (out / "policy.pt").write_text("ok") and None)
    print(json.dumps(result))
''')

DAEMONIZE = textwrap.dedent('''\
    """fork, setsid, fork; the middle exits at once, the grandchild (reparented to init, in its
    own session and group) announces itself and sleeps."""
    import os, sys, time
    token, started, linger = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(started, "w").write(str(os.getpid()))
            os.execvp("sleep", ["sleep", token])
        os._exit(0)
    deadline = time.time() + 20
    while not os.path.exists(started) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(linger)
''')

FILL = textwrap.dedent('''\
    """Write 64 MB into the output dir, 1 MB at a time: one growing file, or many files."""
    import os, sys, time
    out = os.environ["AUTORL_OUTPUT_DIR"]
    chunk = b"x" * (1 << 20)
    for i in range(64):
        with open(os.path.join(out, f"ballast{i if sys.argv[1] == 'many' else 0}"), "ab") as f:
            f.write(chunk)
        time.sleep(0.02)
    open(os.path.join(out, "done"), "w").write("1")
''')

CONNECT = textwrap.dedent('''\
    import socket, sys
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
        print("connected")
    except OSError as exc:
        print(f"blocked: {exc}")
''')

IMPORTS = textwrap.dedent('''\
    import gymnasium, numpy, torch
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    print("imports ok", float(torch.as_tensor(numpy.asarray(obs)).sum()))
''')


@pytest.fixture
def layout(monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="autorl-sandbox-", dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None))
    home = base / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    monkeypatch.setenv("HOME", str(home))
    checkout = base / "checkout"
    run_dir = checkout / "results" / "night"
    out = run_dir / "exp-0001" / "out"
    out.mkdir(parents=True)
    (checkout / "evaluate.py").write_text("# trusted harness\n")
    (run_dir / "run.json").write_text(json.dumps({"eval_seed": 424242}))
    (run_dir / "results.tsv").write_text("exp\tstatus\n")
    snapshot = checkout / "runs" / "night"
    snapshot.mkdir(parents=True)
    for name, text in [("probe.py", PROBE), ("daemonize.py", DAEMONIZE), ("fill.py", FILL),
                       ("connect.py", CONNECT), ("imports.py", IMPORTS)]:
        (snapshot / name).write_text(text)
    yield {"base": base, "home": home, "checkout": checkout, "run_dir": run_dir, "out": out,
           "snapshot": snapshot}
    shutil.rmtree(base, ignore_errors=True)


def walls_for(lay) -> Walls:
    return Walls(cwd=lay["snapshot"], read_only=[lay["snapshot"]], writable=[lay["out"]],
                 hidden=[lay["checkout"], lay["run_dir"], REPO])


def run(lay, args, sandboxed: bool, **kwargs):
    env = scrubbed_env({"AUTORL_OUTPUT_DIR": str(lay["out"])})
    log = lay["base"] / "log.txt"
    log.write_text("")
    extra = {"walls": walls_for(lay), "sandbox": SANDBOX} if sandboxed else {}
    result = run_group([sys.executable, *args], lay["snapshot"], env, log, 60, lambda: False,
                       **extra, **kwargs)
    return result, log.read_text()


def alive(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == ["sleep", token] and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def fresh_token() -> str:
    return f"{4000 + os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"


# ---------------------------------------------------------------- the walls
@needs_bwrap
def test_inside_the_walls_only_the_output_dir_is_reachable(layout):
    args = ["probe.py", str(layout["checkout"]), str(REPO)]
    outside, log = run(layout, args, sandboxed=False)
    seen_outside = json.loads(log.strip().splitlines()[-1])
    # The control: unwalled, the same script reaches everything.
    assert seen_outside["read_run_json"] and seen_outside["read_home_secret"]
    assert seen_outside["write_results_tsv"] and seen_outside["read_repo_harness"]
    (layout["snapshot"] / "planted.py").unlink()
    (layout["out"] / "policy.pt").unlink()
    (layout["run_dir"] / "run.json").write_text(json.dumps({"eval_seed": 424242}))
    (layout["run_dir"] / "results.tsv").write_text("exp\tstatus\n")

    result, log = run(layout, args, sandboxed=True)
    assert result.sandboxed and result.returncode == 0, log
    seen = json.loads(log.strip().splitlines()[-1])
    for forbidden in ("read_run_json", "read_home_secret", "read_checkout_harness", "read_repo_harness",
                      "write_snapshot", "write_results_tsv", "write_run_json", "mkdir_in_checkout"):
        assert seen[forbidden] is False, (forbidden, seen)
    assert seen["write_output"] is True
    assert (layout["out"] / "policy.pt").read_text() == "ok"
    # The venv inside the checkout is bound exactly: nothing else of the checkout shows.
    venv_parts = {Path(p).relative_to(REPO).parts[0] for p in python_paths() if Path(p).is_relative_to(REPO)}
    assert set(seen["list_repo"] or []) <= venv_parts
    assert json.loads((layout["run_dir"] / "run.json").read_text()) == {"eval_seed": 424242}
    assert (layout["run_dir"] / "results.tsv").read_text() == "exp\tstatus\n"
    assert not (layout["snapshot"] / "planted.py").exists()


@needs_bwrap
def test_no_network_inside_the_walls(layout):
    server = socket.create_server(("127.0.0.1", 0))
    try:
        port = str(server.getsockname()[1])
        _, log = run(layout, ["connect.py", port], sandboxed=False)
        assert log.strip() == "connected"
        _, log = run(layout, ["connect.py", port], sandboxed=True)
        assert log.startswith("blocked"), log
    finally:
        server.close()


@needs_bwrap
def test_the_python_environment_works_inside(layout):
    result, log = run(layout, ["imports.py"], sandboxed=True)
    assert result.returncode == 0 and result.sandboxed, log
    assert "imports ok" in log


# ---------------------------------------------------------------- nothing outlives run_group
@pytest.mark.parametrize("containment", ["sandbox", "cgroup", "marker"])
def test_a_double_forked_setsid_daemon_dies_with_its_command(layout, monkeypatch, containment):
    if containment == "sandbox" and not SANDBOX.available:
        pytest.skip(f"no sandbox: {SANDBOX.reason}")
    if containment == "cgroup" and cgroups.cgroup_base() is None:
        pytest.skip("no writable cgroup v2 subtree here")
    if containment == "marker":
        monkeypatch.setattr(cgroups, "cgroup_base", lambda: None)
    token = fresh_token()
    started = layout["out"] / "started"
    result, log = run(layout, ["daemonize.py", token, str(started), "0"], sandboxed=containment == "sandbox")
    assert result.returncode == 0, log
    assert started.exists(), "the grandchild never ran"
    assert alive(token) == []


@needs_bwrap
def test_killing_the_recorded_group_ends_a_sandboxed_tree(layout):
    """After kill -9 of the daemon, --resume kills the recorded group: bwrap leads it, and the
    setsid'ed grandchild inside its PID namespace dies with it."""
    token = fresh_token()
    started = layout["out"] / "started"
    cmd = SANDBOX.wrap([sys.executable, "daemonize.py", token, str(started), "60"], walls_for(layout))
    proc = subprocess.Popen(cmd, cwd=layout["snapshot"], env=scrubbed_env({"AUTORL_OUTPUT_DIR": str(layout["out"])}),
                            start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while not alive(token) and time.time() < deadline:
            time.sleep(0.05)
        assert alive(token), "the grandchild never ran"
        assert kill_orphaned_group(proc.pid, [layout["snapshot"]]) >= 1
        proc.wait(timeout=5)
        deadline = time.time() + 5
        while alive(token) and time.time() < deadline:
            time.sleep(0.05)
        assert alive(token) == []
    finally:
        processes.kill_group(proc.pid)
        proc.wait()


def test_an_escapee_without_sandbox_is_found_by_its_marker(layout, monkeypatch):
    monkeypatch.setattr(cgroups, "cgroup_base", lambda: None)
    token, marker = fresh_token(), new_marker()
    started = layout["out"] / "started"
    env = scrubbed_env({"AUTORL_OUTPUT_DIR": str(layout["out"]), MARKER_VAR: marker})
    proc = subprocess.Popen([sys.executable, "daemonize.py", token, str(started), "0"], cwd=layout["snapshot"],
                            env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    proc.wait(timeout=20)  # the group is gone; the grandchild lives on in its own session
    try:
        assert started.exists() and len(alive(token)) == 1
        assert kill_orphaned_group(proc.pid, [layout["snapshot"]], marker=marker) == 1
        assert alive(token) == []
    finally:
        for leftover in alive(token):
            leftover.kill()


# ---------------------------------------------------------------- the output cap
@pytest.mark.parametrize("files", ["one", "many"])
@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandbox"])
def test_writing_past_the_output_cap_kills_the_command(layout, files, sandboxed):
    if sandboxed and not SANDBOX.available:
        pytest.skip(f"no sandbox: {SANDBOX.reason}")
    cap = 8 << 20
    result, log = run(layout, ["fill.py", files], sandboxed=sandboxed,
                      output_dir=layout["out"], max_output_bytes=cap)
    assert result.output_exceeded and result.output_bytes > cap
    assert result.returncode != 0 and not (layout["out"] / "done").exists(), log
    assert result.output_bytes < 48 << 20  # stopped on the way, not after the 64 MB


def test_output_within_the_cap_is_fine(layout):
    result, _ = run(layout, ["fill.py", "many"], sandboxed=False, output_dir=layout["out"],
                    max_output_bytes=100 << 20)
    assert result.returncode == 0 and not result.output_exceeded
    assert result.output_bytes == (64 << 20) + 1


# ---------------------------------------------------------------- modes
def test_modes():
    walls = Walls(cwd=Path("/usr"))
    assert Sandbox("off").wrap(["true"], walls) == ["true"]
    assert not Sandbox("off").active and "sandbox off" in Sandbox("off").describe()
    with pytest.raises(ValueError):
        Sandbox("sometimes")
    missing = Sandbox("auto", bwrap="/nonexistent/bwrap")
    assert not missing.available and "bwrap" in missing.reason
    assert missing.wrap(["true"], walls) == ["true"]
    assert missing.describe().startswith("no sandbox:")
    with pytest.raises(SandboxUnavailable, match="require"):
        Sandbox("require", bwrap="/nonexistent/bwrap")


@needs_bwrap
def test_wrap_refuses_a_cwd_outside_the_walls(layout):
    with pytest.raises(ValueError, match="not under a bound path"):
        SANDBOX.wrap(["true"], Walls(cwd=layout["run_dir"], writable=[layout["out"]]))
    # One file of a folder can be shown without the folder (the harness copy in the run folder).
    harness = layout["run_dir"] / "evaluate.py"
    harness.write_text("print(open(__file__).read().strip()); import os; print(sorted(os.listdir(os.path.dirname(__file__))))\n")
    done = subprocess.run(SANDBOX.wrap([sys.executable, str(harness)], Walls(cwd=Path("/tmp"), read_only=[harness])),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['evaluate.py']"
    argv = SANDBOX.wrap(["true"], walls_for(layout))
    assert argv[0].endswith("bwrap") and argv[-2:] == ["--", "true"]
    assert str(layout["run_dir"]) not in argv and str(layout["home"] / ".ssh") not in argv


def test_empty_cgroups_left_by_a_killed_daemon_are_pruned():
    base = cgroups.cgroup_base()
    if base is None:
        pytest.skip("no writable cgroup v2 subtree here")
    stale, fresh = base / f"{cgroups.CGROUP_PREFIX}test-stale", base / f"{cgroups.CGROUP_PREFIX}test-fresh"
    try:
        stale.mkdir()
        fresh.mkdir()
        old = time.time() - 2 * cgroups.STALE_CGROUP_S
        os.utime(stale, (old, old))
        cgroups.prune_cgroups()
        assert not stale.exists() and fresh.exists()
    finally:
        for cgroup in (stale, fresh):
            if cgroup.exists():
                cgroup.rmdir()
