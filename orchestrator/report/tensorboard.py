"""TensorBoard event files of the night: `results/<tag>/tensorboard/exp-NNNN/` (baseline runs:
`exp-0000-run-N/`), each holding an experiment's learning curve (`return` against env steps, the
points' wall times those of train.py's own clock from the row's end) and its final `score`, with
`status` and `description` as text, so that

    tensorboard --logdir results/<tag>/tensorboard

compares the experiments live during the night. Written with the tensorboard package's own event
writer and summary protos, once per finished row (a folder that has its event file is left alone).
Without the tensorboard package nothing is written (the report says nothing of it either).
"""
from __future__ import annotations

import math
from pathlib import Path

from .curves import Curve
from .night import parse_time

FOLDER = "tensorboard"


def event_folder(run_dir: Path, curve: Curve) -> Path:
    name = f"exp-{curve.exp:04d}"
    if curve.label.startswith("baseline "):
        name += f"-run-{curve.label.split()[-1]}"
    return Path(run_dir) / FOLDER / name


def write_events(folder, rows, curves: list[Curve]) -> int:
    """Write the event files of the curves whose experiment has no folder yet; returns how many."""
    todo = [c for c in curves if not any(event_folder(folder.path, c).glob("events.out.tfevents.*"))]
    if not todo:
        return 0
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        return 0
    written = 0
    for curve in todo:
        target = event_folder(folder.path, curve)
        row = rows[rows.exp == curve.exp].iloc[-1]
        end = parse_time(row.time) or 0.0
        last = max((s for s in curve.seconds if s == s), default=0.0)
        writer = EventFileWriter(str(target))
        try:
            for steps, seconds, value in zip(curve.steps, curve.seconds, curve.returns):
                wall = end - (last - seconds) if seconds == seconds else end
                writer.add_event(Event(wall_time=wall, step=int(steps), summary=_scalar("return", value)))
            final_step = int(curve.steps[-1]) if curve.steps else 0
            score = row.score if curve.exp > 0 else _baseline_score(folder, curve)
            if score is not None and not (isinstance(score, float) and math.isnan(score)):
                writer.add_event(Event(wall_time=end, step=final_step, summary=_scalar("score", float(score))))
            for tag, text in (("status", str(curve.status)), ("description", str(row.description))):
                writer.add_event(Event(wall_time=end, step=final_step, summary=_text(tag, text)))
        finally:
            writer.close()
        written += 1
    return written


def _scalar(tag: str, value: float):
    """A scalar as a simple_value: what every TensorBoard reader loads. (tensorboard's own
    summary.v1 helpers import TensorFlow, which autorl does not install.)"""
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])


def _text(tag: str, text: str):
    """A string tensor tagged for TensorBoard's text plugin (the proto its text_pb would write)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.compat.proto.types_pb2 import DT_STRING

    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    tensor = TensorProto(dtype=DT_STRING, string_val=[text.encode()], tensor_shape=TensorShapeProto())
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])


def _baseline_score(folder, curve: Curve):
    """A baseline run's own score (its eval.json), not the rows' running mean."""
    from ..results import ExpFolder, read_json

    run = int(curve.label.split()[-1])
    return read_json(ExpFolder(folder.path / "exp-0000").run(run).eval_json).get("mean")
