"""Learning curves read from train.log: the update lines of both training paths (program.md's
format), episodes not finished yet (nan) left out, and the incumbent a kept experiment beat."""
from orchestrator.report.curves import Curve, incumbent_of, read_curve

LOG = """jax-e2e path: jax on cpu (TFRT_CPU_0)
compiled the update in 2.4s (4.7s since the process started)
update 1 steps 2048 sps 1000 return(last 20 episodes) nan kl 0.0000 time 4.9s
update 2 steps 4096 sps 1900 return(last 20 episodes) 21.50 kl 0.0031 time 5.9s
some other line with update 3 steps 9 return(x) 1 time 1s
update 3 steps 8192 sps 41210 return(last 20 episodes) 187.35 kl 0.0123 time 7s
---
env_steps: 8192
"""


def test_update_lines_become_a_curve(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(LOG)
    steps, seconds, returns = read_curve(log)
    assert steps == [4096, 8192] and seconds == [5.9, 7.0] and returns == [21.5, 187.35]
    assert read_curve(tmp_path / "missing.log") == ([], [], [])


def test_a_kept_experiment_is_shown_beside_the_incumbent_it_beat():
    def curve(label, exp, status):
        return Curve(label, exp, status, [1], [1.0], [1.0])

    curves = [curve("baseline 1", 0, "baseline"), curve("baseline 2", 0, "baseline"), curve("exp 1", 1, "discard"),
              curve("exp 2", 2, "keep"), curve("exp 3", 3, "keep"), curve("exp 4", 4, "baseline"),
              curve("exp 5", 5, "keep")]
    assert incumbent_of(curves, curves[3]).label == "baseline 1"
    assert incumbent_of(curves, curves[4]).label == "exp 2"
    assert incumbent_of(curves, curves[6]).label == "exp 4"   # a re-baseline on a new backend


def test_event_files_load_in_tensorboards_own_reader_without_tensorflow(tmp_path):
    """One event file per curve, written once: the return curve by env step, the final score, and
    status/description as text, all readable by tensorboard's EventAccumulator (no TensorFlow here)."""
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from orchestrator.report.tensorboard import event_folder, write_events

    class Folder:
        path = tmp_path

    rows = pd.DataFrame({"exp": [1], "score": [187.5], "time": ["2026-11-24T03:00:00"],
                         "description": ["lr 3e-4 -> 1e-3"], "status": ["keep"]})
    curve = Curve("exp 1", 1, "keep", [2048, 4096], [1.0, 2.0], [21.5, 90.0])
    assert write_events(Folder, rows, [curve]) == 1
    assert write_events(Folder, rows, [curve]) == 0          # written once per row

    events = EventAccumulator(str(event_folder(tmp_path, curve)))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("return")] == [(2048, 21.5), (4096, 90.0)]
    assert [e.value for e in events.Scalars("score")] == [187.5]
    texts = {tag: events.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in ("status", "description")}
    assert texts == {"status": "keep", "description": "lr 3e-4 -> 1e-3"}
