"""Checkpoints of the train state (orbax), resume, and Hugging Face export.

Layout: `<workdir>/checkpoints/<step>/{state,meta}`. `state` is the
TrainState (params, optimizer state, step, data position, PRNG key) without
the frozen LoRA base, which is rebuilt from the base model on resume; `meta`
is JSON (step, data position, skipped steps, and any `extra` dict, e.g. a
data reader's position), readable with `cat`.

Saves are asynchronous: `save` returns once the arrays are copied off the
devices, and the files are written in the background (each checkpoint goes
to a temporary directory renamed on completion, so a crash mid-write leaves
the previous checkpoint as the latest). Restores go straight into the target
shardings, so no host or device holds more than its shard.

A save that fails (a full disk) removes what it left half written: no
`*.orbax-checkpoint-tmp*` directory outlives the error.

Batches consumed without an optimizer step (`Trainer.skip`: every group
filtered out) change neither the params nor the optimizer state, only the
data position, and a checkpoint is keyed by step: a forced save at the
step of the latest checkpoint (the end of a run) records the newer
position in `<workdir>/checkpoints/data_pos.json` (step, the checkpoint's
own position, the position reached; written atomically once that
checkpoint is on disk), which `restore` applies to that checkpoint alone.

A checkpoint that fails to restore is skipped for the one before it; it is
moved aside to `<workdir>/checkpoints.unreadable/` (never deleted) only once
an older one has restored. If none restores, nothing is moved and the error
lists why each failed.
"""

import contextlib
import datetime
import json
import logging
import pathlib
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp

from swirl_jax import errors, jsonl, paths
from swirl_jax.models import hf_io
from swirl_jax.models.config import ModelConfig
from swirl_jax.training.state import TrainState


class CheckpointError(errors.UserError, RuntimeError):
  """No usable checkpoint where one was expected."""


def abstract_state(state: TrainState, shardings: TrainState) -> TrainState:
  """ShapeDtypeStructs carrying the target shardings (restore targets)."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      state, shardings)


def atomicity(directory: pathlib.Path) -> ocp.options.AtomicityOptions | None:
  """How a save becomes visible: orbax's default for the path (a rename of
  its temporary directory on a local disk), or, on a mounted bucket (where
  a rename copies every object), a commit file written last into the
  step's directory."""
  probe = directory if directory.exists() else directory.parent
  if not paths.on_object_store(probe):
    return None
  return ocp.options.AtomicityOptions(
      mode=ocp.options.AtomicityMode.COMMIT_FILE)


PROGRESS = "data_pos.json"  # Batches skipped after the latest checkpoint.


