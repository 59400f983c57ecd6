"""SWiRL as jobs of `swirl_jax.main`, over one workdir:

  warmstart <workdir>/warmstart/hf             optional (CPU demos): the
                                               base policy, taught the format
  stage1  <workdir>/stage1/shard_*.jsonl      trajectories (live tools)
  filter  <workdir>/filter/units.jsonl         judged step units (+ report)
  rl      <workdir>/<rl_name>/                 stage 2 (checkpoints, hf/)
  sft     <workdir>/sft/                       the SFT baseline
  eval    <workdir>/eval/results.{json,md}     base vs trained policies
  report  <workdir>/report.md, *.png           summary and plots

`swirl_pipeline` runs `config.stages` in order; each stage also runs alone
(job `swirl_<stage>`) and reads what the earlier ones wrote.

One module on purpose: the stage table above and each stage's short
runner are the pipeline's whole control flow (the stages' work lives in
their own modules), and the runners share helpers (`_tasks`, `_judge`,
`_base`, `_policy_cfg`, the judged-label cache) that a module per stage
would scatter or import back across stages.
"""

import dataclasses
import json
import pathlib

import ml_collections
import tqdm
from absl import logging

from swirl_jax import (config_lib, distributed, judges, jsonl, viewer,
                       warmstart)
from swirl_jax.evaluation import agent_eval
from swirl_jax.models import loading
from swirl_jax.rollout import decompose
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import (StepUnit, Trajectory, read_jsonl,
                                       write_jsonl)
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.swirl import filters, report, stage1, stage2
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry
from swirl_jax.training import probes
from swirl_jax.training import step as step_lib
from swirl_jax.training import trainer as trainer_lib

STAGES = ("warmstart", "stage1", "filter", "rl", "sft", "eval", "report")


def _tasks(c, which: str):
  """Train or eval tasks; train never holds an evaluation question."""
  d = c.data
  tasks = datasets.load_tasks(d[which], d.get(f"{which}_split") or None,
                              d.get("data_dir") or None,
                              d.get(f"{which}_limit") or None)
  return _without_eval_questions(c, tasks) if which == "train" else tasks


def _without_eval_questions(c, tasks):
  held_out = {t.question for t in _tasks(c, "eval")}
  return [t for t in tasks if t.question not in held_out]


def _borrows_policy(jc) -> bool:
  """A 'model' judge without a checkpoint of its own judges with the policy."""
  return jc.kind == "model" and not jc.model.checkpoint


def _judge(jc, tasks, policy, *, name="judge", cache_path=""):
  """The judge block `jc` describes (`name`: its key in the config); one
  that borrows the policy judges with `policy`, a copy of this host's own
  (each host judges its share)."""
  model = policy if _borrows_policy(jc) and policy is not None else None
  return judges.make_judge(jc, tasks=tasks, model=model, name=name,
                           default_cache_path=cache_path)


def _rollout_loop(c, policy, tools, rc) -> engine_lib.RolloutEngine:
  cfg, params, tok = policy
  sampler = Sampler(params, cfg, tok, SamplerConfig.from_config(c.sampler))
  return engine_lib.RolloutEngine(
      sampler, tok, tools, turns.RolloutConfig.from_config(rc),
      engine_lib.EngineConfig.from_config(c.get("engine") or {}))


def _base(c, workdir):
  """The policy SWiRL starts from: `c.model`, or the warm-started one."""
  return warmstart.model_config(c, workdir)


def run_warmstart(c, workdir):
  if not c.get("warmstart") or not c.warmstart.enabled:
    raise ValueError("the warmstart stage needs config.warmstart.enabled")
  w = c.warmstart
  tasks = datasets.load_tasks(c.data.train, w.split,
                              c.data.get("data_dir") or None,
                              warmstart.task_count(w))
  tools = registry.from_config(c.tools, c.data.get("data_dir") or None,
                               cache_dir=str(pathlib.Path(workdir) /
                                             "search_index"),
                               corpora=datasets.CORPORA)
  return warmstart.run(c, workdir, _without_eval_questions(c, tasks), tools)


