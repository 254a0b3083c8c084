"""The morning report: statistics against scipy/numpy, a 200-row night under 2 s, `report` after a
real replay run (summary, progress.png, report.html with every description, kept diffs and
failure reasons), and the page rendered in headless Chromium without console errors or network.
"""
from __future__ import annotations

import base64
import json
import math
import logging
import os
import re
import select
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from orchestrator import report
from orchestrator.benchmark.synthetic_night import synthetic_night
from orchestrator.results import ResultsFile, Row, RunFolder
from tests.conftest import FAST, TINY_TRAIN_PY, make_checkout, run_daemon, tiny_train_py, write_replay

TAG = "morning"
CHROMIUM = Path("/usr/bin/chromium")


# ---------------------------------------------------------------- statistics
def test_iqm_is_the_mean_of_the_middle_half():
    rng = np.random.default_rng(3)
    values = rng.normal(100.0, 30.0, 200)
    middle = np.sort(values)[50:150]  # n divisible by 4: exactly the middle half
    assert report.iqm(values) == pytest.approx(middle.mean(), rel=1e-12)
    assert report.iqm(values) == pytest.approx(scipy.stats.trim_mean(values, 0.25), rel=1e-12)
    assert report.iqm([1.0, 2.0, 3.0, 100.0]) == pytest.approx(2.5)


def test_the_gain_ci_counts_seed_noise(tmp_path):
    """A night whose seeds differ a lot: each baseline run's 100 episodes sit tight around its own
    mean (-300 and +100 apart), the best's runs too. Pooling episodes gave a narrow interval far
    from zero; with the seeds as units the interval is as wide as the seeds say, and holds zero."""
    rng = np.random.default_rng(3)
    folder = RunFolder(tmp_path / "results" / "seedy")
    folder.path.mkdir(parents=True)
    folder.config.write_text(json.dumps({"tag": "seedy", "env_id": "Pendulum-v1", "budget_s": 15, "train_seeds": [1, 2],
                                         "confirm_seed": 2, "created": "2026-11-25T22:00:00Z"}))
    results = ResultsFile(folder.results)
    results.create()

    def scored(exp_folder, mean):
        exp_folder.path.mkdir(parents=True, exist_ok=True)
        returns = rng.normal(mean, 5.0, 100)
        exp_folder.eval_json.write_text(json.dumps({"mean": returns.mean(), "se": returns.std() / 10,
                                                    "returns": returns.tolist()}))
        return float(returns.mean())

    base = [scored(folder.exp(0).run(1), -500.0), scored(folder.exp(0).run(2), -200.0)]
    results.append(Row(0, "train", "baseline", "a" * 7, base[0], base[0], description="baseline seed 1"))
    results.append(Row(0, "train", "baseline", "a" * 7, base[1], sum(base) / 2, description="baseline seed 2"))
    best = [scored(folder.exp(1), -150.0), scored(folder.exp(1).confirmation(1), -450.0)]
    results.append(Row(1, "train", "keep", "b" * 7, sum(best) / 2, sum(best) / 2, description="lucky"))
    night = report.load(folder.path)
    low, high = night.ci
    pooled = np.concatenate([json.loads(f.eval_json.read_text())["returns"] for f in
                             (folder.exp(1), folder.exp(1).confirmation(1))])
    baseline_pooled = np.concatenate([json.loads(folder.exp(0).run(k).eval_json.read_text())["returns"] for k in (1, 2)])
    episodes_se = math.sqrt(pooled.var(ddof=1) / pooled.size + baseline_pooled.var(ddof=1) / baseline_pooled.size)
    assert low < night.gain < high and low < 0.0 < high
    assert high - low > 20 * 2 * 1.96 * episodes_se   # the episodes alone claim an interval 20x narrower
    # the interval is the keep rule's: both sides' spread and sigma over 2 pairs of runs (2 df)
    noise = night.noise_estimate
    assert noise.df == 2 and (low, high) == pytest.approx(report.seed_ci(base, best, noise.sigma, noise.df))
    # the page says what the interval is
    text = report.summary_text(night)
    assert "over training seeds" in text
    # degenerate: every run the same score gives a point; no noise measured and one run a side, none
    assert report.seed_ci([500.0, 500.0], [500.0], 0.0, 1) == (0.0, 0.0)
    assert all(np.isnan(report.seed_ci([1.0], [2.0], math.nan, 0)))


# ---------------------------------------------------------------- a 200-row night, synthetic
def test_report_of_200_rows_has_every_row(tmp_path):
    """(How long a refresh of these 200 rows takes is measured by bench/report.py, not here.)"""
    run_dir = synthetic_night(tmp_path / "results" / "big")
    report.refresh(run_dir)
    page = (run_dir / RunFolder.REPORT_HTML).read_text()
    assert page.count("<tr class=") == 200
    assert "boom in exp" in page and "+LR = " in page
    assert (run_dir / RunFolder.PROGRESS_PNG).read_bytes().startswith(b"\x89PNG")


def test_refresh_never_raises(tmp_path, caplog):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / RunFolder.RESULTS).write_text("exp\tnot the header\n1\t2\n")
    with caplog.at_level(logging.WARNING, logger="autorl"):
        report.refresh(broken)
        report.refresh(tmp_path / "missing")
    assert "could not write the report" in caplog.text


