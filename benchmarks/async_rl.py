r"""SimpleTIR wall time per iteration: synchronous against staleness 1.

The SimpleTIR CPU demo's workload (configs/simpletir_demo.py: the "mini"
policy, 16 prompts x 8 samples, 5 turns of up to 48 tokens, 320 a
trajectory, the sandbox; two optimizer steps of 64 rows an iteration,
the trainer's log-probs and TIS), run by `simpletir.train.run` twice in
one run: `staleness=0` (sample, then train) and `staleness=1` (iteration
i + 1 sampled with the policy after i iterations while the trainer
updates), same seeds, model, config and machine. Turns are replayed from
the demo's recorded rollout (benchmarks/data/simpletir_demo_turns.json,
as benchmarks/rollout.py replays them: each turn samples exactly its
recorded length with the model, then acts as recorded, its code run in
the sandbox), so rollouts cost what the demo's cost without its warm
start. Every row trains (group filters off: a random policy's rewards
are all 0, which would leave nothing to update).

Separate cores. XLA:CPU runs all of a process's computations on one
thread pool, sized to the process's cores when JAX starts; pinning a
Python thread confines nothing it dispatches. So the generator's stage
(`stages.collect`: the sampler, the rollout engine, the checker) runs in
a child process pinned to its cores (`--generator-cpus`, default the
second half), the sandboxes beside it, and the trainer in this process
on the others (`--trainer-cpus`); each policy version goes to the child
as arrays, its trajectories come back as records. Both arms use the same
split: the synchronous one waits for the child, the asynchronous one
does not.

Figures (seconds, means over the iterations after `--warmup`, which
compile): `sync_iteration_s` and `async_iteration_s` (wall time per
iteration), `t_generate` (the collect stage, this process's wait for the
child included) and `t_train` (the rest of a synchronous iteration:
score, select, record, batch, log-probs, update, publishing the policy),
both from the synchronous arm; `ceiling` = (t_generate + t_train) /
max(t_generate, t_train), the most overlapping the two could gain here;
`speedup` = sync / async; `of_ceiling` = speedup / ceiling. Both arms
must train the same number of rows (checked). Prints a summary, then one
JSON line.

  python benchmarks/async_rl.py [--iterations=6] [--warmup=2]
      [--prompts=16] [--group=8] [--trainer-cpus=0,1] [--generator-cpus=2,3]
"""

import argparse
import json
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def _cpus(text: str | None, default) -> set[int]:
  return {int(x) for x in text.split(",")} if text else set(default)


def config(a):
  """The demo's config, sized by the flags, for a random "mini" policy."""
  # pylint: disable=g-import-not-at-top
  from swirl_jax import config_lib
  c = config_lib.load_config_module(
      str(ROOT / "configs" / "simpletir_demo.py")).get_config("")
  c.warmstart.enabled = False
  c.prompts_per_step, c.grpo.group_size = a.prompts, a.group
  c.grpo.update(filter_void=False, mask_overlong=False,
                drop_zero_variance=False, accuracy_band=(0.0, 1.0))
  c.num_iterations = a.iterations
  c.void_grad_every = 0
  c.train.loss.tis_cap = 2.0  # Staleness 1 needs it; both arms use it.
  c.train.mini_batch_size = min(c.train.mini_batch_size,
                                a.prompts * a.group)
  c.train.update(checkpoint_every=10 ** 6, tensorboard=False,
                 progress=False, export_hf=False)
  return c


def _engine_class(tasks, group: int):
  """`RolloutEngine` replaying the demo's recorded turns, EOS and stop
  strings off (each turn samples its recorded length)."""
  # pylint: disable=g-import-not-at-top
  import rollout as rollout_bench
  from swirl_jax.rollout import engine as engine_lib
  from swirl_jax.rollout.scripted import replaying
  lengths, act = rollout_bench.replayed(
      str(rollout_bench.RECORDED),
      [f"{t.id}/{k}" for t in tasks for k in range(group)])

  class Replayed(replaying(engine_lib.RolloutEngine, lengths, act)):

    def __init__(self, *args, **kw):
      super().__init__(*args, **kw)
      self.stops = ()

  return Replayed


def _sampler_config(c):
  # pylint: disable=g-import-not-at-top
  from swirl_jax.sampling.sampler import SamplerConfig
  return SamplerConfig.from_config(dict(c.sampler, eos_ids=()))


def generator_main(conn, a, cpus, tool_cpus) -> None:
  """The child: builds the collect stage's sampler, engine and tools, then
  answers (iteration, version, params) with that iteration's records."""
  os.sched_setaffinity(0, cpus)  # Before JAX starts: its pool's size.
  # pylint: disable=g-import-not-at-top
  import jax
  import ml_collections
  from swirl_jax import warmstart
  from swirl_jax.models import loading
  from swirl_jax.rollout import turns
  from swirl_jax.rollout.engine import EngineConfig, Policy
  from swirl_jax.sampling.sampler import Sampler
  from swirl_jax.simpletir import grpo, oversample, stages, train
  from swirl_jax.tasks import datasets
  from swirl_jax.tools import registry
  c = config(a)
  c.staleness = 1  # Trajectories stamped with their version (both arms).
  c = train.resolve(c)
  tasks = datasets.load_tasks(c.data.train, c.data.train_split,
                              c.data.data_dir or None)
  cfg, params, tok = loading.load_policy(warmstart.model_config(c, ""))
  tools = registry.from_config(ml_collections.ConfigDict(
      dict(c.tools, sandbox_cpus=tool_cpus)))
  sampler = Sampler(params, cfg, tok, _sampler_config(c))
  engine = _engine_class(tasks, a.group)(
      sampler, tok, tools, turns.RolloutConfig.from_config(c.rollout),
      EngineConfig.from_config(c.engine))
  drawn = max(c.prompts_per_step, oversample.prompts_drawn(
      c.prompts_per_step, c.oversample))
  loop = stages.Loop(c, pathlib.Path("."), tasks, drawn, None, sampler,
                     engine, grpo.GroupConfig.from_config(c.grpo), None, tok,
                     tools)
  while (msg := conn.recv()) is not None:
    it, version, tree = msg
    policy = Policy(version, sampler.local_params(jax.device_put(tree)))
    trajs = stages.collect(loop, it, lambda: policy)
    conn.send([t.to_json() for t in trajs])