def run_stage1(c, workdir):
  work = pathlib.Path(workdir)
  tasks = _tasks(c, "train")
  # Tools before the policy: a missing corpus fails before any model loads.
  tools = registry.from_config(c.tools, c.data.get("data_dir") or None,
                               cache_dir=str(work / "search_index"),
                               corpora=datasets.CORPORA)
  policy = loading.load_policy(_base(c, workdir), seed=c.seed)
  s = c.stage1
  loop = _rollout_loop(c, policy, tools, dict(
      fmt="swirl", max_turns=s.max_turns, max_new_tokens=s.max_new_tokens,
      max_response_tokens=s.max_response_tokens,
      temperature=s.temperature, top_p=s.top_p, seed=c.seed))
  with tqdm.tqdm(total=len(tasks) * s.samples, desc="stage 1",
                 unit="traj") as bar:
    trajs = stage1.generate(loop, tasks, str(work / "stage1"),
                            samples=s.samples,
                            tasks_per_batch=s.tasks_per_batch, progress=bar)
  acc = sum(bool(t.outcome) for t in trajs) / max(1, len(trajs))
  logging.info("stage 1: %d trajectories, outcome accuracy %.3f",
               len(trajs), acc)
  return trajs


def _step_key(u: StepUnit) -> tuple:
  return (u.trajectory_id, u.step_index, u.state_text, u.action_text)


def _stored_labels(out: pathlib.Path, ident: dict) -> dict[tuple, StepUnit]:
  """The labelled units `out` holds from the judge `ident`, by step."""
  labels, ident_path = out / "units.jsonl", out / "judge.json"
  if not (labels.exists() and ident_path.exists()) or \
      json.loads(ident_path.read_text()) != ident:
    return {}
  return {_step_key(u): u for u in read_jsonl(str(labels), StepUnit)
          if u.process_good is not None}


def _write_labels(out: pathlib.Path, units, ident: dict) -> None:
  # No identity file while the labels change: a kill in between leaves
  # labels that no judge vouches for, which the next run judges again.
  (out / "judge.json").unlink(missing_ok=True)
  for name, write in (("units.jsonl", lambda p: write_jsonl(str(p), units)),
                      ("judge.json",
                       lambda p: p.write_text(json.dumps(ident, indent=2)))):
    tmp = out / (name + ".tmp")
    tmp.unlink(missing_ok=True)
    write(tmp)
    tmp.rename(out / name)


def _judged(c, workdir, units, out: pathlib.Path) -> list[StepUnit]:
  """`units` with the judge's labels, judging only what is not stored.

  `out/units.jsonl` holds the labels and `out/judge.json` the identity of
  the judge that gave them (kind, model or endpoint, threshold, prompt...):
  a label is reused when the identity is equal and the step (ids, state and
  action text) is the same; the other steps are judged and both files
  rewritten. A step whose reply could not be read is stored without a
  label, so the next run judges it again; the judge's unreadable share is
  taken over all the stage's steps, so such a rerun does not fail on them.
  """
  jc = c.judge
  policy_cfg = _base(c, workdir) if _borrows_policy(jc) else None
  ident = judges.identity(jc, policy_cfg)
  stored = _stored_labels(out, ident)
  todo = [u for u in units if _step_key(u) not in stored]
  if todo:
    logging.info("filter: judging %d steps (%d labels reused)", len(todo),
                 len(units) - len(todo))
    policy = (loading.load_policy(policy_cfg, seed=c.seed)
              if policy_cfg is not None else None)
    tasks = _tasks(c, "train") if jc.kind == "programmatic" else None
    judge = _judge(jc, tasks, policy,
                   cache_path=str(out / "judge_cache.sqlite"))
    labelled = distributed.run_shared(  # Each host judges its share.
        lambda part: judges.label_units(judge, part, total=len(units)),
        todo, to_text=StepUnit.to_json, from_text=StepUnit.from_json,
        what="filter judging")
    # Each host checked its own unreadable replies; this checks them all.
    judge.check_readable(sum(u.process_good is None for u in labelled),
                         len(units))
    stored.update((_step_key(u), u) for u in labelled)
  units = [dataclasses.replace(u, process_good=stored[_step_key(u)]
                               .process_good,
                               process_prob=stored[_step_key(u)].process_prob)
           for u in units]
  if todo:
    with distributed.one_writer(f"{out} labels") as writing:
      if writing:
        _write_labels(out, units, ident)
  return units


