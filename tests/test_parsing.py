"""Turn parsing: edge cases of both formats, and no text makes it raise."""

from hypothesis import given, settings, strategies as st
import pytest

from swirl_jax.tools import parsing
from swirl_jax.tools.parsing import ParsedTurn, extract_boxed, parse_turn

FENCE = "```"

# Fragments that reach the parsers' interesting states when shuffled.
_PIECES = ["<search_query>", "</search_query>", "<math_exp>", "</math_exp>",
           "<answer>", "</answer>", FENCE, f"{FENCE}python\n", f"{FENCE}py\n",
           f"{FENCE}\n", "\n", "\n```", "\\boxed{", "\\fbox{", "{", "}", "\\{",
           "\\", "final_answer(", "(", ")", "'", "x", "1+1", " "]
texty = st.one_of(st.text(max_size=200),
                  st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))


@settings(max_examples=200, deadline=None)
@given(texty, st.sampled_from(parsing.FORMATS))
def test_never_raises(text, fmt):
  turn = parse_turn(text, fmt)
  assert turn.kind in ("call", "answer", "void", "invalid")
  assert parsing.is_void(text, fmt) == (turn.kind == "void")
  if turn.kind == "call":
    assert turn.tool and turn.argument is not None and turn.end <= len(text)
  if turn.kind == "answer":
    assert turn.answer is not None
  if turn.kind in ("invalid", "void"):
    assert turn.error
  extract_boxed(text)  # Never raises either.


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<>"),
               min_size=1, max_size=50).filter(lambda s: s.strip()))
def test_swirl_call_round_trip(arg):
  turn = parse_turn(f"Let me compute.\n<math_exp>{arg}</math_exp>", "swirl")
  assert turn == ParsedTurn("call", tool="calculator", argument=arg.strip(),
                            end=len(f"Let me compute.\n<math_exp>{arg}"
                                    "</math_exp>"))


SWIRL_CASES = [
    # (text, kind, tool, argument or answer)
    ("Think.\n<search_query>Kiss and Tell 1945</search_query>", "call",
     "search", "Kiss and Tell 1945"),
    ("<math_exp> 12*7 </math_exp>", "call", "calculator", "12*7"),
    ("So: <answer>84</answer>", "answer", None, "84"),
    ("no tags at all", "void", None, None),
    ("<math_exp>12*7", "void", None, None),  # Unclosed: no call.
    ("<answer>a</answer><math_exp>1</math_exp>", "invalid", None, None),
    ("<math_exp>1</math_exp> <search_query>q</search_query>", "invalid", None,
     None),
    ("<answer>1</answer><answer>2</answer>", "invalid", None, None),
    ("<answer>  </answer>", "invalid", None, None),
    # Nested: the outermost complete pair counts.
    ("<answer>so <math_exp>1</math_exp></answer>", "answer", None,
     "so <math_exp>1</math_exp>"),
    # An unclosed outer tag does not hide a complete inner one.
    ("<answer>a <math_exp>2+2</math_exp>", "call", "calculator", "2+2"),
    # A stray closing tag is ignored.
    ("</answer><math_exp>3</math_exp>", "call", "calculator", "3"),
    # Text after the closing tag (past a stop string) is not the turn's.
    ("<math_exp>3</math_exp> 3 -> 3", "call", "calculator", "3"),
    ("<Answer>x</Answer>", "void", None, None),  # Tags are lower case.
]


@pytest.mark.parametrize("text,kind,tool,value", SWIRL_CASES)
def test_swirl_cases(text, kind, tool, value):
  turn = parse_turn(text, "swirl")
  assert turn.kind == kind, turn
  assert turn.tool == tool
  if kind == "call":
    assert turn.argument == value
  if kind == "answer":
    assert turn.answer == value


def test_swirl_errors_explain():
  both = parse_turn("<search_query>q</search_query><answer>a</answer>",
                    "swirl")
  assert "not both" in both.error
  unclosed = parse_turn("<search_query>q", "swirl")
  assert "</search_query>" in unclosed.error


