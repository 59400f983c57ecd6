"""The token pieces the page shades: each used token id's bytes.

The page decodes a turn's ids itself (one streaming UTF-8 decoder per
turn, so a character split over two tokens shows on the second), from a
table of the bytes of every id the run used, taken from the run's
tokenizer: the one a run passes at its end, else the first found in the
workdir (`<dir>/hf`, the warm start's, a stage's export), else a spec the
view job names (`tokenizer=`). Without one the page shows each turn's
text and its log-probs as a strip of cells, one per token.
"""

import logging
import pathlib

from swirl_jax.models import loading

# Where runs leave a tokenizer, relative to a directory holding rollouts.
_PLACES = ("hf", "warmstart/hf", "warmstart/tokenizer", "rl/hf", "sft/hf")


def find(workdir, wheres=(".",)) -> str:
  """A Hugging Face tokenizer directory of the run in `workdir` ('' if
  none): first in the places the groups lie, then anywhere below."""
  root = pathlib.Path(workdir)
  for where in (*wheres, "."):
    for place in _PLACES:
      d = root / where / place
      if (d / "tokenizer.json").is_file():
        return str(d)
  for path in sorted(root.glob("**/hf/tokenizer.json")):
    return str(path.parent)
  return ""


def load(spec: str):
  """The tokenizer of `spec` (a directory, a .gguf file, 'bundled'), or
  None with a warning when it cannot be read."""
  if not spec:
    return None
  try:
    return loading.load_tokenizer(spec)
  except (OSError, ValueError, RuntimeError) as e:
    logging.warning("viewer: tokenizer %s not read (%s); turns are shown "
                    "as text with a log-prob strip", spec, e)
    return None


def table(tokenizer, ids) -> dict[int, str]:
  """{id: its bytes as a Latin-1 string} for `ids` (the page turns each
  character back into a byte). Ids outside the vocabulary get ''."""
  out = {}
  for i in sorted(ids):
    try:
      out[i] = tokenizer.token_bytes(i).decode("latin-1")
    except (IndexError, ValueError, KeyError):
      out[i] = ""
  return out