def run_filter(c, workdir):
  work = pathlib.Path(workdir)
  trajs = stage1.read_trajectories(str(work / "stage1"))
  if not trajs:
    raise FileNotFoundError(f"{work / 'stage1'}: no trajectories; run "
                            "stage1 first")
  easy = (stage1.easy_tasks(trajs, c.stage1.easy_max_calls)
          if c.stage1.drop_easy else set())
  trajs = [t for t in trajs if t.task_id not in easy]
  out = work / "filter"
  out.mkdir(parents=True, exist_ok=True)
  units = _judged(c, workdir, decompose.decompose_all(trajs), out)
  unjudged = sum(u.process_good is None for u in units)
  if unjudged:  # Below the judge's max_unparsable share; asked next run.
    logging.warning("filter: %d steps got no readable judge reply; they "
                    "count as BAD here and are judged again next run",
                    unjudged)
    units = [u if u.process_good is not None else
             dataclasses.replace(u, process_good=False) for u in units]
  reports = {}
  kept = {}
  for strategy in filters.STRATEGIES:
    kept[strategy], reports[strategy] = filters.filter_units(
        units, strategy, c.filter.granularity)
  reports["easy_tasks_dropped"] = len(easy)
  reports["steps_without_judge_reply"] = unjudged
  with distributed.one_writer(f"{out} units") as writing:
    if writing:
      _write_filtered(out, kept, reports)
  logging.info("filter report: %s", json.dumps(reports))
  return reports


def _write_filtered(out: pathlib.Path, kept: dict, reports: dict) -> None:
  for strategy, units in kept.items():
    path = out / f"units_{strategy}.jsonl"
    path.unlink(missing_ok=True)
    write_jsonl(str(path), units)
    path.touch()  # Even when empty: stage 2 then says "kept no step".
  (out / "report.json").write_text(json.dumps(reports, indent=2))


def _units(c, workdir) -> list[StepUnit]:
  path = pathlib.Path(workdir) / "filter" / f"units_{c.filter.strategy}.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"{path}: missing; run the filter stage first")
  units = read_jsonl(str(path), StepUnit)
  if not units:
    rep = path.parent / "report.json"
    raise filters.nothing_kept(
        str(path), c.filter.strategy, json.loads(rep.read_text()).get(
            c.filter.strategy) if rep.exists() else None, c.judge.kind,
        c.stage1.samples)
  return units


def run_rl(c, workdir):
  """Stage 2. No tool runs here: building one raises."""
  with registry.forbidden("SWiRL stage 2 is offline (no live tools)"):
    return _rl(c, workdir)


def _rl(c, workdir):
  work = pathlib.Path(workdir) / c.rl_name
  units = _units(c, workdir)
  tc = c.rl_train
  base = _base(c, workdir)
  mesh, (cfg, params, tok) = trainer_lib.load_policy(tc, base, seed=c.seed)
  s = stage2.Stage2Config.from_config(c.stage2)
  # A reward model borrowing the policy is the initial policy, frozen: its
  # own copy on this host (the trainer's weights are donated to its state).
  judged_by = (loading.load_policy(base, mesh=loading.host_mesh(base),
                                   seed=c.seed)
               if _borrows_policy(c.reward) else None)
  reward = _judge(c.reward, _tasks(c, "train"), judged_by, name="reward")
  trainer = trainer_lib.Trainer(tc, str(work), cfg, params=params, mesh=mesh)
  sampler = Sampler(trainer.sampling_params(), cfg, tok,
                    SamplerConfig.from_config(c.sampler))
  ref_fn = ref_params = None
  if tc.loss.kl_coef > 0:  # The frozen initial policy, for the KL term.
    ref_params = loading.load_policy(base, mesh=trainer.mesh,
                                     seed=c.seed)[1]
    ref_fn = step_lib.make_logprob_fn(cfg, trainer.mesh,
                                      trainer.shardings.params)
  probe = probes.Probe.for_trainer(trainer)  # One jitted forward, reused.
  ok = False
  try:
    for it, batch_units in stage2.unit_batches(units, s.states_per_step,
                                               c.seed, trainer.data_pos):
      if it >= c.rl_iterations:
        break
      sampler.params = trainer.sampling_params()
      # Each host samples and scores its share of the states, and keeps
      # them: the batch is built from every host's rows.
      part = batch_units[distributed.host_block(len(batch_units),
                                                even=False)]
      actions, rewards = stage2.sample_and_score(
          sampler, reward, part, s,
          seed=distributed.mix_seed(c.seed, "stage2", it))
      batch = stage2.rl_batch(part, actions, rewards, s,
                              mini_batch_size=tc.mini_batch_size or 1)
      if ref_fn is not None:
        batch["ref_logprobs"] = ref_fn(ref_params, batch)
      trainer.update(batch, extra=dict(
          stage2.reward_stats(distributed.gather_rows(rewards)),
          iteration=float(it),
          **probe.mismatch(trainer.policy_params(), batch)))
    ok = True
  finally:
    trainer.close(save=ok)
  return trainer.export_hf(tokenizer=tok)


