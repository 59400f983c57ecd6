"""Demonstrations that err at known rates, for the CPU runs' warm starts.

A policy warm-started on gold trajectories alone is right wherever it
has been shown the way, and RL then has little to fix. The CPU demos
warm-start on a mix of styles instead (`warmstart.demo_mix`), so that the
base policy takes wrong steps at a rate the mix sets, of the kinds each
method is meant to correct:

SimpleTIR (format 'simpletir', the `compute_tasks` problems):
  tool      runs the expression in a ```python block, then boxes the
            printed value (the gold trajectory);
  direct    boxes an answer without running code: a small model cannot
            compute it, so it learns to guess;
  bad_code  a block that fails (a syntax error), then a guessed answer;
  void      an unclosed block, and the turn ends there: a void turn;
  code_only the gold trajectory's first turn (the ```python block) and
            nothing after it: the warm start trains on it cut at the
            block's end (`ENDS_AT_CALL`), so a policy warm-started on
            `code_only` and `direct` alone has never seen an execution
            result in its context (the single-turn regime in which
            SimpleTIR reports its collapse: what follows tool output is
            out of distribution).
SWiRL (format 'swirl', arithmetic word problems with the calculator):
  gold      every step right;
  operand   the last step takes a wrong number of the problem (another
            of its quantities or an earlier result), so the answer is wrong;
  skip      answers before the last step, with the value of the one
            before it;
  slip      one step, drawn at random, takes a wrong number; the later
            steps carry its value, so the answer is wrong: the steps
            before the slip are good ones in a trajectory that ends wrong
            (what an outcome filter throws away);
  detour    at a step drawn at random, a wasted call on a wrong number
            first, then the right step and the rest: a bad step in a
            trajectory that ends right (what an outcome filter keeps).
The `operand` and `skip` errors sit at the last step, so a policy
warm-started with them at a rate above one half errs there under greedy
decoding (its likelier action is the wrong one) and still samples the
right step often enough for a judge to reward it: the state stage 2 has
to learn at. `slip` and `detour` spread the errors over every step, for
the runs that compare SWiRL's filters (`configs/demo.py:orderings`).

The styles other than `tool` / `gold` end in a wrong answer (a guess can
be right by chance; the checker decides). `styles` draws each task's style
from its id and the seed, so a rerun makes the same demonstrations.
"""

import random

from swirl_jax.tasks import synthetic
from swirl_jax.tasks.records import Task

STYLES = {"simpletir": ("tool", "direct", "bad_code", "void", "code_only"),
          "swirl": ("gold", "operand", "skip", "slip", "detour")}
GOLD = {"simpletir": "tool", "swirl": "gold"}
# Styles whose demonstration ends with its first call: what the loop
# appends after it (the tool's output) stays out of the warm start's data.
ENDS_AT_CALL = frozenset({"code_only"})


def check_mix(mix: dict, fmt: str) -> dict[str, float]:
  """`mix` ({style: weight}) with its weights normalised; ValueError on a
  style the format does not have or weights that do not sum above 0."""
  mix = {str(k): float(v) for k, v in dict(mix).items() if float(v)}
  unknown = set(mix) - set(STYLES[fmt])
  if unknown or not mix or min(mix.values()) < 0:
    raise ValueError(f"demonstration mix {mix} for format {fmt!r}: styles "
                     f"are {', '.join(STYLES[fmt])}, weights >= 0, one > 0")
  total = sum(mix.values())
  return {k: v / total for k, v in mix.items()}


def styles(tasks, mix: dict, fmt: str, seed: int) -> list[str]:
  """Each task's style, drawn from `mix` by the task's id and `seed`."""
  mix = check_mix(mix, fmt)
  names, weights = list(mix), list(mix.values())
  return [random.Random(f"{seed}/{t.id}").choices(names, weights)[0]
          for t in tasks]


