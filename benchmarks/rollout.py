r"""Rollout wall time: the lock-step loop against the engine, one workload.

A SimpleTIR-shaped workload run through the lock-step schedule of
tests/lockstep.py (every turn waits for its longest row, then for every
tool call of the batch) and `engine.RolloutEngine` (continuous batching,
tools beside decode), same model, page pool, programs' kernels, tasks,
seed and sandbox, in one run. The model is the SimpleTIR CPU
demo's "mini" policy shape (random weights, the bundled vocabulary); EOS
and stop strings are off and each turn samples exactly its replayed length
(per-row `max_new_tokens`), so decode costs what it costs at those lengths.
Every tool call runs in the real sandbox (tools/sandbox.py).

Turns are replayed from a recorded SimpleTIR rollout: the last iteration
of the CPU demo (configs/simpletir_demo.py, seed 0), kept as per-turn
lengths and parsed actions in benchmarks/data/simpletir_demo_turns.json
(128 trajectories, 3.6 turns and 20.5 tokens a turn on average; `--record
ROLLOUTS_JSONL` rewrites it from another run). Each benchmark trajectory
replays one recorded trajectory: its turns' lengths, and its code, run in
the sandbox. `--replay=''` generates lengths instead, from the demo's
settings (5 turns, 48 new tokens a turn, 320 a trajectory): turns per
trajectory 1-5 with weights (.2, .35, .25, .12, .08), per-turn lengths
log-normal (median 18 tokens, sigma 0.8) clipped to 4..48, each turn but
the last running a Python snippet, the last answering (half of them
through `final_answer(...)` in code).

Both sides run the workload twice; the second run is timed (the first
compiles, and the engine precompiles its whole program set);
`timed_compiles` counts the XLA compiles inside the timed runs. Then each
side runs once more with every observation replayed from the timed run
(same trajectories, tools taking no time): the engine's wall time there is
a floor for its wall time with tools. Where tools and decode share the
machine's cores, its CPU time plus the tools' (`tools_cpu_s`: the
sandboxes' CPU seconds in the lock-step run, read from /proc/stat) over
the cores is another floor; with `--split-cores`, the tools' CPU time over
their cores is. `ceiling_speedup` is the lock-step wall time over the higher floor
that applies: the most the engine could gain in this run. `--split-cores`
runs decode on one core and the sandboxes on the others, as decode runs
on the chip and tools on the host's CPUs on an accelerator host.
Prints a summary, then one JSON line.

  python benchmarks/rollout.py [--prompts=8] [--group=4] [--slots=32]
      [--pages=0] [--decode-batch=16] [--chunk-steps=8] [--temperature=0]
      [--replay=F] [--split-cores]

`--pages` sizes the engine's page pool (0: every row at the cache's
limit); a smaller pool makes the engine preempt rows and recompute them
(`engine_preempted`, `engine_recomputed_tokens`).
"""

import argparse
import collections
import json
import os
import pathlib
import resource
import sys
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # The lock-step peer.

# --split-cores pins this process (XLA's threads with it) to one core
# before jax starts, and the sandboxes to the others.
_CPUS = sorted(os.sched_getaffinity(0))
DECODE_CPUS, TOOL_CPUS = set(_CPUS), ()
if "--split-cores" in sys.argv and len(_CPUS) > 1:
  DECODE_CPUS, TOOL_CPUS = {_CPUS[0]}, tuple(_CPUS[1:])
  os.sched_setaffinity(0, DECODE_CPUS)

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from swirl_jax import config_lib
from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.scripted import replaying
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import synthetic
from swirl_jax.tools import parsing, registry

import common  # pylint: disable=g-bad-import-order
from lockstep import LockStep  # pylint: disable=g-bad-import-order

