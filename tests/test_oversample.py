"""SimpleTIR oversampling: groups scored as they complete, admission stops
once enough groups pass the filters, groups cut short are not used."""

import pytest

from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.scripted import ScriptedSampler
from swirl_jax.simpletir import grpo, oversample
from swirl_jax.tasks import checkers
from swirl_jax.tasks import synthetic
from swirl_jax.tools import registry

G = 4
RIGHT = (4, 2, 1, 0, 3)  # Right answers per group: accuracy 1, .5, .25, 0.


@pytest.fixture(scope="module")
def tok():
  return loading.load_tokenizer("bundled")


def _engine(tok, tasks, slots):
  def script(row, turn):
    del turn
    task, k = tasks[row // G], row % G
    answer = task.answers[0] if k < RIGHT[row // G] else "-1"
    return f"<answer>{answer}</answer>"
  return engine_lib.RolloutEngine(
      ScriptedSampler(tok, script), tok, registry.build_tools(("calculator",)),
      turns.RolloutConfig(fmt="swirl", max_turns=2),
      engine_lib.EngineConfig(slots=slots, decode_batch=slots))


def test_stops_admitting_once_enough_groups_pass(tok):
  tasks = synthetic.arithmetic_tasks(5, seed=3)
  g = grpo.GroupConfig(group_size=G, filter_void=False,
                       accuracy_band=(0.1, 0.9))
  # 5 cache rows: group 1 completes (the first in the band) while group 2
  # is half started; groups 3 and 4 never start.
  eng = _engine(tok, tasks, slots=5)
  trajs = oversample.rollout(eng, tasks, g, want=1)
  assert [t.task_id for t in trajs[::G]] == [tasks[0].id, tasks[1].id]
  assert [t.sample_index for t in trajs] == list(range(G)) * 2
  assert eng.metrics["not_started"] == 20 - 10
  assert [t.reward for t in trajs] == [1.0] * 4 + [1.0, 1.0, 0.0, 0.0]
  rows, _, stats = grpo.select_rows(grpo.figures(trajs, g), g)
  assert stats["groups_kept"] == 1 and set(rows // G) == {1}
  # Two wanted: groups 1 and 2 pass; nothing past group 2 starts.
  trajs = oversample.rollout(_engine(tok, tasks, slots=4), tasks, g, want=2)
  assert [t.task_id for t in trajs[::G]] == [t.id for t in tasks[:3]]


def test_without_oversampling_every_pair_runs(tok):
  tasks = synthetic.arithmetic_tasks(3, seed=3)
  g = grpo.GroupConfig(group_size=G)
  eng = _engine(tok, tasks, slots=4)
  trajs = oversample.rollout(eng, tasks, g, want=3)
  assert len(trajs) == 3 * G and eng.metrics["not_started"] == 0
  assert oversample.prompts_drawn(8, 1.5) == 12
  with pytest.raises(ValueError, match="oversample"):
    oversample.prompts_drawn(8, 0.5)


def test_kept_groups_are_the_same_on_any_host_count(tok):
  """Every drawn group run (as on several hosts): the groups up to the
  `want`-th passing one stay, failing ones among them for the statistics;
  one host, which stops admitting, keeps the same groups."""
  tasks = synthetic.arithmetic_tasks(5, seed=3)
  g = grpo.GroupConfig(group_size=G, filter_void=False,
                       accuracy_band=(0.1, 0.9))
  trajs = _engine(tok, tasks, slots=8).run(tasks, samples_per_task=G)
  checkers.score_trajectories(trajs, tasks)
  # Groups 1, 2 and 4 pass the band (accuracy .5, .25, .75); 0 and 3 not.
  rewards = [t.reward for t in trajs]
  kept = oversample.kept_groups(rewards, g, want=2)
  assert kept.tolist() == [True] * 3 * G + [False] * 2 * G
  assert oversample.kept_groups(rewards, g, want=3).all()
  assert oversample.kept_groups(rewards, g, want=5).all()
  rows, _, stats = grpo.select_rows(
      grpo.figures(trajs, g).subset(kept), g)
  assert stats["groups_kept"] == 2 and set(rows // G) == {1, 2}
  # One host, whose engine stops admitting at the 2nd passing group
  # (group 2): the same groups.
  alone = oversample.rollout(_engine(tok, tasks, slots=4), tasks, g, want=2)
  keep = oversample.kept_groups([t.reward for t in alone], g, want=2)
  assert [t.id for t, k in zip(alone, keep) if k] == [
      t.id for t, k in zip(trajs, kept) if k]


def test_each_trajectory_is_scored_once(tok, monkeypatch):
  """The checker sees each returned trajectory once: groups scored as
  they complete are not scored again (nor cut-short ones at all)."""
  tasks = synthetic.arithmetic_tasks(5, seed=3)
  g = grpo.GroupConfig(group_size=G, filter_void=False,
                       accuracy_band=(0.1, 0.9))
  checked, real = [], checkers.check_batch
  monkeypatch.setattr(checkers, "check_batch", lambda ts, answers: (
      checked.extend(answers), real(ts, answers))[1])
  trajs = oversample.rollout(_engine(tok, tasks, slots=5), tasks, g, want=1)
  assert len(checked) == len(trajs) == 2 * G
  checked.clear()
  trajs = oversample.rollout(_engine(tok, tasks, slots=8), tasks, g, want=5)
  assert len(checked) == len(trajs) == 5 * G
