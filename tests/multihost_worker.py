"""One process of the multi-host tests (tests/multihost_launch.py):
`python multihost_worker.py SCENARIO OUT_DIR`, with
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID set for a
multi-process run (unset: one process).

Scenarios: `main` exercises every helper of swirl_jax.distributed and writes
OUT_DIR/result_<process>.json; `bad_shapes` gives host 1 a batch of another
shape and lets the error end the process (`bad_train_batch`: the same
through the trainer's batch placement). The jobs: `simpletir` (two GRPO
iterations, scripted turns through the real sandbox, once for each
setting of SETTINGS, one after another in the same processes, each in
OUT_DIR/<setting>/work: `plain`, `staleness` (1) and `oversample` (3x)),
`simpletir_bytes` (one iteration with turns of about n tokens for each n
of RESPONSE_TOKENS, e.g. `64,256`, in OUT_DIR/work<n>: the bytes the
hosts exchange through swirl_jax.distributed and the trainer's batch, to
OUT_DIR/result_<process>.json by n), `swirl` (stage 1 with the tiny model
-> filter -> stage 2, in OUT_DIR/work) and `stage1` (scripted, 6 batches,
in OUT_DIR/work; PAUSE_S seconds per batch gives a test time to kill a
host mid-run).
"""

import contextlib
import json
import os
import pathlib
import sys
import threading
import time
import zlib

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
from jax.sharding import NamedSharding, PartitionSpec as P

from swirl_jax import distributed  # pylint: disable=g-import-not-at-top
from swirl_jax import sharding  # pylint: disable=g-import-not-at-top

RUN_SEED = 7
DIM = 8
PAIRS = [(f"task{t}", s) for t in range(4) for s in range(4)]


def _rows(share):
  """What a rollout would make of each pair: rows from the pair's seed."""
  x = np.stack([np.random.default_rng(p.seed).normal(size=DIM)
                for p in share]).astype(np.float32)
  y = np.array([np.random.default_rng(p.seed + 1).normal() for p in share],
               np.float32)
  return {"x": x, "y": y}


def _step(w, batch):
  """A train step in miniature: a loss, its gradient, updated weights, and
  a batch-sharded per-row output (like sampled tokens)."""
  def loss_fn(w):
    return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)
  loss, grad = jax.value_and_grad(loss_fn)(w)
  tokens = jnp.argmax(batch["x"] * w[None, :], axis=-1).astype(jnp.int32)
  return loss, w - 0.1 * grad, tokens


def _writer_failure(shared):
  try:
    with distributed.one_writer(f"{shared}/fail.txt") as writing:
      if writing:
        raise OSError("disk full")
  except (OSError, RuntimeError) as e:
    return f"{type(e).__name__}: {e}"
  return ""


def _workdir_errors(out):
  distributed.check_shared_workdir(out / "shared")  # One dir: passes.
  try:  # Each host its own dir: not shared.
    distributed.check_shared_workdir(out / f"own{jax.process_index()}")
  except ValueError as e:
    return str(e)
  return ""


def _to_local_result(mesh) -> dict:
  """A weight sharded over every host's devices, brought to two local
  layouts: its values, and where each result's shards are."""
  w = jax.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8),
                     NamedSharding(mesh, P("data", None)))
  local = jax.local_devices()
  out = {}
  for name, shape in (("tensor2", (1, 2)), ("data2_tensor2", (2, 2))):
    m = sharding.make_mesh([("data", shape[0]), ("tensor", shape[1])],
                           local[:shape[0] * shape[1]])
    y = distributed.to_local(w, NamedSharding(m, P(None, "tensor")))
    out[name] = dict(
        values=np.asarray(y).tolist(), addressable=y.is_fully_addressable,
        devices=sorted(d.id for d in y.devices()),
        shard=list(y.addressable_shards[0].data.shape))
  out["local_ids"] = [d.id for d in local]
  return out