MAX_TURNS, MAX_NEW, MAX_RESPONSE = 5, 48, 320  # The CPU demo's.
SNIPPETS = (
    "x = 17 * 23\nprint(x)",
    "total = 0\nfor i in range(1, 101):\n    total += i\nprint(total)",
    "import math\nprint(math.comb(12, 5), math.factorial(7))",
    "from fractions import Fraction\nprint(Fraction(3, 4) + Fraction(5, 6))",
    "print(sorted([13, 4, 9, 21, 2])[2])",
)


def _rng(traj_id: str, turn: int) -> np.random.RandomState:
  return np.random.RandomState(zlib.crc32(f"{traj_id}/{turn}".encode()))


def num_turns(traj_id: str) -> int:
  return 1 + int(_rng(traj_id, -1).choice(5, p=(.2, .35, .25, .12, .08)))


def turn_length(traj_id: str, turn: int) -> int:
  n = _rng(traj_id, turn).lognormal(np.log(18.0), 0.8)
  return int(np.clip(round(n), 4, MAX_NEW))


def action(traj_id: str, turn: int) -> parsing.ParsedTurn:
  r = _rng(traj_id, 100 + turn)
  if turn < num_turns(traj_id) - 1:
    return parsing.ParsedTurn("call", tool=parsing.PYTHON_TOOL,
                              argument=SNIPPETS[r.randint(len(SNIPPETS))])
  if r.rand() < 0.5:
    return parsing.ParsedTurn("call", tool=parsing.PYTHON_TOOL,
                              argument="final_answer(6 * 7)", final=True)
  return parsing.ParsedTurn("answer", answer="42")


RECORDED = pathlib.Path(__file__).resolve().parent / "data" / \
    "simpletir_demo_turns.json"


def record(rollouts: str, out: str = str(RECORDED)) -> None:
  """Writes what replaying needs of a SimpleTIR rollout file (one
  iteration's `rollouts/iter_*.jsonl`): per trajectory, per turn, its
  sampled length and the action it parsed to."""
  from swirl_jax.rollout.records import Trajectory  # pylint: disable=g-import-not-at-top
  from swirl_jax import jsonl  # pylint: disable=g-import-not-at-top
  trajs = jsonl.read(rollouts, Trajectory.from_dict)
  turns = [[dict(length=len(t.action_ids), tool=t.tool, argument=t.argument,
                 answer=t.answer, void=t.void) for t in traj.turns]
           for traj in trajs]
  pathlib.Path(out).parent.mkdir(exist_ok=True)
  pathlib.Path(out).write_text(json.dumps(dict(source=rollouts,
                                               trajectories=turns)))


def replayed(path: str, ids: list[str]):
  """(lengths, action) replaying the recorded trajectories, the i-th on
  the i-th of `ids` (cycling): real per-turn lengths and real code."""
  rec = json.loads(pathlib.Path(path).read_text())["trajectories"]
  by_id = {i: rec[k % len(rec)] for k, i in enumerate(ids)}

  def lengths(traj_id, turn):
    return max(1, by_id[traj_id][turn]["length"])

  def act(traj_id, turn):
    t = by_id[traj_id][turn]
    if t["tool"]:
      return parsing.ParsedTurn("call", tool=t["tool"], argument=t["argument"],
                                final="final_answer" in (t["argument"] or ""))
    if t["answer"] is not None:
      return parsing.ParsedTurn("answer", answer=t["answer"])
    if turn + 1 < len(by_id[traj_id]):  # Void here, yet it went on.
      return parsing.ParsedTurn("call", tool=parsing.PYTHON_TOOL,
                                argument="print(0)")
    return parsing.ParsedTurn("void")
  return lengths, act


def _load():
  return os.getloadavg()[0]


class Compiles:
  """Counts XLA compiles (any program, either side) as they happen, in
  all (`n`) and by program (`by_name`)."""

  def __init__(self):
    self.n, self.by_name = 0, collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(self._event)

  def _event(self, name, _, fun_name="", **__):
    if name == "/jax/core/compile/backend_compile_duration":
      self.n += 1
      self.by_name[fun_name] += 1