def reference_turns(task: Task, style: str, *, spaced: bool = False,
                    fmt: str = "swirl") -> list[dict]:
  """`synthetic.reference_turns` of `task` in `style` (see the module
  docstring): one dict per model turn, `action` and `observation` (what
  the tool returns, for the demo's own use; the warm start replays the
  actions through the loop with live tools)."""
  if style not in STYLES[fmt]:
    raise ValueError(f"style {style!r}; {fmt} styles: "
                     f"{', '.join(STYLES[fmt])}")
  gold = synthetic.reference_turns(task, spaced=spaced, fmt=fmt)
  if style == GOLD[fmt]:
    return gold
  rng = random.Random(f"{style}/{task.id}")
  if fmt == "simpletir":
    return _simpletir(task, style, gold, spaced, rng)
  return _swirl(task, style, spaced, rng)


def _pad(text: str, spaced: bool) -> str:
  return f" {text} " if spaced else text


def _guess(task: Task, rng) -> str:
  """A wrong number near the answer, written as the model would."""
  value, off = int(float(task.answer)), rng.randint(1, 99)
  return str(value - off if value >= off and rng.random() < 0.5
             else value + off)


def _simpletir(task, style, gold, spaced, rng) -> list[dict]:
  first = gold[0]["action"]
  opening = first[:first.index("```python")]
  what = task.metadata["solution_graph"][-1]["description"]
  box = lambda v: f"The {what} is {v}.\n\\boxed{{{_pad(v, spaced)}}}"
  if style == "direct":
    return [{"action": box(_guess(task, rng)), "observation": None}]
  if style == "code_only":
    return gold[:1]
  code = first[first.index("```python"):]
  if style == "void":  # The block never closes; the turn ends in it.
    return [{"action": opening + code[:code.rindex("```")].rstrip("\n"),
             "observation": None}]
  broken = code.replace("print(", "print((", 1)  # An unclosed bracket.
  return [{"action": opening + broken, "observation": None},
          {"action": box(_guess(task, rng)), "observation": None}]


def _swirl(task, style, spaced, rng) -> list[dict]:
  """The gold steps with the style's error (module docstring)."""
  graph = task.metadata["solution_graph"]
  env = dict(task.metadata["quantities"])
  at = len(graph) - 1 if style in ("operand", "skip") else (
      rng.randrange(len(graph)))
  turns, value = [], None
  for i, step in enumerate(graph):
    if style == "skip" and i == at:
      break
    left, right = (env[x] if isinstance(x, str) else x
                   for x in step["operands"])
    if style == "detour" and i == at:  # A wasted call, then the step.
      turns.append(_call(step, *_wrong_operands(step, left, right, env, rng),
                         spaced)[0])
    if style in ("operand", "slip") and i == at:
      left, right = _wrong_operands(step, left, right, env, rng)
    turn, value = _call(step, left, right, spaced)
    env[f"s{i + 1}"] = value
    turns.append(turn)
  last = graph[at - 1 if style == "skip" else -1]["description"]
  turns.append({"action": f"The {last} is {value}.\n"
                          f"<answer>{_pad(str(value), spaced)}</answer>",
                "observation": None})
  return turns


def _call(step, left, right, spaced) -> tuple[dict, float]:
  """(the turn computing `left op right` for `step`, its value)."""
  value = synthetic.OPS[step["op"]](left, right)
  value = int(value) if value == int(value) else round(value, 4)
  expr = f"{left}{step['op']}{right}"
  shown = synthetic.spaced_expression(expr) if spaced else expr
  return {"action": f"Next I need the {step['description']}.\n"
                    f"<math_exp>{_pad(shown, spaced)}</math_exp>",
          "observation": f"{expr} -> {value}"}, value


def _wrong_operands(step, left, right, env, rng):
  """The step's operands with one replaced by another number the problem
  or an earlier step gives, keeping the value whole and not negative."""
  op = synthetic.OPS[step["op"]]
  options = []
  for side in (0, 1):
    if not isinstance(step["operands"][side], str):
      continue  # A literal of the template (4 legs) stays.
    for v in set(env.values()):
      pair = (v, right) if side == 0 else (left, v)
      if v in (left, right) or pair[1] == 0:
        continue
      out = op(*pair)
      if out >= 0 and out == int(out):
        options.append(pair)
  return rng.choice(sorted(options)) if options else (left + 1, right)