class Checkpointer:
  """Saves every `every` steps, keeps the last `keep`, resumes the latest."""

  def __init__(self, workdir: str, *, every: int, keep: int = 3,
               async_save: bool = True):
    self.directory = pathlib.Path(workdir) / "checkpoints"
    self.every = max(1, int(every))
    self._mngr = ocp.CheckpointManager(
        self.directory.absolute(),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
            atomicity_options=atomicity(self.directory)))
    self._last = self._mngr.latest_step()
    # The latest checkpoint's data positions: (its own, the one saved with
    # it: batches skipped after it included); None until a save or the
    # restore of the latest checkpoint.
    self._pos: tuple[int, int] | None = None
    self._pending: int | None = None  # Covered by a save being written.
    self._on_disk: int | None = None  # Covered by one known written.

  @property
  def _progress(self) -> pathlib.Path:
    return self.directory / PROGRESS

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def due(self, step: int, *, force: bool = False,
          data_pos: int | None = None) -> bool:
    """Whether `save` at `step` (with `force`; at `data_pos`, when given)
    writes a checkpoint, or, forced at the latest checkpoint's step with
    batches skipped since, the position reached (`data_pos.json`)."""
    if step == self._last:
      return (force and data_pos is not None and self._pos is not None
              and data_pos > self._pos[1])
    last = 0 if self._last is None else self._last  # First: at `every`.
    return force or step // self.every != last // self.every

  def save(self, state: TrainState, *, force: bool = False,
           extra: dict | None = None) -> bool:
    """Saves if a multiple of `every` was reached since the last save;
    forced at the latest checkpoint's step, the data position alone when
    batches were skipped since (`data_pos.json`)."""
    step = int(jax.device_get(state.step))
    data_pos = int(jax.device_get(state.data_pos))
    if not self.due(step, force=force, data_pos=data_pos):
      return False
    if step == self._last:  # No step since: the position alone.
      self._save_progress(step, data_pos)
      return True
    meta = dict(step=step, data_pos=data_pos,
                skipped=int(jax.device_get(state.skipped)),
                time=datetime.datetime.now().isoformat(timespec="seconds"),
                extra=extra or {})
    with self._cleaning_up():
      self._mngr.save(step, force=True, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state.replace(frozen=None)),
          meta=ocp.args.JsonSave(meta)))
    # `save` waited for the one before: that one is on disk.
    self._written(self._pending)
    self._last, self._pos, self._pending = step, (data_pos, data_pos), data_pos
    return True

  def _save_progress(self, step: int, data_pos: int) -> None:
    """`data_pos.json`: the latest checkpoint's step, its own position and
    `data_pos`, written once that checkpoint is on disk (a crash before
    leaves an older checkpoint, to which it does not apply)."""
    self.wait()
    if jax.process_index() == 0:
      jsonl.write_bytes(self._progress, json.dumps(dict(
          step=step, checkpoint_data_pos=self._pos[0],
          data_pos=data_pos)).encode())
    self._pos = (self._pos[0], data_pos)
    self._written(data_pos)

  def _applied_progress(self, step: int, state: TrainState, meta: dict
                        ) -> tuple[TrainState, dict]:
    """`state` (checkpoint `step`'s) at the position `data_pos.json`
    records for that checkpoint, if any: the batches skipped after it;
    `meta['data_pos']` that position, `meta['checkpoint_data_pos']` the
    checkpoint's own."""
    own = int(jax.device_get(state.data_pos))
    meta = {**meta, "checkpoint_data_pos": own}
    if not self._progress.exists():
      return state, meta
    try:
      p = jsonl.read_json(self._progress)
      ours = p["step"] == step and p["checkpoint_data_pos"] == own
      data_pos = int(p["data_pos"])
    except (jsonl.FormatError, KeyError, TypeError, ValueError) as e:
      logging.warning("%s unreadable (%s); resuming at step %d's own data "
                      "position", self._progress, e, step)
      return state, meta
    if not ours or data_pos <= own:  # An older checkpoint's.
      return state, meta
    pos = jax.device_put(state.data_pos + (data_pos - own),
                         state.data_pos.sharding)
    return state.replace(data_pos=pos), {**meta, "data_pos": data_pos}

  def _written(self, data_pos: int | None) -> None:
    if data_pos is not None:
      self._on_disk = max(data_pos, self._on_disk or 0)

  def on_disk(self) -> int | None:
    """The data position of the newest save known to be on disk (an
    asynchronous one counts once written, without waiting for it): no
    resume starts before it. None: no save or restore yet."""
    if self._pending is not None and not self._mngr.is_saving_in_progress():
      self.wait()  # Done: returns at once, or raises its failure.
      self._written(self._pending)
      self._pending = None
    return self._on_disk

  @contextlib.contextmanager
  def _cleaning_up(self):
    """Removes a failed save's temporary directories, then re-raises."""
    try:
      yield
    except BaseException:
      try:
        self._mngr.wait_until_finished()  # Its writes stop first.
      except Exception:  # pylint: disable=broad-except
        pass  # The same fault, raised below.
      if jax.process_index() == 0:
        for tmp in self.directory.glob("*.orbax-checkpoint-tmp*"):
          shutil.rmtree(tmp, ignore_errors=True)
      raise

  def _restore_step(self, step: int, target: TrainState):
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target.replace(frozen=None)),
        meta=ocp.args.JsonRestore()))
    return self._applied_progress(step, out.state, out.meta)

  def _resumed(self, step: int, meta: dict) -> None:
    """After checkpoint `step` restored (`meta` its): if the latest, the
    positions the next saves go from."""
    if step == self._last:
      self._pos = (meta["checkpoint_data_pos"], meta["data_pos"])
      self._written(self._pos[1])

  def restore(self, target: TrainState, *, step: int | None = None,
              frozen: Any = None) -> tuple[TrainState, dict] | None:
    """`(state, meta)` from `step`, or the latest readable one.

    Args:
      target: the state's abstract shapes with shardings
        (`abstract_state`, or `state.state_shardings`' ShapeDtypeStructs).
      step: a given step (an error if it is missing or unreadable); None:
        the newest that restores, or None when there is no checkpoint.
      frozen: the frozen LoRA base to put back into the state.
    """
    steps = self.all_steps()
    if step is not None:
      if step not in steps:
        raise CheckpointError(f"{self.directory}: no checkpoint for step "
                              f"{step}; available: {steps}")
      try:
        state, meta = self._restore_step(step, target)
      except Exception as e:  # orbax / tensorstore raise many types.
        raise CheckpointError(f"{self.directory / str(step)}: cannot restore "
                              f"({type(e).__name__}: {e})") from e
      self._resumed(step, meta)
      return state.replace(frozen=frozen), meta
    failures = []
    for s in reversed(steps):
      try:
        state, meta = self._restore_step(s, target)
      except Exception as e:  # Try the one before it.
        logging.warning("checkpoint %s unreadable (%s); trying the previous",
                        s, e)
        failures.append((s, f"{type(e).__name__}: {e}"))
        continue
      self._set_aside([f for f, _ in failures])
      self._resumed(s, meta)
      return state.replace(frozen=frozen), meta
    if failures:
      lines = "\n".join(f"  step {s}: {why[:500]}" for s, why in failures)
      raise CheckpointError(f"{self.directory}: no checkpoint restores "
                            f"(nothing was moved or deleted):\n{lines}")
    return None

  def _set_aside(self, steps: list[int]) -> None:
    """Moves unreadable checkpoints out of the way, keeping their files."""
    if not steps or jax.process_index() != 0:
      return
    aside = self.directory.with_name(self.directory.name + ".unreadable")
    aside.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for s in steps:
      src = self.directory / str(s)
      dst = aside / f"{s}-{stamp}"
      logging.warning("moving unreadable checkpoint %s to %s", src, dst)
      shutil.move(str(src), str(dst))
    self._mngr.reload()
    self._last = self._mngr.latest_step()
    self._pos = None  # Its restore sets it.

  def wait(self) -> None:
    with self._cleaning_up():
      self._mngr.wait_until_finished()
    self._written(self._pending)
    self._pending = None

  def close(self) -> None:
    with self._cleaning_up():
      self._mngr.wait_until_finished()
    self._mngr.close()


def export_hf(state: TrainState, cfg: ModelConfig, path: str, *,
              lora_cfg=None, tokenizer=None, dtype: str | None = None) -> str:
  """Writes the trained policy (LoRA merged) as a Hugging Face directory."""
  params = state.model_params(lora_cfg)
  return hf_io.export_hf_dir(params, cfg, path, tokenizer=tokenizer,
                             dtype=dtype)