def _receive(conn, child):
  """The child's answer; an error if it died instead."""
  while not conn.poll(1.0):
    if not child.is_alive():
      raise RuntimeError(f"the generator process died ({child.exitcode})")
  return conn.recv()


def run_arm(a, staleness: int, conn, child, workdir) -> dict:
  """One `train.run` at `staleness`, its collect stage in the child;
  per-iteration wall times and collect times."""
  # pylint: disable=g-import-not-at-top
  import jax
  import numpy as np
  from swirl_jax.rollout.records import Trajectory
  from swirl_jax.sampling.sampler import Sampler
  from swirl_jax.simpletir import stages, train
  walls, collects, rows = {}, {}, []
  real = stages.collect, stages.iteration, stages.update

  def collect(loop, it, feed):
    del loop
    t0, p = time.perf_counter(), feed()
    conn.send((it, p.version, jax.tree.map(np.asarray, p.params)))
    out = [Trajectory.from_json(x) for x in _receive(conn, child)]
    collects[it] = time.perf_counter() - t0
    return out

  def iteration(loop, gen, it):
    t0 = time.perf_counter()
    real[1](loop, gen, it)
    walls[it] = (t0, time.perf_counter())

  def update(loop, gen, batch, stats):
    rows.append(stats["rows_in_loss"])
    return real[2](loop, gen, batch, stats)

  stages.collect, stages.iteration, stages.update = collect, iteration, update
  try:
    c = config(a)
    c.staleness = staleness
    train.run(c, str(workdir), make_sampler=lambda p, m, tok: Sampler(
        p, m, tok, _sampler_config(c)))
  finally:
    stages.collect, stages.iteration, stages.update = real
  return dict(walls=walls, collects=collects, rows=rows)


def summarise(a, sync: dict, fast: dict) -> dict:
  """The figures of the module docstring from the two arms' timings."""
  its = range(a.warmup, a.iterations)
  span = lambda arm: (arm["walls"][its[-1]][1] - arm["walls"][
      a.warmup - 1][1]) / len(its) if a.warmup else (
          arm["walls"][its[-1]][1] - arm["walls"][0][0]) / len(its)
  sync_s, async_s = span(sync), span(fast)
  t_gen = sum(sync["collects"][i] for i in its) / len(its)
  t_train = sum(sync["walls"][i][1] - sync["walls"][i][0]
                for i in its) / len(its) - t_gen
  ceiling = (t_gen + t_train) / max(t_gen, t_train)
  speedup = sync_s / async_s
  return dict(sync_iteration_s=sync_s, async_iteration_s=async_s,
              t_generate=t_gen, t_train=t_train, ceiling=ceiling,
              speedup=speedup, of_ceiling=speedup / ceiling)


def main(argv=None):
  p = argparse.ArgumentParser()
  for name, default in (("iterations", 6), ("warmup", 2), ("prompts", 16),
                        ("group", 8)):
    p.add_argument(f"--{name}", type=int, default=default)
  p.add_argument("--trainer-cpus", default="")
  p.add_argument("--generator-cpus", default="")
  a = p.parse_args(argv)
  if not 0 <= a.warmup < a.iterations:
    raise SystemExit("need 0 <= --warmup < --iterations")
  cpus = sorted(os.sched_getaffinity(0))
  half = max(1, len(cpus) // 2)
  trainer_cpus = _cpus(a.trainer_cpus, cpus[:half])
  generator_cpus = _cpus(a.generator_cpus, cpus[half:] or cpus)
  os.sched_setaffinity(0, trainer_cpus)  # Before JAX starts here too.
  ctx = multiprocessing.get_context("spawn")
  conn, child_conn = ctx.Pipe()
  child = ctx.Process(target=generator_main, args=(
      child_conn, a, generator_cpus, tuple(sorted(generator_cpus))))
  child.start()
  try:
    with tempfile.TemporaryDirectory() as tmp:
      sync = run_arm(a, 0, conn, child, pathlib.Path(tmp) / "sync")
      fast = run_arm(a, 1, conn, child, pathlib.Path(tmp) / "async")
  finally:
    conn.send(None)
    child.join()
  if sync["rows"] != fast["rows"]:
    raise SystemExit(f"the arms trained different rows: {sync['rows']} "
                     f"vs {fast['rows']}")
  res = dict(summarise(a, sync, fast), iterations=a.iterations,
             warmup=a.warmup, prompts=a.prompts, group=a.group,
             trainer_cpus=sorted(trainer_cpus),
             generator_cpus=sorted(generator_cpus),
             load=os.getloadavg()[0])
  print(f"sync {res['sync_iteration_s']:.2f}s / iteration, staleness 1 "
        f"{res['async_iteration_s']:.2f}s: speedup {res['speedup']:.2f}x "
        f"of a ceiling {res['ceiling']:.2f}x ({res['of_ceiling']:.0%}); "
        f"generate {res['t_generate']:.2f}s, train {res['t_train']:.2f}s")
  print(json.dumps(res))


if __name__ == "__main__":
  main()
