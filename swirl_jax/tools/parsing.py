r"""Turn parsing: is a model turn a tool call, a final answer, or neither?

Two formats, selected by name:

`swirl` (SWiRL's prompts): `<search_query>q</search_query>` calls the search
tool, `<math_exp>e</math_exp>` the calculator, `<answer>a</answer>` ends the
trajectory. "Issue a query or answer, but not both": a turn holding two
actions (two calls, or a call and an answer) is `invalid`, and its `error`
is meant to go back to the model as the observation. Tags pair like nested
brackets: a closing tag closes the nearest open tag of its name (tags opened
after it are dropped as unclosed); of the completed pairs, only the
outermost count, so `<answer><math_exp>1</math_exp></answer>` is one answer
whose text holds the tag. A turn whose only tag is unclosed (cut by the
token limit) makes no call: it is `void`, with an `error` naming the tag.

`simpletir` (SimpleTIR's prompt and rollout): the first complete fenced
Python block is the call. Openers are "```python", "```py" and a bare "```"
(the SimpleTIR prompt says "wrapped between ```" and its rollout regex takes
all three); blocks in other languages ("```bash", "```output") are skipped.
The closing fence is "```" at the start of a line, whatever follows it, as
in the SimpleTIR rollout. A code block that calls `final_answer(...)` is
still a `call` (the code must run; `final_answer` prints `\boxed{x}`), with
`final=True`: the rollout ends the trajectory once the observation holds a
`\boxed{}` (see `extract_boxed`). Without a code block, a `\boxed{...}` or a
`final_answer(x)` written in prose is the `answer`. A `\boxed{}` written
before the first code block also answers (SimpleTIR stops there). A turn
with neither a complete code block nor a final answer is `void`: an
unclosed, truncated block is void.

Parsers never raise: any text maps to a `ParsedTurn`.
"""

import dataclasses
import re

FORMATS = ("swirl", "simpletir")

# SWiRL tag -> tool name; `answer` is not a tool.
SWIRL_TOOLS = {"search_query": "search", "math_exp": "calculator"}
ANSWER_TAG = "answer"
PYTHON_TOOL = "python"
_PYTHON_LANGS = frozenset({"", "python", "py", "python3", "py3"})

_TAG_RE = re.compile(r"<(/?)(search_query|math_exp|answer)>")
# An opening fence: ``` then an info string (maybe empty) up to the newline.
_FENCE_OPEN_RE = re.compile(r"```([^\n`]*)\n")
_CLOSE_FENCE = "\n```"
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FINAL_ANSWER_RE = re.compile(r"\bfinal_answer\s*\(")


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
  """What one model turn asks for.

  kind: 'call' (run `tool` on `argument`), 'answer' (final `answer`),
    'void' (no action), or 'invalid' (an action the rollout must refuse;
    `error` says why).
  final: SimpleTIR only, the code calls `final_answer(...)`.
  end: index in the text just after the action; text beyond it (a
    hallucinated tool output, say) is not part of the turn.
  """
  kind: str
  tool: str | None = None
  argument: str | None = None
  answer: str | None = None
  error: str | None = None
  final: bool = False
  end: int | None = None

  @property
  def is_call(self) -> bool:
    return self.kind == "call"

  @property
  def is_answer(self) -> bool:
    return self.kind == "answer"

  @property
  def is_void(self) -> bool:
    return self.kind == "void"


def parse_turn(text: str, fmt: str) -> ParsedTurn:
  """Parses one model turn in format `fmt` ('swirl' or 'simpletir')."""
  _check_format(fmt)
  if not isinstance(text, str):
    return ParsedTurn("void", error="turn is not text")
  if fmt == "swirl":
    return _parse_swirl(text)
  return _parse_simpletir(text)


def is_void(text: str, fmt: str) -> bool:
  """True when the turn holds neither a complete call nor a final answer."""
  return parse_turn(text, fmt).kind == "void"


def stop_strings(fmt: str) -> list[str]:
  """Strings at which a sampler should end the turn (kept in the output).

  SWiRL: the closing tags, exact. SimpleTIR: a closing fence cannot be told
  from a bare opening fence by text alone ("\n```\n" is both), so these
  are candidates: "\n```\n" (a fence line) and "```output" (models that
  write their own output block). A sampler that can run a check on the
  decoded text should stop only when `should_stop` agrees; one that cannot
  stops early on a bare-fence opener, which then parses as void.
  """
  _check_format(fmt)
  if fmt == "swirl":
    return [f"</{tag}>" for tag in (*SWIRL_TOOLS, ANSWER_TAG)]
  return ["\n```\n", "```output"]


def should_stop(text: str, fmt: str) -> bool:
  """Whether a stop-string hit in `text` ends the turn (a complete action)."""
  return parse_turn(text, fmt).kind in ("call", "answer", "invalid")


def _check_format(fmt):
  if fmt not in FORMATS:
    raise ValueError(f"unknown turn format {fmt!r}; expected one of {FORMATS}")


# ----------------------------------------------------------------- SWiRL.


