"""A trajectory as the viewer shows it: a summary row and a detail record.

The summary row holds what the filters and sorting read (a few hundred
bytes); the detail holds the turns with their token ids and log-probs,
loaded only when a trajectory is opened. Keys are short: a paper-size
iteration has thousands of rows.

Row keys: `id`, `src`, `r` reward, `o` outcome (1/0/None), `v` void (1/0),
`vw` why it is void, `te` tool errors, `nt` turns, `nk` action tokens, `ml`
lowest action-token log-prob, `ans` final answer, `q` the question,
`stop` the last turn's stop reason, `end` how the rollout ended (meta
flags), and for SWiRL `j` the steps' judge labels ('G', 'B', '?'), `pg`
their lowest P(GOOD), `kept` {strategy: steps kept}.
"""

import math
import re

import numpy as np

from swirl_jax.rollout.records import Trajectory

# The last user message of a chat-formatted prompt, for the templates the
# package's models use (ChatML, Llama 3, Gemma); else the prompt's tail.
_USER = (re.compile(r"<\|im_start\|>user\n(.*?)(?:<\|im_end\|>|$)", re.S),
         re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\s*(.*?)"
                    r"(?:<\|eot_id\|>|$)", re.S),
         re.compile(r"<start_of_turn>user\n(.*?)(?:<end_of_turn>|$)", re.S))
# An exception named in a tool's output ("NameError: ...", "-> Error: ...").
_TOOL_ERROR = re.compile(r"(?:^|[\s>:])(?:[A-Z]\w*(?:Error|Exception)|Error"
                         r"|Traceback \(most recent call last\))\b")
_END_FLAGS = ("void", "overlong", "turn_cap", "context_full")
_QUESTION_CHARS = 300
_ANSWER_CHARS = 120


def question(prompt: str) -> str:
  """The question a prompt asks: the last paragraph of its last user
  message (instructions come first: "... Problem: ..."), cut short."""
  text = prompt
  for pattern in _USER:
    found = pattern.findall(prompt)
    if found:
      text = found[-1]
      break
  paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
  last = paragraphs[-1] if paragraphs else ""
  return _clip(last, _QUESTION_CHARS) or ""


def void_reason(turn, fmt: str) -> str:
  """Why a void turn holds neither a complete tool call nor an answer."""
  text = turn.text
  if turn.stop_reason == "length":
    why = "cut at the turn's token limit"
  elif fmt == "simpletir" and text.count("```") % 2 == 1:
    why = "code block not closed"
  elif fmt == "swirl" and re.search(r"<(search_query|math_exp|answer)>",
                                    text):
    why = "tag not closed"
  else:
    why = "no tool call and no answer"
  return why + (f" (stop: {turn.stop_reason})" if turn.stop_reason else "")


def tool_error(turn) -> bool:
  """Whether the turn's tool output names an error (an exception's name,
  a traceback, or the rollout's 'Error:' for a bad call)."""
  return bool(turn.observation and _TOOL_ERROR.search(turn.observation))


def _number(x) -> float | None:
  """`x` if a finite number, else None (JSON has no NaN)."""
  return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _finite(x) -> float | None:
  return round(float(x), 2) if x is not None and math.isfinite(x) else None


def _lowest(lps) -> float | None:
  """The lowest finite log-prob (min in C first: turns are long)."""
  if not lps:
    return None
  low = min(lps)
  if math.isfinite(low):
    return low
  finite = [x for x in lps if math.isfinite(x)]
  return min(finite) if finite else None


def _rounded(lps, n: int) -> list:
  """Log-probs at 2 decimals (enough to shade and read a token), None
  where not finite; all None when the writer recorded none. numpy: a
  paper-size iteration has tens of millions of tokens."""
  if not lps:
    return [None] * n
  arr = np.round(np.asarray(lps, np.float64), 2)
  if np.isfinite(arr).all():
    return arr.tolist()
  return [x if math.isfinite(x) else None for x in arr.tolist()]


def _clip(text: str | None, n: int) -> str | None:
  return None if text is None else (text if len(text) <= n
                                    else text[:n - 1] + "…")


def row(t: Trajectory, steps: list[dict] | None = None) -> dict:
  """The summary row of `t` (`steps`: SWiRL's judged steps, per turn)."""
  fmt = t.meta.get("fmt", "")
  lows = [_lowest(turn.action_logprobs) for turn in t.turns]
  lows = [x for x in lows if x is not None]
  void_turns = [i for i, turn in enumerate(t.turns) if turn.void]
  out = {
      "id": t.id, "src": t.source,
      "r": _number(t.reward),
      "o": None if t.outcome is None else int(t.outcome),
      "v": int(bool(void_turns) or bool(t.meta.get("void"))),
      "te": sum(tool_error(turn) for turn in t.turns),
      "nt": len(t.turns),
      "nk": sum(len(turn.action_ids) for turn in t.turns),
      "ml": _finite(min(lows)) if lows else None,
      "ans": _clip(t.final_answer, _ANSWER_CHARS),
      "q": question(t.prompt),
      "stop": t.turns[-1].stop_reason if t.turns else "",
      "end": [f for f in _END_FLAGS if t.meta.get(f)],
  }
  if void_turns:
    out["vw"] = f"turn {void_turns[0] + 1}: " + void_reason(
        t.turns[void_turns[0]], fmt)
  if steps is not None:
    out.update(_step_summary(steps))
  return out


def _step_summary(steps: list[dict]) -> dict:
  probs = [s["pg"] for s in steps if s["pg"] is not None]
  kept = {}
  for s in steps:
    for strategy in s["kept"]:
      kept[strategy] = kept.get(strategy, 0) + 1
  return {"j": "".join("?" if s["j"] is None else "GB"[1 - s["j"]]
                       for s in steps),
          "pg": round(min(probs), 3) if probs else None, "kept": kept}


def detail(t: Trajectory, steps: list[dict] | None = None) -> dict:
  """The turns of `t` for its detail view: per turn the action's token
  ids `a` and log-probs `l` (2 decimals; None where not finite or not
  recorded), its text `x`, the tool output `obs` (out of the loss), and
  the parsed call, answer, void flag and stop reason."""
  fmt = t.meta.get("fmt", "")
  turns = []
  for i, turn in enumerate(t.turns):
    d = {"a": list(turn.action_ids), "l": _rounded(turn.action_logprobs,
                                                  len(turn.action_ids)),
         "x": turn.text, "obs": turn.observation, "tool": turn.tool,
         "arg": turn.argument, "ans": turn.answer, "v": int(turn.void),
         "stop": turn.stop_reason, "te": int(tool_error(turn))}
    if turn.void:
      d["vw"] = void_reason(turn, fmt)
    if steps is not None:
      d["step"] = steps[i]
    turns.append(d)
  return {"id": t.id, "p": t.prompt, "turns": turns,
          "ans": t.final_answer, "r": _number(t.reward), "o": t.outcome,
          "meta": {k: v for k, v in t.meta.items() if isinstance(v, (bool, str))
                   or _number(v) is not None}}
