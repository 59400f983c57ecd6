"""Warm start for CPU-size runs: a small policy taught a tool-use format.

SWiRL starts from a model that already uses tools, if badly (SimpleTIR's
CPU runs use this stage too, with `fmt='simpletir'`). A model small
enough to train on a CPU has to learn the format first. Synthetic tasks come
with gold trajectories (`synthetic.reference_turns`), so this stage

  1. learns a small BPE vocabulary on them (`vocab_size`; 0 keeps the
     tokenizer), since a 49k-entry output layer would dominate the cost;
  2. records the demonstrations through the rollout loop with live tools,
     so their tokens are exactly what the loop will produce later;
  3. trains a randomly initialised `model.preset` on them with the SFT
     loss, for a fixed number of steps or, with `criterion.min_copy_rate`,
     until a measured criterion is reached (an imperfect policy, which is
     what SWiRL then improves), and exports it to <workdir>/warmstart/hf.

The criterion: sampling at `criterion.temperature` (the rollouts' 1.0)
on held-out demonstration prompts (the last `criterion.tasks` of the
demonstration split, never trained on), the share of first turns that
call a tool with every number the problem's first step reads
(`copy_rate`). Greedy decoding would not do: its copy rate levels off
as soon as the right number is the likeliest token, while the sampled
one keeps rising as the policy grows sure of it, and the policy is
sampled. Copying the question's numbers is what a model from scratch
learns suddenly, at a step that float rounding moves (one instruction
set's sums against another's), so a fixed step count can stop just
before it on one machine and just after it on another. Checked every
`criterion.every` steps; `train.num_steps` caps it, and a warm start
that stops at the cap without reaching it says so.
`<workdir>/warmstart/criterion.json` holds every check.

Demonstrations come from their own split and never include an evaluation
question. A rerun resumes training, or returns at once when the export
exists.
"""

import collections
import itertools
import json
import os
import pathlib
import re

import jax
import ml_collections
import numpy as np
from absl import logging

from swirl_jax import config_blocks, distributed
from swirl_jax.models import decoder, loading, presets
from swirl_jax.models.tokenizer import Tokenizer
from swirl_jax.rollout import batching, prompts
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import Trajectory
from swirl_jax.rollout.scripted import ScriptedSampler
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import checkers
from swirl_jax.tasks import demonstrations
from swirl_jax.tasks import synthetic
from swirl_jax.training import trainer as trainer_lib


# Its config blocks (config_blocks.py: config files read them without
# importing this module).
default_config = config_blocks.warmstart_config
cpu_demo_config = config_blocks.warmstart_cpu_demo
hf_dir = config_blocks.warmstart_hf_dir


def model_config(c, workdir) -> ml_collections.ConfigDict:
  """`c.model`, or the warm-started policy when the config has one."""
  if not c.get("warmstart") or not c.warmstart.enabled:
    return c.model
  m = ml_collections.ConfigDict(c.model.to_dict())
  m.checkpoint = m.tokenizer = str(hf_dir(workdir))
  return m


def conversation_text(tok: Tokenizer, task, spaced: bool = False,
                      fmt: str = "swirl", style: str | None = None) -> str:
  """A task's trajectory in `style` (gold by default) rendered by the chat
  template."""
  msgs = prompts.messages(task, fmt)
  turns = _turns(task, style, spaced, fmt)
  if fmt == "simpletir":  # Tool output is inline, in the model's message.
    msgs.append({"role": "assistant", "content": "".join(
        t["action"] + (t["observation"] or "") for t in turns)})
    return tok.apply_chat_template(msgs)
  for turn in turns:
    msgs.append({"role": "assistant", "content": turn["action"]})
    if turn["observation"] is not None:
      msgs.append({"role": "user", "content": turn["observation"]})
  return tok.apply_chat_template(msgs)


def _turns(task, style, spaced: bool, fmt: str) -> list[dict]:
  if style is None:
    return synthetic.reference_turns(task, spaced=spaced, fmt=fmt)
  return demonstrations.reference_turns(task, style, spaced=spaced, fmt=fmt)


def record(tok: Tokenizer, tasks, tools, spaced: bool = False,
           fmt: str = "swirl", styles=None) -> list[Trajectory]:
  """The trajectories (gold, or each task's style of `styles`), replayed
  through the loop with live tools."""
  styles = styles or [None] * len(tasks)
  refs = [_turns(t, s, spaced, fmt) for t, s in zip(tasks, styles)]
  max_turns = max((len(r) for r in refs), default=1)
  script = lambda row, turn: (refs[row][turn]["action"]
                              if turn < len(refs[row]) else "")
  loop = engine_lib.RolloutEngine(ScriptedSampler(tok, script), tok, tools,
                                  turns.RolloutConfig(fmt=fmt,
                                                         max_turns=max_turns))
  trajs = loop.run(tasks)
  checkers.score_trajectories(trajs, tasks)
  return trajs


