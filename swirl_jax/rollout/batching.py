"""Token sequences -> one padded training batch (the step's convention).

Shapes are bucketed (rows up to a multiple of the mini-batch, length up to a
bucket) so a run compiles few step programs; padding rows and columns have
loss mask 0 and contribute nothing. `collate_over_hosts` builds the batch
of host-local rows: each host passes its own.
"""

from typing import Sequence

import numpy as np

from swirl_jax import distributed
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
  T = padded_length(max((len(s[0]) for s in seqs), default=1),
                    length_buckets, max_len)
  rows = padded_rows(n, row_multiple, min_rows)
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


def padded_length(longest: int, length_buckets=LENGTH_BUCKETS,
                  max_len: int | None = None) -> int:
  T = bucket(max(longest, 2), length_buckets)
  return min(T, max_len) if max_len else T


def padded_rows(n: int, row_multiple: int = 1, min_rows: int = 1) -> int:
  rows = max(min_rows, 1 << max(0, (max(n, 1) - 1).bit_length()))
  return int(np.ceil(rows / row_multiple) * row_multiple)


def collate_over_hosts(seqs, advantages=None, *, row_multiple: int = 1,
                       min_rows: int = 1,
                       length_buckets: Sequence[int] = LENGTH_BUCKETS,
                       max_len: int | None = None):
  """`collate` of every host's rows laid end to end by host, each host
  passing only its own `seqs` (and their advantages): one process gets
  `collate`'s batch; several get it as global arrays
  (`distributed.rows_from_hosts`). Only row counts and lengths cross
  hosts as messages. Every host calls it (a collective)."""
  sizes = np.reshape(distributed.gather(np.int64([
      [len(seqs), max((len(s[0]) for s in seqs), default=1)]])), (-1, 2))
  T = padded_length(int(sizes[:, 1].max()), length_buckets, max_len)
  local = collate(seqs, advantages, length_buckets=(T,), max_len=T)
  return distributed.rows_from_hosts(
      {k: v[:len(seqs)] for k, v in local.items()},
      padded_rows(int(sizes[:, 0].sum()), row_multiple, min_rows))
