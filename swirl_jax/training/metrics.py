"""Metric writer: `metrics.jsonl`, TensorBoard events, and a progress bar.

Every metric of every step goes, as one JSON object per line, to
`<workdir>/metrics.jsonl` (appended and fsynced: `tail` or pandas read a
run without TensorBoard) and to TensorBoard (tensorboardX). The console
gets a tqdm bar with a few key figures. Only process 0 writes; elsewhere
every method is a no-op.

Exactly once on resume. A record holds the optimizer `step` and the
`iteration` (the batch of data, by position) it belongs to. A run's record
files are `metrics.jsonl` and those its job registers (`RecordFile`, e.g.
SimpleTIR's `rollouts/iter_*.jsonl`). A writer that starts from a
checkpoint which had consumed `done` batches first calls `rewind`: every
record file keeps only the records of iterations before `done`, so the
iterations the run redoes write their records once. TensorBoard is derived
from `metrics.jsonl`: each start writes a fresh events file that opens
as tensorboardX's `SummaryWriter(purge_step=0)` does (a restart at step 0,
on which a running TensorBoard hides what it read from older files with a
step >= 0), replays the kept records there and deletes the older events
files. Every record is flushed as it is written, so a kill loses nothing
`metrics.jsonl` holds.
"""

import dataclasses
import math
import pathlib
import re
import time
import uuid
from typing import Mapping, Sequence

import jax
import tqdm

from swirl_jax import jsonl

KEY_FIGURES = ("loss", "grad_norm", "lr", "ratio_max", "skipped")
EVENTS = "events.out.tfevents."  # TensorBoard's file name prefix.


@dataclasses.dataclass(frozen=True)
class RecordFile:
  """Files a run appends to: `pattern`, a glob under the workdir. A
  record's iteration is its `field`, or, with `per_file`, the last number
  in its file's name (one file per iteration: the file goes whole)."""
  pattern: str
  field: str = "iteration"
  per_file: bool = False


METRICS = RecordFile("metrics.jsonl")


def _keep(record, field: str, done: int, step: int | None) -> bool:
  if field in record:
    return int(record[field]) < done
  # Records without the field (older runs): by optimizer step.
  return step is None or int(record.get("step", 0)) <= step


def rewind(workdir, done: int, *, step: int | None = None,
           files: Sequence[RecordFile] = (METRICS,)) -> int:
  """Drops every record of iterations >= `done` from the run's record files
  (atomic rewrites; a per-iteration file goes whole); records without an
  iteration go when their `step` is past `step`. Returns how many went."""
  work, dropped = pathlib.Path(workdir), 0
  for f in files:
    for path in sorted(work.glob(f.pattern)):
      if not f.per_file:
        dropped += jsonl.rewind(path, lambda r, f=f: _keep(r, f.field, done,
                                                           step))
        continue
      numbers = re.findall(r"\d+", path.name)
      if numbers and int(numbers[-1]) >= done:
        dropped += len(jsonl.read(path, torn_tail=True))
        path.unlink()
  return dropped


def _jsonable(v: float) -> float | None:
  return v if math.isfinite(v) else None  # JSON has no NaN / inf.


class MetricWriter:
  """`write(step, metrics, iteration=)` to JSONL, TensorBoard, console.

  Args:
    done: batches the run's state has consumed (a checkpoint's data
      position); with it, `rewind` runs over `records` at start. None: only
      records past `initial_step` go (writers without iterations).
  """

  def __init__(self, workdir: str, *, total_steps: int | None = None,
               initial_step: int = 0, done: int | None = None,
               records: Sequence[RecordFile] = (),
               enabled: bool | None = None, tensorboard: bool = True,
               progress: bool = True, key_figures=KEY_FIGURES):
    self.enabled = (jax.process_index() == 0) if enabled is None else enabled
    self._tb = self._bar = self._path = None
    self._keys = key_figures
    if not self.enabled:
      return
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    self._path = workdir / METRICS.pattern
    rewind(workdir, float("inf") if done is None else done,
           step=initial_step, files=(METRICS, *records))
    if tensorboard:
      self._tb = _fresh_events(workdir / "tensorboard", self._path)
    if progress:
      self._bar = tqdm.tqdm(total=total_steps, initial=initial_step,
                            unit="step", dynamic_ncols=True)

  def write(self, step: int, metrics: Mapping[str, float],
            iteration: int | None = None) -> None:
    if not self.enabled:
      return
    values = {k: float(v) for k, v in jax.device_get(dict(metrics)).items()}
    record = {"step": int(step)}
    if iteration is not None:
      record["iteration"] = int(iteration)
      values.pop("iteration", None)  # The same number, as a float.
    record.update({k: _jsonable(v) for k, v in sorted(values.items())})
    jsonl.append(self._path, [record])
    if self._tb is not None:
      self._tb.add(record)
      self._tb.flush()
    if self._bar is not None:
      self._bar.n = int(step)
      self._bar.set_postfix({k: f"{values[k]:.4g}" for k in self._keys
                             if k in values}, refresh=False)
      self._bar.refresh()

  def flush(self) -> None:
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if not self.enabled:
      return
    if self._tb is not None:
      self._tb.close()
    if self._bar is not None:
      self._bar.close()


class _Events:
  """TensorBoard events of one writer, written in the calling thread and
  flushed with each record (tensorboardX's SummaryWriter queues events for
  a thread, which its flush does not wait for)."""

  def __init__(self, logdir: pathlib.Path):
    # Here, not at the top: tensorboardX imports torch when it is
    # installed (a second), which only writers with TensorBoard pay.
    # pylint: disable=g-import-not-at-top
    from tensorboardX import event_file_writer
    from tensorboardX.proto import event_pb2, summary_pb2
    from tensorboardX.summary import scalar
    # pylint: enable=g-import-not-at-top
    self._pb, self._summary, self._scalar = event_pb2, summary_pb2, scalar
    logdir.mkdir(parents=True, exist_ok=True)
    self._w = event_file_writer.EventsWriter(  # A unique name: no clash
        str(logdir / "events"), f".{uuid.uuid4().hex[:8]}")  # in a second.
    # What SummaryWriter(purge_step=0) writes after the file version: a
    # restart at step 0, so TensorBoard drops what older files showed.
    self._w.write_event(event_pb2.Event(
        wall_time=time.time(), step=0, session_log=event_pb2.SessionLog(
            status=event_pb2.SessionLog.START)))

  def add(self, record: dict) -> None:
    """One metrics.jsonl record as scalars at its step."""
    values = [v for k, x in record.items() if k != "step" and x is not None
              for v in self._scalar(k, x).value]
    self._w.write_event(self._pb.Event(
        wall_time=time.time(), step=int(record["step"]),
        summary=self._summary.Summary(value=values)))

  def flush(self) -> None:
    self._w.flush()

  def close(self) -> None:
    self._w.close()


def _fresh_events(logdir: pathlib.Path, metrics_path: pathlib.Path):
  """Events on a new file holding `metrics_path`'s records (flushed);
  the older events files deleted once it is."""
  older = sorted(logdir.glob(EVENTS + "*")) if logdir.exists() else []
  tb = _Events(logdir)
  if metrics_path.exists():
    for record in jsonl.iterate(metrics_path, torn_tail=True):
      tb.add(record)
  tb.flush()
  for path in older:
    path.unlink(missing_ok=True)
  return tb