def test_swirl_end_cuts_after_the_action():
  text = "<math_exp>3*4</math_exp>\n3*4 -> 12 (hallucinated)"
  turn = parse_turn(text, "swirl")
  assert text[:turn.end] == "<math_exp>3*4</math_exp>"


SIMPLETIR_CASES = [
    # (text, kind, argument or answer, final)
    ("Compute.\n```python\nprint(1+1)\n```", "call", "print(1+1)", False),
    ("```py\nprint(2)\n```", "call", "print(2)", False),
    ("```\nprint(3)\n```", "call", "print(3)", False),  # Bare fence.
    ("```python\nfinal_answer(5)\n```", "call", "final_answer(5)", True),
    ("```python\nprint(1)", "void", None, False),  # Unclosed block.
    ("```bash\nls\n```\nand no python", "void", None, False),
    ("just thinking", "void", None, False),
    ("So the answer is \\boxed{\\frac{1}{2}}.", "answer", "\\frac{1}{2}",
     False),
    ("\\boxed{\\{1, 2\\}}", "answer", "\\{1, 2\\}", False),
    ("\\fbox{7}", "answer", "7", False),
    ("\\boxed{\\frac{1}{2}", "void", None, False),  # Unbalanced box.
    ("final_answer('abc')", "answer", "abc", False),
    # Only the first complete block runs; later ones are dropped.
    ("```python\na=1\n```\n```python\nb=2\n```", "call", "a=1", False),
    # A non-Python block is skipped, the next Python block is the call.
    ("```output\n4\n```\n```python\nprint(4)\n```", "call", "print(4)",
     False),
    # A box after the code block belongs to a hallucinated continuation.
    ("```python\nprint(9)\n```\n```output\n9\n```\n\\boxed{9}", "call",
     "print(9)", False),
    # A box before the code block answers (SimpleTIR stops there).
    ("\\boxed{3} Let me check:\n```python\nprint(3)\n```", "answer", "3",
     False),
    ("```python\n```", "call", "", False),  # Empty but complete.
]


@pytest.mark.parametrize("text,kind,value,final", SIMPLETIR_CASES)
def test_simpletir_cases(text, kind, value, final):
  turn = parse_turn(text, "simpletir")
  assert turn.kind == kind, turn
  if kind == "call":
    assert turn.tool == "python" and turn.argument == value
    assert turn.final == final
  if kind == "answer":
    assert turn.answer == value


def test_simpletir_end_drops_hallucinated_output():
  text = "```python\nprint(1)\n```output\n1\n```"
  turn = parse_turn(text, "simpletir")
  assert text[:turn.end] == "```python\nprint(1)\n```"


@pytest.mark.parametrize("text,expected", [
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("a \\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{2} then \\boxed{3", "2"),  # Last complete box.
    ("\\boxed {x^{2}}", "x^{2}"),
    ("\\fbox{\\left(1,2\\right)}", "\\left(1,2\\right)"),
    ("no box", None),
    ("\\boxed{}", ""),
])
def test_extract_boxed(text, expected):
  assert extract_boxed(text) == expected


def test_stop_strings():
  assert parsing.stop_strings("swirl") == [
      "</search_query>", "</math_exp>", "</answer>"]
  stops = parsing.stop_strings("simpletir")
  # The closing fence of a finished block hits a stop string...
  done = "```python\nprint(1)\n```\n"
  assert any(s in done for s in stops) and parsing.should_stop(done,
                                                               "simpletir")
  # ...and a bare opening fence hits one too, but should_stop says go on.
  opening = "Let me code.\n```\n"
  assert any(s in opening for s in stops)
  assert not parsing.should_stop(opening, "simpletir")


def test_unknown_format():
  with pytest.raises(ValueError, match="unknown turn format"):
    parse_turn("x", "react")
