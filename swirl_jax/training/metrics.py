"""Metric writer: TensorBoard events, `metrics.jsonl`, and a progress bar.

Every metric of every step goes to TensorBoard (tensorboardX) and, as one
JSON object per line, to `<workdir>/metrics.jsonl` (so `tail` or pandas read
a run without TensorBoard). The console gets a tqdm bar with a few key
figures. Only process 0 writes; elsewhere every method is a no-op.

On resume, lines of `metrics.jsonl` past the restored step are dropped, so
the file reads as one uninterrupted run.
"""

import math
import pathlib
from typing import Mapping

import jax
import tqdm

from swirl_jax import jsonl

KEY_FIGURES = ("loss", "grad_norm", "lr", "ratio_max", "skipped")


def _truncate_jsonl(path: pathlib.Path, last_step: int) -> None:
  """Keeps only records with `step <= last_step` (atomic rewrite); a torn
  last line from a crash goes too."""
  if not path.exists():
    return
  records = jsonl.read(path, torn_tail=True)
  jsonl.write(path, [r for r in records if r.get("step", 0) <= last_step])


def _jsonable(v: float) -> float | None:
  return v if math.isfinite(v) else None  # JSON has no NaN / inf.


class MetricWriter:
  """`write(step, metrics)` to TensorBoard, JSONL and the console."""

  def __init__(self, workdir: str, *, total_steps: int | None = None,
               initial_step: int = 0, enabled: bool | None = None,
               tensorboard: bool = True, progress: bool = True,
               key_figures=KEY_FIGURES):
    self.enabled = (jax.process_index() == 0) if enabled is None else enabled
    self._tb = self._bar = self._path = None
    self._keys = key_figures
    if not self.enabled:
      return
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "metrics.jsonl"
    _truncate_jsonl(path, initial_step)
    self._path = path
    if tensorboard:
      # Here, not at the top: tensorboardX imports torch when it is
      # installed (a second), which only writers with TensorBoard pay.
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(str(workdir / "tensorboard"),
                               purge_step=initial_step + 1)
    if progress:
      self._bar = tqdm.tqdm(total=total_steps, initial=initial_step,
                            unit="step", dynamic_ncols=True)

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    values = {k: float(v) for k, v in jax.device_get(dict(metrics)).items()}
    record = {"step": int(step)}
    record.update({k: _jsonable(v) for k, v in sorted(values.items())})
    jsonl.append(self._path, [record])
    if self._tb is not None:
      for k, v in values.items():
        self._tb.add_scalar(k, v, int(step))
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