def main_scenario(out: pathlib.Path) -> dict:
  share = distributed.host_share(PAIRS, RUN_SEED)
  mesh = sharding.make_mesh([("data", -1)])
  rows = NamedSharding(mesh, P("data"))
  batch = distributed.global_batch(_rows(share), rows)
  w = jax.device_put(jnp.linspace(-1.0, 1.0, DIM), NamedSharding(mesh, P()))
  loss, new_w, tokens = jax.jit(_step)(w, batch)
  try:
    np.asarray(tokens)
    direct = "ok"
  except RuntimeError:
    direct = "RuntimeError"
  share_ids = np.array([[PAIRS.index((p.task_id, p.sample)), p.seed]
                        for p in share], np.int64)
  stop = np.array([p.seed % 3 for p in share], np.int32)
  gathered = distributed.gather({"pairs": share_ids, "stop": stop})
  shared = out / "shared"
  with distributed.one_writer("log") as writing:
    if writing:
      shared.mkdir(exist_ok=True)
      with open(shared / "log.txt", "a", encoding="utf-8") as f:
        f.write("one line\n")
  return {
      "process": jax.process_index(), "processes": jax.process_count(),
      "devices": jax.device_count(),
      "share": [[p.task_id, p.sample, p.seed] for p in share],
      "all_pairs": gathered["pairs"].tolist(),
      "stop": gathered["stop"].tolist(),
      "loss": float(distributed.to_host(loss)),
      "new_w": distributed.to_host(new_w).tolist(),
      "tokens": distributed.to_host(tokens).tolist(),
      "direct_device_get": direct,
      "log_lines": (shared / "log.txt").read_text().splitlines(),
      "writer_failure": _writer_failure(shared),
      "workdir_error": _workdir_errors(out),
      "to_local": _to_local_result(mesh),
  }


def bad_shapes_scenario() -> None:
  mesh = sharding.make_mesh([("data", -1)])
  # Host 1 ended up with longer rows (as after a sandbox timeout).
  length = 16 if jax.process_index() == 0 else 24
  local = {"tokens": np.zeros((4, length), np.int32)}
  _checking()
  distributed.global_batch(local, NamedSharding(mesh, P("data")))


def _checking() -> None:
  """Marks when the check starts: the test times the check, not start-up."""
  print(f"CHECKING_AT {time.time()}", flush=True)


def bad_train_batch_scenario() -> None:
  """The trainer's path: each host holds the whole (gathered) batch, and
  host 1's rows came out longer (as after a sandbox timeout)."""
  from swirl_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh([("data", -1)])
  length = 16 if jax.process_index() == 0 else 24
  batch = {"tokens": np.zeros((8, length), np.int32),
           "loss_mask": np.ones((8, length), np.int32)}
  rows = step_lib.batch_sharding(mesh, 8)
  _checking()
  step_lib.place_batch(batch, rows)


@contextlib.contextmanager
def _scripted_pairs(loop_cls, pause_s=0.0):
  """Makes `loop_cls.run_pairs` note its pairs (the scripts read them) and
  wait `pause_s` first, until the block ends; yields the list of the
  current pairs."""
  current, real = [], loop_cls.run_pairs

  def run_pairs(self, pairs, **kw):
    time.sleep(pause_s)
    current[:] = pairs
    return real(self, pairs, **kw)

  loop_cls.run_pairs = run_pairs
  try:
    yield current
  finally:
    loop_cls.run_pairs = real


# The settings of the `simpletir` job (SETTINGS names them).
SETTINGS = {"plain": {}, "staleness": dict(staleness=1),
            "oversample": dict(oversample=3.0)}


