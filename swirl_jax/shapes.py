"""Shape buckets: sizes rounded up so a run compiles few programs.

The sampler (batch, prompt, cache and step sizes), the training batches
(`rollout.batching`) and the model judge round their sizes with `bucket`.
"""

import math
from typing import Sequence


def bucket(n: int, buckets: Sequence[int]) -> int:
  """Smallest bucket >= n; past the last, a multiple of the last."""
  for b in sorted(buckets):
    if b >= n:
      return b
  last = max(buckets)
  return last * math.ceil(n / last)


def buckets_upto(n: int, buckets: Sequence[int]) -> list[int]:
  """Every value `min(bucket(x, buckets), n)` takes for 1 <= x <= n: the
  shapes a size capped at n can have (what to compile ahead)."""
  out, x = [], 1
  while x <= n:
    out.append(min(bucket(x, buckets), n))
    x = out[-1] + 1
  return out
