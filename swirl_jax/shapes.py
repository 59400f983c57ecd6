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