def simpletir_scenario(work: pathlib.Path, iterations: int = 2,
                       tokens: int = 0, staleness: int = 0,
                       oversample: float = 1.0, **config) -> None:
  """GRPO iterations; per sample k: right, void, wrong, right after an
  output (simpletir_script.py), so rewards vary within each group; each
  turn opens with about `tokens` tokens of reasoning. `staleness` k
  samples k versions behind (with TIS); `oversample` x draws x times the
  prompts, and about every third task's group (by its id's crc32)
  answers wrong throughout: at x = 3 iteration 0 keeps all 6 groups
  (passing, 4 failing, passing), iteration 1 the first 5 (the 2nd passing
  is the 5th), so each host holds another number of kept rows."""
  from swirl_jax.rollout import engine as engine_lib  # pylint: disable=g-import-not-at-top
  from swirl_jax.rollout.scripted import ScriptedSampler  # pylint: disable=g-import-not-at-top
  from swirl_jax.models import loading  # pylint: disable=g-import-not-at-top
  from swirl_jax.simpletir import train  # pylint: disable=g-import-not-at-top
  import simpletir_script  # pylint: disable=g-import-not-at-top
  c = simpletir_script.config()
  c.rollout.update(**config)
  c.num_iterations = iterations
  c.train.export_hf = iterations > 1
  c.train.async_checkpoints = False
  c.staleness = staleness
  c.train.loss.tis_cap = 2.0 if c.staleness else 0.0
  c.oversample = oversample
  if tokens:
    c.sampler.max_cache_len = c.max_seq_len = 4096
  phrase = "Let me think step by step. "
  per = len(loading.load_tokenizer(c.model.tokenizer).encode(phrase))
  think = phrase * (tokens // per)
  with _scripted_pairs(engine_lib.RolloutEngine) as current:

    def script(row, turn):
      task, k = current[row]
      if c.oversample > 1 and zlib.crc32(task.id.encode()) % 3 == 1:
        return "```python\nfinal_answer(-1)\n```\n"  # A failing group.
      return think + simpletir_script.script(task.answer, k, turn)

    train.run(c, str(work),
              make_sampler=lambda p, m, tok: ScriptedSampler(tok, script))


def simpletir_settings_scenario(out: pathlib.Path) -> None:
  """The `simpletir` job once for each setting of SETTINGS, in turn."""
  for name in os.environ.get("SETTINGS", "plain").split(","):
    simpletir_scenario(out / name / "work", **SETTINGS[name])


def _count_host_reads(sent: dict) -> None:
  """Notes in `sent['reads']` the size of every read of device data into
  host memory while `sent['on']`, in any thread: a jax.Array's value
  (`jax.device_get`, `float`, `tolist`, `__array__`) and `np.asarray` /
  `np.array` of one (which on the CPU read its buffer directly)."""
  from jax._src import array as array_lib  # pylint: disable=g-import-not-at-top
  # pylint: disable=protected-access
  real_value, inside = array_lib.ArrayImpl._value, threading.local()

  def value(self):
    if (sent["on"] and self._npy_value is None
        and not getattr(inside, "on", False)):
      sent["reads"].append(int(self.nbytes))
    return real_value.fget(self)

  def reading(real):
    def read(x, *args, **kw):
      if not (sent["on"] and isinstance(x, jax.Array)):
        return real(x, *args, **kw)
      sent["reads"].append(int(x.nbytes))
      inside.on = True
      try:
        return real(x, *args, **kw)
      finally:
        inside.on = False
    return read

  array_lib.ArrayImpl._value = property(value)
  np.asarray, np.array = reading(np.asarray), reading(np.array)


def simpletir_bytes_scenario(out: pathlib.Path) -> dict:
  """For each n of RESPONSE_TOKENS, one after another in this process, one
  iteration with turns of about n tokens: the bytes this host hands to
  swirl_jax.distributed's exchanges from the rollout's start to the end
  of the update (every host-to-host message of the job goes through
  `_allgather`), the size of each read of device data into its memory
  over the same span (`_count_host_reads`), and the batch the trainer
  got; by n."""
  from swirl_jax.rollout import engine as engine_lib  # pylint: disable=g-import-not-at-top
  from swirl_jax.training import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  sent = dict(on=False, bytes=0, calls=0, reads=[])
  _count_host_reads(sent)
  real_gather, real_run = distributed._allgather, engine_lib.RolloutEngine.run_pairs  # pylint: disable=protected-access
  real_update, batches = trainer_lib.Trainer.update, []

  def counted(x, tiled=False):
    if sent["on"]:
      shards = x.addressable_shards if isinstance(x, jax.Array) else None
      sent["bytes"] += (sum(s.data.nbytes for s in shards) if shards
                        else np.asarray(x).nbytes)
      sent["calls"] += 1
    return real_gather(x, tiled)

  def run_pairs(self, pairs, **kw):
    sent["on"] = True
    return real_run(self, pairs, **kw)

  def update(self, batch, extra=None):
    out = real_update(self, batch, extra)
    sent["on"] = False
    batches.append({k: distributed.to_host(v).tolist()
                    for k, v in batch.items() if v is not None})
    return out

  distributed._allgather = counted  # pylint: disable=protected-access
  engine_lib.RolloutEngine.run_pairs = run_pairs
  trainer_lib.Trainer.update = update
  result = {}
  for n in map(int, os.environ["RESPONSE_TOKENS"].split(",")):
    sent.update(on=False, bytes=0, calls=0, reads=[])
    batches.clear()
    work = out / f"work{n}"
    simpletir_scenario(work, iterations=1, tokens=n,
                       max_new_tokens=n + 64, max_response_tokens=2 * n + 128)
    result[str(n)] = dict(
        bytes=sent["bytes"], calls=sent["calls"], reads=list(sent["reads"]),
        batch=batches[0], response_len=json.loads(
            (work / "metrics.jsonl").read_text().splitlines()[0]
        )["response_len"])
  return result


def swirl_scenario(work: pathlib.Path) -> None:
  from swirl_jax.swirl import jobs  # pylint: disable=g-import-not-at-top
  import test_swirl  # pylint: disable=g-import-not-at-top
  c = test_swirl._tiny_config()  # pylint: disable=protected-access
  c.stages = ("stage1", "filter", "rl")
  c.rl_train.async_checkpoints = False
  c.rl_train.loss.kl_coef = 0.05  # Reference log-probs: a global array.
  jobs.run_pipeline(c, str(work))


def stage1_scenario(work: pathlib.Path) -> None:
  """Scripted stage 1 over 6 questions, one question (2 samples) a batch."""
  from swirl_jax.models import loading  # pylint: disable=g-import-not-at-top
  from swirl_jax.rollout import engine as engine_lib  # pylint: disable=g-import-not-at-top
  from swirl_jax.rollout import turns  # pylint: disable=g-import-not-at-top
  from swirl_jax.rollout.scripted import ScriptedSampler  # pylint: disable=g-import-not-at-top
  from swirl_jax.swirl import stage1  # pylint: disable=g-import-not-at-top
  from swirl_jax.tasks import synthetic  # pylint: disable=g-import-not-at-top
  from swirl_jax.tools import registry  # pylint: disable=g-import-not-at-top
  tok = loading.load_tokenizer("bundled")
  tasks = synthetic.arithmetic_tasks(6, seed=2)
  with _scripted_pairs(engine_lib.RolloutEngine,
                       float(os.environ.get("PAUSE_S", "0"))) as current:

    def script(row, turn):
      task, k = current[row]
      return f"<answer>{task.answer if k else 0}</answer>" if turn else \
          "<calculator>1 + 2</calculator>"

    loop = engine_lib.RolloutEngine(
        ScriptedSampler(tok, script), tok,
        registry.build_tools(("calculator",)),
        turns.RolloutConfig(fmt="swirl", max_turns=3))
    stage1.generate(loop, tasks, str(work / "stage1"), samples=2,
                    tasks_per_batch=1)


BAD = {"bad_shapes": bad_shapes_scenario,
       "bad_train_batch": bad_train_batch_scenario}
# Jobs: each writes under OUT_DIR only (most in OUT_DIR/work).
JOBS = {"simpletir": simpletir_settings_scenario,
        "swirl": lambda out: swirl_scenario(out / "work"),
        "stage1": lambda out: stage1_scenario(out / "work")}
RESULTS = {"main": main_scenario, "simpletir_bytes": simpletir_bytes_scenario}


def main():
  scenario, out = sys.argv[1], pathlib.Path(sys.argv[2])
  distributed.initialize(timeout_s=60)
  jax.config.update("jax_default_matmul_precision", "highest")  # conftest's.
  if scenario in BAD:
    try:
      BAD[scenario]()
    except Exception as e:  # The test reads it whole: logging threads of
      # the runtime may write into the middle of the printed traceback.
      (out / f"error_{jax.process_index()}.txt").write_text(
          f"{type(e).__name__}: {e}")
      raise
    return
  if scenario in JOBS:
    JOBS[scenario](out)
    return
  result = RESULTS[scenario](out)
  path = out / f"result_{jax.process_index()}.json"
  path.write_text(json.dumps(result))


if __name__ == "__main__":
  main()