# ---------------------------------------------------------------- after a real replay run
CRASH = TINY_TRAIN_PY.replace("out = Path(", "raise RuntimeError('deliberate crash <b>')\nout = Path(", 1)
DESCRIPTIONS = ["less bias", "always push left", "crash on purpose", "no bias at all"]


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """A replay run: keep, discard, crash, keep."""
    base = tmp_path_factory.mktemp("report")
    repo = make_checkout(base / "checkout", TINY_TRAIN_PY)
    replay = write_replay(base / "replay", {
        1: {"candidate/train.py": tiny_train_py(BIAS=0.5), "DESCRIPTION": DESCRIPTIONS[0]},
        2: {"candidate/train.py": tiny_train_py(BIAS=5.0), "DESCRIPTION": DESCRIPTIONS[1]},
        3: {"candidate/train.py": CRASH, "DESCRIPTION": DESCRIPTIONS[2]},
        4: {"candidate/train.py": tiny_train_py(BIAS=0.0), "DESCRIPTION": DESCRIPTIONS[3]},
    })
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", TAG, "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", "2", *FAST, "--grace", "30")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return repo


@pytest.mark.long
def test_report_after_a_replay_run(night):
    proc = run_daemon(night, "report", "--tag", TAG)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = night / "results" / TAG
    rows = ResultsFile(run_dir / RunFolder.RESULTS).read()
    assert [r.status for r in rows] == ["baseline", "baseline", "keep", "discard", "crash", "keep"]
    baseline = (rows[0].score + rows[1].score) / 2
    out = proc.stdout
    assert re.search(rf"baseline\s+{baseline:.2f}", out), out
    assert re.search(r"best\s+500\.00\s+IQM 500\.00\s+exp 4", out), out
    assert "95% CI [" in out and "less bias" in out and "no bias at all" in out
    assert "keep 2, discard 1, crash 1" in out
    assert (run_dir / "progress.png").read_bytes().startswith(b"\x89PNG")

    page = (run_dir / "report.html").read_text()
    for description in DESCRIPTIONS:
        assert description in page
    for exp in (1, 4):  # each kept diff, embedded
        diff = (run_dir / f"exp-{exp:04d}" / "diff.patch").read_text()
        line = next(l for l in diff.splitlines() if l.startswith("+BIAS"))
        assert f'<span class="add">{line}</span>' in page
    assert "RuntimeError: deliberate crash &lt;b&gt;" in page  # the failure's reason, escaped
    assert "<b>'" not in page
    assert not re.search(r"""(src|href)=["'](https?:|//)""", page), "the page must not load anything"

    status = run_daemon(night, "status", "--tag", TAG)
    assert f"report: {run_dir / 'report.html'}" in status.stdout


# ---------------------------------------------------------------- headless Chromium
class DevTools:
    """Chromium driven over --remote-debugging-pipe (fd 3: commands in, fd 4: messages out)."""

    def __init__(self, profile: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends above fd 9, so that placing them at 3 and 4 cannot overwrite one another.
        to_browser_r, from_browser_w = (_above_9(fd) for fd in (to_browser_r, from_browser_w))
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
                 "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}', str(CHROMIUM), *flags],
            pass_fds=(to_browser_r, from_browser_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        reply = self.wait(lambda m: m.get("id") == self._next_id, timeout)
        assert "error" not in reply, f"{method}: {reply['error']}"
        return reply.get("result", {})

    def wait(self, matches, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if matches(message):
                    return message
            left = deadline - time.monotonic()
            assert left > 0, "Chromium did not answer in time"
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                assert chunk, "Chromium closed its DevTools pipe"
                self._buffer += chunk

    def open(self, url: str) -> tuple[str, list[dict]]:
        """Load `url` in a new tab; returns the tab's session and the events of the load."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": 1400, "deviceScaleFactor": 1, "mobile": False}, session=session)
        first = len(self.events)
        self.call("Page.navigate", {"url": url}, session=session)
        self.wait(lambda m: m.get("method") == "Page.loadEventFired" and m.get("sessionId") == session)
        time.sleep(0.5)  # late console messages and requests
        self.call("Runtime.evaluate", {"expression": "1"}, session=session)  # flush what arrived meanwhile
        return session, [e for e in self.events[first:] if e.get("sessionId") == session]

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def _above_9(fd: int) -> int:
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def console_errors(events: list[dict]) -> list[str]:
    found = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif e["method"] == "Runtime.exceptionThrown":
            found.append(p["exceptionDetails"].get("text", "exception"))
        elif e["method"] == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            found.append(p["entry"].get("text", ""))
    return found


def network_requests(events: list[dict]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"
            and not e["params"]["request"]["url"].startswith(("file:", "data:", "about:"))]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (/usr/bin/chromium; CI installs it: "
                                                 "apt-get install chromium)")
@pytest.mark.long  # beside test_report_after_a_replay_run, on the same worker: one night for both
def test_report_renders_in_headless_chromium(night, tmp_path):
    from PIL import Image

    report.write(night / "results" / TAG)
    page = night / "results" / TAG / "report.html"
    # A control page shows that the checks would catch a console error and a network request.
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                       '<img src="http://127.0.0.1:9/x.png"><script>console.error("control error")</script>'
                       "</body></html>")
    browser = DevTools(tmp_path / "profile")
    try:
        _, events = browser.open(control.as_uri())
        assert "control error" in " ".join(console_errors(events))
        assert "http://127.0.0.1:9/x.png" in network_requests(events)

        session, events = browser.open(page.as_uri())
        assert console_errors(events) == []
        assert network_requests(events) == []
        shot = base64.b64decode(browser.call("Page.captureScreenshot", {"format": "png"}, session=session)["data"])
    finally:
        browser.close()
    (tmp_path / "report.png").write_bytes(shot)
    image = np.asarray(Image.open(tmp_path / "report.png").convert("RGB"))
    assert image.shape[0] >= 1000 and image.shape[1] == 1280
    not_white = (image < 240).any(axis=2).mean()
    assert not_white > 0.05, f"the screenshot is nearly blank ({not_white:.1%} of pixels drawn)"
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50  # text, charts and colours, not a flat page
