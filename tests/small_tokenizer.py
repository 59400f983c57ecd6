"""The tests' small vocabulary (tests/data/small_tokenizer): SmolLM2's
tokenizer retrained (`Tokenizer.train_like`) to 768 entries on the
synthetic tasks' conversations, the scripted turns the job tests play
and the model judge's two words (each one token, with or without a
space, so their first tokens differ: `judges/model.py`).

A random "tiny" policy with SmolLM2's 49,152-entry vocabulary spends about
97% of its arithmetic in the output layer and the softmax over it: the
job tests that only compare runs with each other (one host against two,
killed against uninterrupted) use this one instead. Its special tokens,
ids and chat template are SmolLM2's. Rebuilt only when those texts change:

  python tests/small_tokenizer.py
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATH = ROOT / "tests" / "data" / "small_tokenizer"
VOCAB = 768  # Even: the vocabulary is sharded over 'tensor'.


def _texts(tok):
  from swirl_jax import warmstart  # pylint: disable=g-import-not-at-top
  from swirl_jax.tasks import synthetic  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(ROOT / "tests"))
  import simpletir_script  # pylint: disable=g-import-not-at-top
  tasks = (synthetic.arithmetic_tasks(300, seed=0)
           + synthetic.compute_tasks(100))
  for t in tasks:
    for fmt in ("swirl", "simpletir"):
      yield warmstart.conversation_text(tok, t, fmt=fmt)
    for k in range(4):
      for turn in range(2):
        yield simpletir_script.script(t.answer, k, turn)
  for _ in range(200):
    yield "GOOD GOOD BAD BAD\nBAD GOOD"


def build(path=PATH) -> None:
  from swirl_jax.models import loading  # pylint: disable=g-import-not-at-top
  base = loading.load_tokenizer("bundled")
  base.train_like(_texts(base), VOCAB).save_hf_dir(path)


if __name__ == "__main__":
  build()
