"""A synthetic night's run folder, every status in it: what the morning report's test reads and
bench/report.py times a refresh of."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from orchestrator.results import ResultsFile, Row, RunFolder


def synthetic_night(run_dir: Path, rows: int = 200) -> Path:
    """A HalfCheetah night of `rows` rows at run_dir: two baselines, then keeps with their diffs,
    discards, a crash every 20 rows with its traceback and a translate keep every 50."""
    rng = np.random.default_rng(0)
    folder = RunFolder(run_dir)
    folder.path.mkdir(parents=True)
    folder.config.write_text(json.dumps({"tag": run_dir.name, "env_id": "HalfCheetah-v5", "budget_s": 720,
                                         "eval_episodes": 100, "agent": "anthropic", "branch": "autorl/x",
                                         "created": "2026-11-21T22:00:00Z"}))
    results = ResultsFile(folder.results)
    results.create()

    def scored(exp_folder, mean):
        exp_folder.path.mkdir(parents=True, exist_ok=True)
        returns = rng.normal(mean, 300.0, 100)
        exp_folder.eval_json.write_text(json.dumps({"mean": returns.mean(), "returns": returns.tolist()}))
        return float(returns.mean())

    best = 0.0
    for i in range(rows):
        exp, stamp = max(0, i - 1), f"2026-11-{22 + i // 96}T{i % 96 // 4:02d}:{i % 4 * 15:02d}:00Z"
        folder.exp(exp).path.mkdir(parents=True, exist_ok=True)
        if i < 2:
            score = scored(folder.exp(0).run(i + 1), 1500.0)
            best = score if i == 0 else (best + score) / 2
            results.append(Row(0, "train", "baseline", "a" * 7, score, best, 10**6, 1200.0, 800.0, 0.0,
                               f"baseline seed {i + 1}", stamp))
        elif i % 20 == 5:
            folder.exp(exp).failure.write_text(f"Traceback ...\nRuntimeError: boom in exp {exp}\n")
            results.append(Row(exp, "train", "crash", f"{exp:07x}", None, best, None, None, 60.0, 0.1,
                               f"idea {exp} [train.py exited with 1: RuntimeError]", stamp))
        elif i % 50 == 7:
            folder.exp(exp).translate.write_text(json.dumps({"speedup": 3.5, "ratio": 40.0, "adapter_sps": 9e4}))
            results.append(Row(exp, "translate", "keep", f"{exp:07x}", None, best, None, 2e5, 300.0, 0.3,
                               f"translate to JAX {exp} [verified L1-L3]", stamp))
        else:
            score = scored(folder.exp(exp), best + rng.normal(-100.0, 150.0))
            status = "keep" if score > best else "discard"
            if status == "keep":
                best = score
                folder.exp(exp).diff.write_text(f"--- a/candidate/train.py\n+++ b/candidate/train.py\n"
                                                f"-LR = 3e-4\n+LR = {exp}e-4\n")
            results.append(Row(exp, "train", status, f"{exp:07x}", score, best, 10**6, 1300.0, 800.0, 0.2,
                               f"idea {exp}", stamp))
    return run_dir