def prompt_phrases(tok: Tokenizer, tasks, fmt: str,
                   min_chars: int = 16) -> list[str]:
  """The text every task's prompt opens with (the chat template's system
  turn, the method's instruction), cut at special tokens and at the last
  whitespace: what `Tokenizer.train_like(phrases=)` can make one token."""
  texts = [tok.apply_chat_template(prompts.messages(t, fmt),
                                   add_generation_prompt=True) for t in tasks]
  common = os.path.commonprefix(texts)
  if len(texts) > 1:  # Never into the part where prompts differ.
    common = common[:max(common.rfind(" "), common.rfind("\n")) + 1]
  specials = sorted((tok.backend.id_to_token(i) for i in tok.special_ids),
                    key=len, reverse=True)
  pieces = re.split("|".join(map(re.escape, specials)), common) if specials \
      else [common]
  return [p for p in pieces if len(p) >= min_chars]


def _tokenizer(base: Tokenizer, tasks, styles, w, path: pathlib.Path):
  """The task's vocabulary, learnt once: process 0 learns and saves it,
  every host then reads the same files (a resumed run keeps its ids)."""
  if not w.vocab_size:
    return base
  with distributed.one_writer(f"{path} tokenizer") as writing:
    if writing and not (path / "tokenizer.json").exists():
      phrases = (prompt_phrases(base, tasks, w.fmt) if w.prompt_tokens
                 else [])
      base.train_like(
          (conversation_text(base, t, w.whole_numbers, w.fmt, s)
           for t, s in zip(tasks, styles)),
          w.vocab_size, split_digits=not w.whole_numbers,
          phrases=phrases).save_hf_dir(path)
  return Tokenizer.from_hf_dir(path)


