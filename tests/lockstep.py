"""The lock-step rollout: the engine's oracle, and its benchmark's peer.

Every turn samples all live rows together (one decode call takes every
row for a whole turn: each waits for the longest), then runs all their
calls as one batch, then appends all observations. The turn logic is
`rollout.turns`', the device the sampler's, as in `RolloutEngine`; only
the schedule differs, so trajectories must come out the same, token for
token, whatever the engine's slots, pool, decode batch and chunks.
"""

import collections
import time

from swirl_jax.rollout import turns


class LockStep(turns.Schedule):
  """`RolloutEngine`'s records (same hooks and metrics), lock-step."""

  def __init__(self, sampler, tokenizer, tools, config: turns.RolloutConfig,
               append_tokens: int = 64):
    super().__init__(tokenizer, tools, config)
    self.sampler, self.append_tokens = sampler, append_tokens

  def run_pairs(self, pairs):
    c = self.config
    rows = turns.new_rows(pairs, self.tokenizer, c.fmt)
    if not rows:
      return []
    # One decode call a turn: every row, as many steps as a turn has.
    dev = self.sampler.device(len(rows), c.max_new_tokens,
                              self.append_tokens)
    dev.open(len(rows), len(rows))  # Every row at the limit: no preemption.
    self._stats, t0 = collections.Counter(), time.perf_counter()
    live, fresh = rows, True
    for turn_no in range(c.max_turns):
      arrived = [r for r in live if r.obs]
      dev.append(arrived, fresh)
      for r in arrived:
        turns.appended(r, fresh)
      for r in live:
        turns.start_turn(r, turn_no, self.turn_budget(r.traj, turn_no), c)
      self._sample(dev, live)
      self._act(dev, live)
      live, fresh = [r for r in live if not r.done], False
      if not live:
        break
    dev.close()
    self.metrics = turns.rollout_metrics(rows, self._stats, t0)
    return [r.traj for r in rows]

  def _sample(self, dev, live) -> None:
    """Samples the turn of every live row; re-samples false stops."""
    todo = list(live)
    while todo:
      out, slot_steps = dev.decode(
          todo, [turns.draw(r, self.config) for r in todo], self.stops)
      self._stats["slot_steps"] += slot_steps
      again = []
      for r, (tokens, lps, why) in zip(todo, out):
        why = turns.take_decoded(r, tokens, lps, why, dev.limit)
        if why is None:
          again.append(r)
          continue
        text = dev.text(r, r.seg_tokens, why, self.stops)
        if turns.end_stretch(r, text, why, self.config):
          again.append(r)
      todo = again

  def _act(self, dev, live) -> None:
    """Parses the turns, runs every call, sets each row's observation."""
    called = []
    for r in live:
      if turns.record_turn(r, self.parse, self.config,
                           self.observe) is not None:
        called.append(r)
    t0 = time.perf_counter()
    results = self.toolset.run([r.call[:2] for r in called])
    self._stats["tool_wait_s"] += time.perf_counter() - t0
    self._stats["tool_calls"] += len(called)
    for r, text in zip(called, results):
      turns.take_result(r, text, self.observe)
    for r in live:
      turns.end_turn(r, self.config, dev.limit - r.length)
