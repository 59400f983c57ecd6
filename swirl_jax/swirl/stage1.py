"""SWiRL stage 1: multi-step trajectories with live tools, resumable.

K samples per question at a set temperature, the rollout loop with step
caps, trajectories appended to JSONL shards one batch at a time. A rerun
skips the (question, sample) pairs already on disk, so a killed run loses at
most its in-flight batch and never writes a pair twice.

Several hosts split each batch (`distributed.run_local`); each appends its
own trajectories to its own shards (`shard_N-hostH.jsonl`: one writer per
file) and keeps them, and every host reads all shards at the end. A row's sampling seed comes from the
run seed and its (question, sample) only, so a rerun with another host count
generates the same trajectories.
"""

import collections
import glob
import hashlib
import os
from typing import Sequence

from absl import logging

from swirl_jax import distributed
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout.records import Trajectory, iter_jsonl, write_jsonl
from swirl_jax.tasks import checkers
from swirl_jax.tasks.records import Task

SHARD = "shard_{:05d}.jsonl"  # Several processes: shard_N-hostH.jsonl.


def read_trajectories(directory: str) -> list[Trajectory]:
  """Every trajectory of the shards in `directory` (first copy wins)."""
  seen, out = set(), []
  for path in sorted(glob.glob(os.path.join(directory, "shard_*.jsonl"))):
    for t in iter_jsonl(path, Trajectory):
      if t.id not in seen:
        seen.add(t.id)
        out.append(t)
  return out


def _shard_path(out_dir: str, shard: int) -> str:
  return distributed.host_file(os.path.join(out_dir, SHARD.format(shard)))


def _on_disk(out_dir: str) -> list[Trajectory]:
  """The shards' trajectories, the same on every host (checked): no host
  starts writing before all have read them."""
  done = read_trajectories(out_dir)
  ids = "\n".join(sorted(t.id for t in done))
  distributed.check_same(hashlib.blake2b(ids.encode()).hexdigest(),
                         f"stage 1 trajectories in {out_dir} ({len(done)})")
  return done


def generate(loop: engine_lib.RolloutEngine, tasks: Sequence[Task],
             out_dir: str,
             *, samples: int, tasks_per_batch: int, shard_size: int = 1000,
             progress=None) -> list[Trajectory]:
  """Writes `samples` trajectories per task under `out_dir`; all of them."""
  os.makedirs(out_dir, exist_ok=True)
  done = _on_disk(out_dir)
  have = collections.defaultdict(set)
  for t in done:
    have[t.task_id].add(t.sample_index)
  todo = [(task, k) for task in tasks for k in range(samples)
          if k not in have[task.id]]
  logging.info("stage 1: %d trajectories on disk, %d to generate", len(done),
               len(todo))
  shard = len(done) // shard_size
  per_batch = max(1, tasks_per_batch * samples)

  def run(pairs):  # This host's share of a batch, written to its shard.
    trajs = loop.run_pairs(pairs)
    checkers.score_trajectories(trajs, [t for t, _ in pairs])
    write_jsonl(_shard_path(out_dir, shard), trajs)
    return trajs

  generated = len(done)
  for i in range(0, len(todo), per_batch):
    batch = todo[i:i + per_batch]
    distributed.run_local(run, batch, what="stage 1 rollouts")
    generated += len(batch)
    shard = generated // shard_size
    if progress is not None:
      progress.update(len(batch))
  return _on_disk(out_dir) if todo else done


def easy_tasks(trajs: Sequence[Trajectory], max_calls: int = 1) -> set[str]:
  """Questions some trajectory answered correctly with <= max_calls calls.

  The paper drops questions "answerable in one search"; here that is read
  off stage 1's own samples.
  """
  easy = set()
  for t in trajs:
    calls = sum(1 for turn in t.turns if turn.tool)
    if t.outcome and calls <= max_calls:
      easy.add(t.task_id)
  return easy
