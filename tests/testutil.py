"""Helpers several test files share: reading what a run wrote (JSONL,
exported weights), running `python -m swirl_jax.main`, and the
`transformers` logits the decoder is compared with."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from swirl_jax import jsonl

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
  """`python -m swirl_jax.main *args` in the checkout; the test fails
  unless it exits `rc` (None: any status)."""
  cmd = [sys.executable, "-m", "swirl_jax.main", *map(str, args)]
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