def run(c, workdir, tasks, tools) -> str:
  """Trains the warm-start policy on `tasks` (no evaluation question);
  returns its Hugging Face directory."""
  w, out = c.warmstart, hf_dir(workdir)
  if (out / "config.json").exists():
    return str(out)
  tasks, held_out = split_held_out(w, tasks)
  base_tok = loading.load_tokenizer(c.model.get("tokenizer") or "bundled")
  styles = (demonstrations.styles(tasks, w.mix, w.fmt, c.seed) if w.mix
            else [None] * len(tasks))
  tok = _tokenizer(base_tok, tasks, styles, w, out.parent / "tokenizer")
  trajs = record(tok, tasks, tools, spaced=w.whole_numbers, fmt=w.fmt,
                 styles=styles)
  good = [t for t in trajs if t.outcome]
  logging.info("warm start: %d demonstrations (%d correct), vocab %d; "
               "styles %s", len(trajs), len(good), tok.vocab_size,
               dict(collections.Counter(styles)) if w.mix else "gold")
  seqs = [_demonstration(t, s) for t, s in zip(trajs, styles)] if w.mix \
      else [t.token_sequence() for t in good]
  if w.loss_on == "all":
    seqs = [(tok_, np.ones_like(mask), lp) for tok_, mask, lp in seqs]
  elif w.loss_on != "actions":
    raise ValueError(f"warmstart.loss_on {w.loss_on!r}; valid: actions, all")
  m = loading.resolve_model_block(c.model.copy_and_resolve_references(), 0)
  cfg = presets.get_preset(m.preset, dtype=m.dtype, param_dtype=m.param_dtype)
  cfg = cfg.replace(vocab_size=tok.vocab_size, bos_token_id=tok.bos_id,
                    eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
  params = decoder.init_params(cfg, jax.random.key(c.seed))
  bs = w.batch_size

  # One length for every batch: the longest demonstration, to a multiple
  # of 64 (a power-of-two bucket would pad 170 tokens to 256).
  length = -(-max(len(q[0]) for q in seqs) // 64) * 64

  def batches(pos):
    for i in itertools.count(pos):
      rng = np.random.default_rng([c.seed, i])
      idx = rng.choice(len(seqs), bs, replace=len(seqs) < bs)
      yield batching.collate([seqs[j] for j in idx], np.ones(bs),
                             row_multiple=bs, min_rows=bs,
                             length_buckets=(length,))

  trainer = trainer_lib.Trainer(w.train, str(out.parent), cfg,
                                params=params)
  ok = False
  try:
    crit = _Criterion(c, w, tok, held_out, tools, out.parent, trainer)
    reached = train_until(trainer, batches, w.train.num_steps,
                          crit if crit.enabled else None, w.criterion.every)
    if reached is False:
      logging.warning("warm start: copy rate %.3f < %.3f at the cap of %d "
                      "steps", crit.last, w.criterion.min_copy_rate,
                      w.train.num_steps)
    ok = True
  finally:
    trainer.close(save=ok)  # After a failure the state may be donated.
  trainer.export_hf(tokenizer=tok)
  return str(out)


def _demonstration(traj: Trajectory, style: str):
  """`traj.token_sequence()`, cut after its first action where `style`
  ends at its call (`demonstrations.ENDS_AT_CALL`)."""
  seq = traj.token_sequence()
  if style not in demonstrations.ENDS_AT_CALL or not traj.turns:
    return seq
  end = len(traj.prompt_ids) + len(traj.turns[0].action_ids)
  return tuple(x[:end] for x in seq)


def task_count(w) -> int:
  """How many demonstration tasks `run` takes: its training tasks, and the
  criterion's held-out ones after them."""
  return w.tasks + (w.criterion.tasks if w.criterion.min_copy_rate else 0)


def split_held_out(w, tasks):
  """(training tasks, the criterion's held-out tasks: the last ones)."""
  n = w.criterion.tasks if w.criterion.min_copy_rate else 0
  if n and len(tasks) <= n:
    raise ValueError(f"warmstart: {len(tasks)} demonstration tasks leave "
                     f"none to train on beside criterion.tasks={n}")
  return (tasks[:-n], tasks[-n:]) if n else (tasks, [])


def train_until(trainer, batches, num_steps: int, check=None,
                every: int = 0) -> bool | None:
  """Steps of `trainer` on `batches(data_pos)` until `num_steps`, or until
  `check(step)` holds at one of its checks (every `every` steps, and at
  the end). Returns whether it held (None without a check)."""
  for batch in batches(trainer.data_pos):
    step = trainer.step
    if step >= num_steps:
      break
    if check and step and step % every == 0 and check(step):
      return True
    trainer.update(batch)
  return bool(check(trainer.step)) if check else None


def first_step_numbers(task) -> set[int]:
  """The numbers the first step of a synthetic task's solution reads."""
  q = task.metadata["quantities"]
  ops = task.metadata["solution_graph"][0]["operands"]
  return {int(q[o]) if isinstance(o, str) else int(o) for o in ops}


def copy_rate(trajs: list[Trajectory], tasks) -> float:
  """Share of trajectories whose first turn calls a tool with every number
  its task's first step reads (`first_step_numbers`)."""
  ok = []
  for traj, task in zip(trajs, tasks, strict=True):
    turn = traj.turns[0] if traj.turns else None
    found = {int(x) for x in re.findall(r"\d+", (turn and turn.argument)
                                        or "")}
    ok.append(bool(turn and turn.tool) and first_step_numbers(task) <= found)
  return float(np.mean(ok)) if ok else 0.0


class _Criterion:
  """The warm start's stopping check: sampled first turns on held-out
  demonstration prompts, their copy rate against `min_copy_rate`; every
  check appended to criterion.json (a resumed run keeps the earlier)."""

  def __init__(self, c, w, tok, tasks, tools, work: pathlib.Path, trainer):
    self.w, self.tok, self.tasks, self.tools = w.criterion, tok, tasks, tools
    self.fmt, self.max_len = w.fmt, c.sampler.max_cache_len
    self.path = work / "criterion.json"
    self.enabled = bool(self.w.min_copy_rate)
    self.last = float("nan")
    self.trainer = trainer
    self.sampler = None  # Made at the first check; its programs reused.

  def __call__(self, step: int) -> bool:
    params = self.trainer.sampling_params()
    if self.sampler is None:
      self.sampler = Sampler(params, self.trainer.model_cfg, self.tok,
                             SamplerConfig(max_cache_len=self.max_len))
    else:
      self.sampler.params = params
    loop = engine_lib.RolloutEngine(
        self.sampler, self.tok, self.tools, turns.RolloutConfig(
            fmt=self.fmt, max_turns=1, temperature=self.w.temperature,
            max_new_tokens=self.w.max_new_tokens, seed=step))
    self.last = copy_rate(loop.run(self.tasks), self.tasks)
    reached = self.last >= self.w.min_copy_rate
    log = json.loads(self.path.read_text()) if self.path.exists() else []
    log = [r for r in log if r["step"] < step] + [dict(
        step=step, copy_rate=self.last, reached=reached,
        min_copy_rate=self.w.min_copy_rate)]
    with distributed.one_writer(str(self.path)) as writing:
      if writing:
        self.path.write_text(json.dumps(log, indent=1))
    logging.info("warm start step %d: copy rate %.3f (criterion %.3f)",
                 step, self.last, self.w.min_copy_rate)
    return reached


def criterion_line(workdir) -> str:
  """One line on the warm start's criterion, for heldout.md and report.md
  ('' when it had none)."""
  path = pathlib.Path(workdir) / "warmstart" / "criterion.json"
  if not path.exists():
    return ""
  last = json.loads(path.read_text())[-1]
  if last["reached"]:
    return (f"Warm start: copy rate {last['copy_rate']:.3f} >= "
            f"{last['min_copy_rate']:.3f} at step {last['step']}.")
  return (f"Warm start: copy rate {last['copy_rate']:.3f} missed "
          f"its criterion {last['min_copy_rate']:.3f} at the cap, step "
          f"{last['step']}.")