def run_sft(c, workdir):
  with registry.forbidden("the SFT baseline trains on saved steps"):
    work = pathlib.Path(workdir) / "sft"
    units = _units(c, workdir)
    tc = ml_collections.ConfigDict(c.sft_train.to_dict())
    mesh, (cfg, params, tok) = trainer_lib.load_policy(
        tc, _base(c, workdir), seed=c.seed)
    tc.export_hf = True  # Evaluation loads the policy from <workdir>/sft/hf.
    mb = tc.mini_batch_size or 1

    def batches(pos):
      for _, part in stage2.unit_batches(units, c.stage2.states_per_step,
                                         c.seed, pos):
        yield stage2.sft_batch(part, mini_batch_size=mb,
                               max_len=c.stage2.max_len)

    trainer_lib.train(tc, str(work), cfg, batches, params=params, mesh=mesh,
                      tokenizer=tok)
    return str(work / "hf")


def _policy_dir(name: str, workdir) -> tuple[str, pathlib.Path]:
  """(label, Hugging Face directory) of an `eval.policies` entry: a stage
  of this workdir (<workdir>/<name>/hf) or 'label=DIR'."""
  label, eq, path = name.partition("=")
  if eq:
    return label, pathlib.Path(path)
  return name, pathlib.Path(workdir) / name / "hf"


def _policy_cfg(c, name: str, workdir) -> ml_collections.ConfigDict:
  if name == "base":
    return _base(c, workdir)
  label, hf = _policy_dir(name, workdir)
  if not (hf / "config.json").exists():
    what = (f"run the {label} stage" if hf.parent.name == label else
            "train it first, or point the entry at a Hugging Face "
            "directory (eval.policies: 'label=DIR')")
    raise FileNotFoundError(f"{hf}: no exported policy; {what}")
  m = ml_collections.ConfigDict(_base(c, workdir).to_dict())
  m.checkpoint, m.tokenizer = str(hf), str(hf)
  return m


def _outcome_judge(c, judge):
  """The judge's YES/NO on answers (`eval.llm_correct`), if it has a
  model or an endpoint to ask."""
  if not c.eval.get("llm_correct") or c.judge.kind == "programmatic":
    return None
  return judges.OutcomeJudge(judge)


def run_eval(c, workdir, show=True):
  """`show`: print the results table (off when the report, which holds
  it, is printed next)."""
  work = pathlib.Path(workdir)
  tasks = _tasks(c, "eval")
  tools_cfg = ml_collections.ConfigDict(c.tools.to_dict())
  if c.eval.get("search_corpus"):  # Held-out questions, their own corpus.
    tools_cfg.search_corpus = c.eval.search_corpus
  tools = registry.from_config(tools_cfg, c.data.get("data_dir") or None,
                               cache_dir=str(work / "search_index"),
                               corpora=datasets.CORPORA)
  results, trajs = {}, {}
  judge = outcome = None
  models = {}  # Every policy found before any is evaluated.
  for name in c.eval.policies:
    label, hf = _policy_dir(name, workdir)
    if name != "base" and "=" not in name and not hf.exists():
      logging.warning("eval: skipping %s (not trained in %s)", name, work)
      continue
    models[label] = _policy_cfg(c, name, workdir)
  for label, model in models.items():
    logging.info("eval %s: weights %s", label, model.checkpoint)
    policy = loading.load_policy(model, seed=c.seed)
    if judge is None:  # Process correctness by one fixed judge; a model
      # judge without a checkpoint of its own is the base policy.
      base = loading.load_policy(_base(c, workdir), seed=c.seed) \
          if _borrows_policy(c.judge) else None
      judge = _judge(c.judge, tasks, base)
      outcome = _outcome_judge(c, judge)
    loop = _rollout_loop(c, policy, tools, dict(
        fmt="swirl", max_turns=c.stage1.max_turns,
        max_new_tokens=c.stage1.max_new_tokens,
        max_response_tokens=c.stage1.max_response_tokens,
        temperature=c.eval.temperature, seed=c.seed))
    trajs[label] = distributed.run_shared(
        loop.run_pairs, [(t, 0) for t in tasks], to_text=Trajectory.to_json,
        from_text=Trajectory.from_json, what=f"eval {label}")
    checkers.score_trajectories(trajs[label], tasks)
    results[label] = agent_eval.summarize(trajs[label], tasks, judge,
                                          outcome_judge=outcome)
    logging.info("eval %s: %s", label, results[label])
  # Runs sharing a workdir (the filter ablations) add their policies.
  merged = {**agent_eval.read(str(work / "eval")), **results}
  weights_path = work / "eval" / "weights.json"  # Policy -> its weights.
  weights = {**(json.loads(weights_path.read_text())
                if weights_path.exists() else {}),
             **{label: models[label].checkpoint for label in results}}
  with distributed.one_writer(f"{work / 'eval'}") as writing:
    if writing:
      agent_eval.write(str(work / "eval"), merged, trajs)
      jsonl.write_bytes(weights_path, json.dumps(weights, indent=2).encode())
  if show:
    print(agent_eval.table(merged))
  return results


