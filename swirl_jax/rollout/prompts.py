"""Prompts of the two methods, and how an observation enters the context.

SWiRL: the tool result comes back as a user turn `QUERY -> RESULT`; the
chat template decides the tokens around it. SimpleTIR: the result follows
the code inline in the same assistant turn (`Code execution result: ...`).
"""

from swirl_jax.tasks.records import Task

_TOOL_LINES = {
    "search": "<search_query>QUERY</search_query> searches a document "
              "collection and returns the best passages;",
    "calculator": "<math_exp>EXPRESSION</math_exp> evaluates an arithmetic "
                  "or algebraic expression;",
}

SWIRL_SYSTEM = (
    "You answer questions step by step, using tools. In each step, think "
    "briefly about what you know and what you still need, then do exactly "
    "one thing:\n{tools}\n<answer>ANSWER</answer> gives the final answer "
    "(short: a number, a name or a phrase).\nIssue a query or answer, but "
    "not both. Each tool result comes back as QUERY -> RESULT.")

SIMPLETIR_INSTRUCTION = (
    "Solve the following problem step by step. You can write Python code to "
    "help your reasoning: put it in a block that starts with ```python and "
    "ends with ```. The code runs in a sandbox and its output comes back "
    "after 'Code execution result:'. Use print() to see values. When you "
    "know the answer, write it as \\boxed{{ANSWER}} or call "
    "final_answer(ANSWER) in code.\n\nProblem: {question}")


def default_tools(task: Task) -> tuple[str, ...]:
  """SWiRL's tool per task family: search for QA, the calculator for maths."""
  qa = ("hotpotqa", "musique", "synthetic_multihop")
  return ("search",) if task.source in qa else ("calculator",)


def messages(task: Task, fmt: str, tools=None) -> list[dict]:
  if fmt == "swirl":
    tools = tools or default_tools(task)
    system = SWIRL_SYSTEM.format(
        tools="\n".join(_TOOL_LINES[t] for t in tools))
    return [{"role": "system", "content": system},
            {"role": "user", "content": task.question}]
  if fmt == "simpletir":
    return [{"role": "user",
             "content": SIMPLETIR_INSTRUCTION.format(question=task.question)}]
  raise ValueError(f"unknown format {fmt!r}; valid: swirl, simpletir")


_A, _O = "\x00ACTION\x00", "\x00OBSERVATION\x00"


def observation_frame(tokenizer, fmt: str) -> tuple[str, str]:
  """Text before and after a tool result, after the model's action.

  For SWiRL it is read off the chat template by rendering a sentinel
  action and observation, so any template works: e.g. ChatML gives
  ('<|im_end|>\\n<|im_start|>user\\n', '<|im_end|>\\n<|im_start|>assistant\\n').
  """
  if fmt == "simpletir":
    return "", ""
  text = tokenizer.apply_chat_template(
      [{"role": "user", "content": "q"}, {"role": "assistant", "content": _A},
       {"role": "user", "content": _O}], add_generation_prompt=True)
  if _A not in text or _O not in text:
    raise ValueError("chat template drops assistant or user content; cannot "
                     "frame observations")
  after = text.split(_A, 1)[1]
  before, suffix = after.split(_O, 1)
  return before, suffix


def prompt_ids(tokenizer, task: Task, fmt: str,
               tools=None) -> tuple[str, list[int]]:
  """A task's prompt, rendered by the chat template, and its ids."""
  text = tokenizer.apply_chat_template(messages(task, fmt, tools),
                                       add_generation_prompt=True)
  return text, tokenizer.encode(text)


def observation_ids(tokenizer, frame: tuple[str, str], obs: str,
                    action_ids: list[int]) -> list[int]:
  """The ids of a tool result in its `observation_frame`, after an action
  that may have ended with an EOS."""
  before, after = frame
  eos = set(getattr(tokenizer, "eos_ids", ()) or ())
  # The model's own EOS already closed its turn: do not close it twice.
  if action_ids and action_ids[-1] in eos and before:
    closing = tokenizer.encode_continuation(before)
    if closing and closing[0] == action_ids[-1]:
      before = tokenizer.decode(closing[1:])
  # Tool output is plain text: it cannot fake a turn boundary.
  enc = tokenizer.encode_continuation
  return enc(before) + enc(obs, allow_special=False) + enc(after)
