"""Token sequences -> one padded training batch (the step's convention).

Shapes are bucketed (rows up to a multiple of the mini-batch, length up to a
bucket) so a run compiles few step programs; padding rows and columns have
loss mask 0 and contribute nothing.
"""

from typing import Sequence

import numpy as np

from swirl_jax.shapes import bucket

LENGTH_BUCKETS = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                  6144, 8192, 12288, 16384, 32768)


def collate(seqs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
            advantages: Sequence[float] | None = None, *,
            row_multiple: int = 1, min_rows: int = 1,
            length_buckets: Sequence[int] = LENGTH_BUCKETS,
            max_len: int | None = None) -> dict[str, np.ndarray]:
  """Right-padded batch of (tokens, loss_mask, behaviour_logprobs) rows.

  Rows longer than `max_len` are cut (their tail leaves the loss). Rows are
  padded with empty rows up to a power of two that is a multiple of
  `row_multiple` and at least `min_rows`.
  """
  n = len(seqs)
  longest = max((len(s[0]) for s in seqs), default=1)
  T = bucket(max(longest, 2), length_buckets)
  if max_len:
    T = min(T, max_len)
  rows = max(min_rows, 1 << max(0, (max(n, 1) - 1).bit_length()))
  rows = int(np.ceil(rows / row_multiple) * row_multiple)
  out = dict(tokens=np.zeros((rows, T), np.int32),
             loss_mask=np.zeros((rows, T), np.float32),
             behaviour_logprobs=np.zeros((rows, T), np.float32),
             attention_mask=np.zeros((rows, T), bool),
             advantages=np.zeros((rows,), np.float32))
  for i, (tok, mask, logp) in enumerate(seqs):
    m = min(len(tok), T)
    out["tokens"][i, :m] = tok[:m]
    out["loss_mask"][i, :m] = mask[:m]
    out["behaviour_logprobs"][i, :m] = logp[:m]
    out["attention_mask"][i, :m] = True
  if advantages is not None:
    out["advantages"][:n] = np.asarray(advantages, np.float32)
  return out