def _swirl_spans(text):
  """Completed outermost tag pairs (name, open_end, close_start, close_end),
  and the names of tags left open."""
  stack, done = [], []
  for m in _TAG_RE.finditer(text):
    name = m.group(2)
    if not m.group(1):
      stack.append((name, m.start(), m.end()))
      continue
    for depth in range(len(stack) - 1, -1, -1):
      if stack[depth][0] == name:
        _, start, open_end = stack[depth]
        del stack[depth:]
        done.append((start, m.end(), name, open_end, m.start()))
        break  # A closing tag with no open partner is ignored.
  outer = [s for s in done
           if not any(o[0] <= s[0] and s[1] <= o[1] and o != s for o in done)]
  outer.sort()
  return [(n, a, b, e) for _, e, n, a, b in outer], [s[0] for s in stack]


def _parse_swirl(text):
  spans, unclosed = _swirl_spans(text)
  if not spans:
    if unclosed:
      return ParsedTurn("void", error=f"unclosed <{unclosed[0]}> tag: end it "
                        f"with </{unclosed[0]}>")
    return ParsedTurn("void", error="no <search_query>, <math_exp> or "
                      "<answer> tag found")
  if len(spans) > 1:
    names = [s[0] for s in spans]
    if ANSWER_TAG in names and len(set(names)) > 1:
      why = "Issue a query or answer, but not both."
    elif ANSWER_TAG in names:
      why = "Give one answer per turn."
    else:
      why = f"Issue one query per turn (found {len(spans)})."
    return ParsedTurn("invalid", error=why)
  name, start, stop, end = spans[0]
  content = text[start:stop].strip()
  if not content:
    return ParsedTurn("invalid", error=f"empty <{name}> tag")
  if name == ANSWER_TAG:
    return ParsedTurn("answer", answer=content, end=end)
  return ParsedTurn("call", tool=SWIRL_TOOLS[name], argument=content, end=end)


# -------------------------------------------------------------- SimpleTIR.


def _first_python_block(text):
  """(opener_start, code, block_end) of the first complete Python block,
  or (opener_start, None, None) for an unclosed one, or None."""
  pos = 0
  while True:
    m = _FENCE_OPEN_RE.search(text, pos)
    if m is None:
      return None
    # Searching from the opener's newline lets an empty block close at once.
    close = text.find(_CLOSE_FENCE, m.end() - 1)
    is_python = m.group(1).strip().lower() in _PYTHON_LANGS
    if close < 0:
      return (m.start(), None, None) if is_python else None
    if is_python:
      code = text[m.end():close] if close >= m.end() else ""
      return m.start(), code, close + len(_CLOSE_FENCE)
    pos = close + len(_CLOSE_FENCE)


def _parse_simpletir(text):
  block = _first_python_block(text)
  complete = block is not None and block[1] is not None
  # Text after a complete block is not part of the turn; a box inside an
  # unclosed block still answers, as in the SimpleTIR rollout.
  boxed = extract_boxed(text[:block[0]] if complete else text)
  if boxed is not None:
    return ParsedTurn("answer", answer=boxed, end=len(text))
  if complete:
    _, code, end = block
    final = _FINAL_ANSWER_RE.search(code) is not None
    return ParsedTurn("call", tool=PYTHON_TOOL, argument=code, final=final,
                      end=end)
  answer = _prose_final_answer(text if block is None else text[:block[0]])
  if answer is not None:
    return ParsedTurn("answer", answer=answer, end=len(text))
  if block is not None:
    return ParsedTurn("void", error="unclosed code block")
  return ParsedTurn("void", error="no complete code block or final answer")


def _prose_final_answer(text):
  """Argument of the last `final_answer(...)` in text, quotes removed."""
  found = None
  for m in _FINAL_ANSWER_RE.finditer(text):
    inner = _balanced(text, m.end() - 1, "(", ")")
    if inner is not None and inner.strip():
      found = inner.strip()
  if found is None:
    return None
  if len(found) >= 2 and found[0] == found[-1] and found[0] in "'\"":
    found = found[1:-1]
  return found


# ---------------------------------------------------------------- \boxed.


def extract_boxed(text: str) -> str | None:
  r"""Content of the last `\boxed{...}` / `\fbox{...}` with balanced braces.

  Escaped braces (`\{`, `\}`) are literal, so `\boxed{\{1,2\}}` gives
  `\{1,2\}`. Returns None when there is no complete box.
  """
  if not isinstance(text, str):
    return None
  for m in reversed(list(_BOXED_RE.finditer(text))):
    inner = _balanced(text, m.end() - 1, "{", "}")
    if inner is not None:
      return inner.strip()
  return None


def _balanced(text, open_at, lo, hi):
  """Text between text[open_at] == lo and its matching hi, or None."""
  depth, i = 0, open_at
  while i < len(text):
    c = text[i]
    if c == "\\":
      i += 2  # An escaped character never opens or closes.
      continue
    if c == lo:
      depth += 1
    elif c == hi:
      depth -= 1
      if depth == 0:
        return text[open_at + 1:i]
    i += 1
  return None
