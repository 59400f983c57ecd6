"""Helpers several test files share: reading what a run wrote (JSONL,
exported weights), running `python -m swirl_jax.main` and other
subprocesses with the session's compilation cache, the `transformers`
logits the decoder is compared with, and the teacher-forced check of
behaviour log-probs."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from swirl_jax import jsonl
from swirl_jax.models import decoder

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The session's persistent compilation cache (tests/conftest.py).
CACHE_ENV = "SWIRL_JAX_TEST_CACHE"
# XLA's lowest backend optimisation: quicker compiles, slower programs.
# Only for subprocesses whose results are compared with a run under the
# same flag, never where a test pins figures.
FAST_XLA_FLAGS = "--xla_backend_optimization_level=0"


# The decoder's forward pass as one compiled program (the model config is
# static). Run op by op, a tiny model's forward dispatches and compiles
# hundreds of small programs: test_models' three cache calls took 17 s
# that way, 6 s as one program each.
forward = jax.jit(decoder.forward, static_argnums=1)


def cache_dir() -> str:
  """The session's compilation cache directory ('' for none)."""
  path = os.environ.get(CACHE_ENV, "")
  return "" if path in ("", "off") else path


def jax_cache_env() -> dict:
  """The variables that give a subprocess the session's compilation
  cache, every program written to it (none where the cache is off)."""
  if not cache_dir():
    return {}
  return dict(JAX_COMPILATION_CACHE_DIR=cache_dir(),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def read_jsonl(path) -> list[dict]:
  """The rows of a JSONL file, strictly: a torn line fails."""
  return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]


def shard_rows(directory, torn_tail: bool = False) -> list[dict]:
  """The rows of `directory`'s shard_*.jsonl files, shard by shard
  (`torn_tail`: a killed writer's cut last line is dropped)."""
  return [r for p in sorted(pathlib.Path(directory).glob("shard_*.jsonl"))
          for r in jsonl.read(p, torn_tail=torn_tail)]


def load_weights(hf_dir) -> dict[str, np.ndarray]:
  """name -> array of a Hugging Face export's model.safetensors."""
  # Imported here: only the tests that read exports need it.
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  return load_file(str(pathlib.Path(hf_dir) / "model.safetensors"))


def run_main(*args, rc: int | None = 0, timeout: float = 1200, env=None,
             cwd=ROOT) -> subprocess.CompletedProcess:
  """`python -m swirl_jax.main *args` in the checkout, with the session's
  compilation cache; the test fails unless it exits `rc` (None: any
  status)."""
  cmd = [sys.executable, "-m", "swirl_jax.main", *map(str, args)]
  env = dict(jax_cache_env(), **(os.environ if env is None else env))
  proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout, check=False)
  if rc is not None and proc.returncode != rc:
    pytest.fail(f"{' '.join(cmd[1:])} exited {proc.returncode}, not {rc}:\n"
                f"{(proc.stdout + proc.stderr)[-3000:]}")
  return proc


def cpu_env(**extra) -> dict:
  """This process's environment on the CPU backend, plus `extra`."""
  return dict(os.environ, JAX_PLATFORMS="cpu", **extra)


def hf_logits(model, tokens, mask, positions) -> np.ndarray:
  """A `transformers` model's float logits for a padded batch."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens),
                 attention_mask=torch.tensor(mask.astype(np.int64)),
                 position_ids=torch.tensor(positions)).logits.numpy()


def teacher_forced_gap(cfg, params, trajs, rc=None) -> float:
  """The largest |behaviour log-prob - teacher-forced log-prob| over the
  model's tokens of `trajs`: the log-softmax of one forward pass of
  `params` over each trajectory's token sequence, under the distribution
  the tokens were drawn from (`rc`'s temperature, top-k and top-p; None:
  the model's own). A trajectory without a model token fails; a NaN
  makes the gap infinite."""
  # Imported here: most users of this module need no model.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from swirl_jax.models import decoder  # pylint: disable=g-import-not-at-top
  from swirl_jax.sampling import distribution  # pylint: disable=g-import-not-at-top
  fwd = jax.jit(lambda p, t: decoder.forward(p, cfg, t)[0])
  gap = 0.0
  for traj in trajs:
    tokens, mask, logps = traj.token_sequence()
    logits = fwd(params, tokens[None])[0, :-1]
    if rc is not None:
      n = logits.shape[0]
      logits = distribution.sampling_logits(
          logits, jnp.full(n, rc.temperature), jnp.full(n, rc.top_k),
          jnp.full(n, rc.top_p))
    lp = jax.nn.log_softmax(logits, -1)
    ref = np.take_along_axis(np.asarray(lp), tokens[1:, None], 1)[:, 0]
    m = mask[1:] == 1
    assert m.sum() > 0, f"{traj.id}: no model token"
    d = np.abs(logps[1:][m] - ref[m])
    gap = max(gap, float(d.max())) if np.isfinite(d).all() else np.inf
  return gap