def _cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _machine_cpu_s() -> float:
  """CPU seconds the whole machine has been busy (/proc/stat). The
  sandboxes' own time is not in this process's children's rusage: the
  processes inside bubblewrap's PID namespace are reaped there."""
  with open("/proc/stat") as f:
    ticks = [int(x) for x in f.readline().split()[1:]]
  return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def timed(runner, tasks, group, compiles):
  """One rollout: (trajectories, metrics), the metrics with the compiles
  it ran, this process's CPU seconds and everything else's on the machine
  (its tools' on a quiet machine)."""
  n, me, all_ = compiles.n, _cpu_s(), _machine_cpu_s()
  trajs = runner.run(tasks, samples_per_task=group)
  cpu = _cpu_s() - me
  m = dict(runner.metrics, compiles=compiles.n - n, cpu_s=cpu,
           others_cpu_s=_machine_cpu_s() - all_ - cpu)
  return trajs, m


class Recorded:
  """The tools, recording each call's observation; `canned` replays them
  without running anything (a rollout whose tools take no time)."""

  def __init__(self, tools):
    self.tools, self.seen = tools, {}

  def live(self):
    def call(name):
      def run(args):
        out = self.tools[name](args)
        self.seen.update(((name, a), o) for a, o in zip(args, out))
        return out
      return run
    return {name: call(name) for name in self.tools}

  def canned(self):
    return {name: (lambda args, name=name: [self.seen[name, a] for a in args])
            for name in self.tools}