def run_report(c, workdir):
  with distributed.one_writer(f"{workdir} report") as writing:
    text = report.write(workdir, c.rl_name) if writing else ""
  print(text)
  _view(c, workdir)
  return text


def _view(c, workdir) -> None:
  """The rollout viewer (`<workdir>/rollouts.html`), with the reference
  answers of the run's tasks and, where the workdir holds no tokenizer,
  the base policy's."""
  try:
    refs = viewer.references(_tasks(c, "train") + _tasks(c, "eval"))
  except (OSError, ValueError) as e:  # The data is gone: no references.
    logging.warning("viewer: no reference answers (%s)", e)
    refs = None
  base = _base(c, workdir)
  viewer.write_for_run(
      workdir, references=refs,
      tokenizer_spec=base.get("tokenizer") or base.get("checkpoint") or "")


_RUN = {"warmstart": run_warmstart, "stage1": run_stage1, "filter": run_filter, "rl": run_rl,
        "sft": run_sft, "eval": run_eval, "report": run_report}


def _stage_list(stages) -> list[str]:
  """('a', 'b'), or 'a,b' from a command-line override."""
  if isinstance(stages, str):
    stages = (stages,)
  return [s.strip() for part in stages for s in part.split(",") if s.strip()]


def resolve(config) -> ml_collections.ConfigDict:
  """A copy of `config` with its derived fields set, at job start, so a
  `--config.` override of what they depend on never leaves them stale."""
  c = config.copy_and_resolve_references()
  if not c.rl_train.num_steps:  # One step per mini-batch of an iteration.
    rows = c.stage2.states_per_step * c.stage2.samples_per_state
    c.rl_train.num_steps = c.rl_iterations * max(
        1, rows // (c.rl_train.mini_batch_size or rows))
  return c


def _check(c, stages) -> None:
  """Fails on a misspelt stage, filter or judge before any stage runs."""
  for what, value, valid in (
      [("SWiRL stage", s, STAGES) for s in stages] +
      [("filter strategy", c.filter.strategy, filters.STRATEGIES),
       ("filter granularity", c.filter.granularity, filters.GRANULARITIES)]):
    if value not in valid:
      raise config_lib.ConfigError(f"unknown {what} {value!r}; valid: "
                                   f"{', '.join(valid)}")
  for name, users in (("judge", {"filter", "eval"}), ("reward", {"rl"})):
    if users & set(stages):
      judges.validate(c[name], name)


def run_pipeline(config, workdir):
  config = resolve(config)
  stages = _stage_list(config.stages)
  _check(config, stages)
  for i, stage in enumerate(stages):
    logging.info("SWiRL stage %s", stage)
    quiet = stage == "eval" and "report" in stages[i:]  # Printed once.
    _RUN[stage](config, workdir, **({"show": False} if quiet else {}))


def stage_job(stage: str):
  def run(config, workdir):
    _check(config, [stage])
    return _RUN[stage](resolve(config), workdir)
  return run


run_warmstart_job = stage_job("warmstart")
run_stage1_job = stage_job("stage1")
run_filter_job = stage_job("filter")
run_rl_job = stage_job("rl")
run_sft_job = stage_job("sft")
run_eval_job = stage_job("eval")