def main(argv=None):
  p = argparse.ArgumentParser()
  common.int_flags(p, sep="-", prompts=8, group=4, slots=32, pages=0,
                   decode_batch=16, chunk_steps=8)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--replay", default=str(RECORDED) if RECORDED.exists()
                 else "", help="recorded turns (`record`); '' generates them")
  p.add_argument("--record", default="", help="write --replay's file from "
                 "this rollouts/iter_*.jsonl and exit")
  p.add_argument("--split-cores", action="store_true",
                 help="decode on one core, sandboxes on the others (as on "
                 "an accelerator host, where tools do not take the "
                 "decoder's compute)")
  a = p.parse_args(argv)
  if a.record:
    record(a.record)
    return

  load_before, compiles = _load(), Compiles()
  cfg, params, tok = loading.load_policy(config_lib.model_config("mini", ""))
  sampler = Sampler(params, cfg, tok, SamplerConfig(max_cache_len=768,
                                                    eos_ids=()))
  tools = Recorded(registry.build_tools(("python",),
                                        sandbox_cpus=TOOL_CPUS))
  rc = turns.RolloutConfig(fmt="simpletir", max_turns=MAX_TURNS,
                              max_new_tokens=MAX_NEW,
                              max_response_tokens=MAX_RESPONSE,
                              temperature=a.temperature, seed=0)
  ec = engine_lib.EngineConfig(slots=a.slots, pages=a.pages,
                               decode_batch=a.decode_batch,
                               chunk_steps=a.chunk_steps, precompile=True)
  tasks = synthetic.arithmetic_tasks(a.prompts, seed=0)
  lengths, act = turn_length, action
  if a.replay:
    lengths, act = replayed(a.replay, [f"{t.id}/{k}" for t in tasks
                                       for k in range(a.group)])
  ref = replaying(LockStep, lengths, act)(
      sampler, tok, tools.live(), rc)
  eng = replaying(engine_lib.RolloutEngine, lengths, act)(
      sampler, tok, tools.live(), rc, ec)
  ref.stops = eng.stops = ()  # Lengths are replayed, not stopped.
  out, alone, programs = {}, {}, {}
  for name, runner in (("lockstep", ref), ("engine", eng)):
    before = collections.Counter(compiles.by_name)
    runner.run(tasks, samples_per_task=a.group)  # Compiles.
    programs[name] = {k[4:-1]: v for k, v in (compiles.by_name - before
                                              ).items()
                      if k in ("jit(append)", "jit(decode)")}
    out[name] = timed(runner, tasks, a.group, compiles)
  for name, runner in (("lockstep", ref), ("engine", eng)):
    runner.toolset = turns.ToolSet(tools.canned())
    alone[name] = timed(runner, tasks, a.group, compiles)[1]
  (lt, lm), (et, em) = out["lockstep"], out["engine"]
  same = all(np.array_equal(x.token_sequence()[0], y.token_sequence()[0])
             for x, y in zip(lt, et)) and len(lt) == len(et)
  cores = len(DECODE_CPUS | set(TOOL_CPUS))
  # The lock-step run's CPU time outside this process, less that of its
  # tool-free rerun (background): the sandboxes'.
  lm["tools_cpu_s"] = max(0.0, lm["others_cpu_s"]
                          - alone["lockstep"]["others_cpu_s"])
  # The engine's wall time cannot go below its decode alone (tools taking
  # no time), nor below the tools' CPU time over their cores; where tools
  # and decode share the cores, nor below both CPU times over them.
  floor_free = alone["engine"]["wall_s"]
  if a.split_cores:
    floor = max(floor_free, lm["tools_cpu_s"] / len(TOOL_CPUS))
  else:
    floor = max(floor_free, (alone["engine"]["cpu_s"] + lm["tools_cpu_s"])
                / cores)
  res = dict(
      speedup=lm["wall_s"] / em["wall_s"],
      slot_utilisation=em["slot_utilisation"],
      lockstep_slot_utilisation=lm["slot_utilisation"],
      same_tokens=bool(same),
      lockstep_wall_s=lm["wall_s"], engine_wall_s=em["wall_s"],
      ceiling_speedup=lm["wall_s"] / floor,
      ceiling_speedup_tools_free=lm["wall_s"] / floor_free,
      lockstep_decode_alone_s=alone["lockstep"]["wall_s"],
      engine_decode_alone_s=floor_free,
      engine_decode_alone_cpu_s=alone["engine"]["cpu_s"],
      tools_cpu_s=lm["tools_cpu_s"],
      timed_compiles=lm["compiles"] + em["compiles"],
      lockstep_tokens_per_s=lm["tokens_per_s"],
      engine_tokens_per_s=em["tokens_per_s"],
      lockstep_tool_wait_s=lm["tool_wait_s"],
      engine_tool_wait_s=em["tool_wait_s"],
      engine_idle_s=em.get("idle_s", 0.0),
      engine_decode_s=em.get("decode_s", 0.0),
      engine_append_s=em.get("append_s", 0.0),
      engine_decode_chunks=em.get("decode_chunks", 0.0),
      engine_preempted=em.get("preempted", 0.0),
      engine_recomputed_tokens=em.get("recomputed_tokens", 0.0),
      lockstep_longest_row_share=lm["longest_row_share"],
      engine_longest_row_share=em["longest_row_share"],
      tokens=em["tokens"], tool_calls=em["tool_calls"], rows=len(et),
      turns=float(np.mean([len(t.turns) for t in et])),
      engine_programs=programs["engine"],
      slots=a.slots, pages=a.pages, decode_batch=a.decode_batch,
      chunk_steps=a.chunk_steps,
      temperature=a.temperature, replay=a.replay,
      split_cores=a.split_cores, decode_cpus=sorted(DECODE_CPUS),
      tool_cpus=list(TOOL_CPUS), load_before=load_before,
      load_after=_load(), sandbox_isolation=registry.sandbox.Sandbox(
      ).isolation)
  print(f"lock-step {lm['wall_s']:.2f}s ({lm['tokens_per_s']:.0f} tok/s, "
        f"utilisation {lm['slot_utilisation']:.0%}); engine "
        f"{em['wall_s']:.2f}s ({em['tokens_per_s']:.0f} tok/s, utilisation "
        f"{em['slot_utilisation']:.0%}); speedup {res['speedup']:.2f}x of a "
        f"ceiling {res['ceiling_speedup']:.2f}x; same tokens: {same}; "
        f"compiles while timed: {res['timed_compiles']}")
  print(json.dumps(res))


if __name__ == "__main__":
  main()
