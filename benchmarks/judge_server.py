r"""The HTTP judge against a real server vs the model judge, same model.

Starts llama-cpp-python's OpenAI-compatible server on the bundled
SmolLM2-135M-Instruct GGUF, judges the same steps with the HTTP judge
(P(GOOD) from the first reply token's top log-probs) and with the
in-process model judge (P(GOOD) from the model's next-token distribution,
the GGUF's weights dequantized), and compares labels and P(GOOD). Prints a
summary, then one JSON object on its last line.

  pip install 'llama-cpp-python[server]'  # Builds llama.cpp from source;
  # CMAKE_ARGS="-DGGML_NATIVE=OFF" for a portable build.
  python benchmarks/judge_server.py [--steps=32] [--stage1=DIR]

The steps are those of the CPU demo's task (configs/demo.py: synthetic
arithmetic with the calculator): each question's gold steps and, for each,
a wrong final answer at that state; or, with --stage1=DIR, the step units
of a run's stage 1 shards (e.g. the demo's workdir/stage1). llama-cpp-python
is not in any install extra: its build takes too long for CI
(tests/test_judge_server.py runs this script where it is installed).
"""

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

# pylint: disable=g-import-not-at-top,wrong-import-position
from swirl_jax import config_lib, judges, paths
from swirl_jax.models import loading
from swirl_jax.rollout import decompose
from swirl_jax.rollout.records import StepUnit
from swirl_jax.swirl import stage1
from swirl_jax.tasks import synthetic


def demo_steps(n: int, seed: int = 0) -> list[StepUnit]:
  """`n` steps of the demo's problems: gold steps and wrong answers."""
  units = []
  for task in synthetic.arithmetic_tasks(n, seed=seed, split="train"):
    state = task.question
    for turn in synthetic.reference_turns(task):
      wrong = f"<answer>{int(float(task.answer)) + 7}</answer>"
      units += [StepUnit(trajectory_id=task.id, state_text=state,
                         action_text=turn["action"]),
                StepUnit(trajectory_id=task.id, state_text=state,
                         action_text=wrong)]
      state += turn["action"] + (turn["observation"] or "")
    if len(units) >= n:
      break
  return units[:n]


def run_steps(stage1_dir: str, n: int) -> list[StepUnit]:
  units = decompose.decompose_all(stage1.read_trajectories(stage1_dir))
  return units[:n]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_server(gguf: str, port: int, n_ctx: int, log) -> subprocess.Popen:
  """llama-cpp-python's server on `gguf` (its output to the file `log`),
  once it answers /v1/models."""
  proc = subprocess.Popen(
      [sys.executable, "-m", "llama_cpp.server", "--model", gguf,
       "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
       "--logits_all", "true", "--model_alias", "smollm2",
       "--n_threads", str(os.cpu_count() or 1)],
      stdout=log, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"llama_cpp.server exited ({proc.returncode}); "
                         f"its log: {log.name}")
    try:
      if requests.get(f"http://127.0.0.1:{port}/v1/models",
                      timeout=2).ok:
        return proc
    except requests.RequestException:
      time.sleep(0.5)
  proc.kill()
  raise RuntimeError(f"llama_cpp.server did not start in 600 s; its log: "
                     f"{log.name}")


def compare(p_http, p_model, threshold=0.5) -> dict:
  """Label agreement and P(GOOD) differences over the steps both read."""
  both = [(h, m) for h, m in zip(p_http, p_model) if h is not None]
  h, m = (np.array(x, np.float64) for x in zip(*both)) if both else \
      (np.zeros(0), np.zeros(0))
  d = np.abs(h - m)
  return dict(
      steps=len(p_http), http_unparsable=len(p_http) - len(both),
      label_agreement=float(np.mean((h > threshold) == (m > threshold)))
      if both else None,
      http_good=int(np.sum(h > threshold)),
      model_good=int(np.sum(m > threshold)),
      p_good_mean_http=float(h.mean()) if both else None,
      p_good_mean_model=float(m.mean()) if both else None,
      p_good_abs_diff_mean=float(d.mean()) if both else None,
      p_good_abs_diff_max=float(d.max()) if both else None,
      p_good_corr=float(np.corrcoef(h, m)[0, 1])
      if len(both) > 2 and h.std() > 0 and m.std() > 0 else None)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=32)
  parser.add_argument("--stage1", default="",
                      help="a run's stage 1 directory (default: the demo's "
                      "gold and wrong steps)")
  parser.add_argument("--top_logprobs", default="20,200",
                      help="alternatives the server lists, one HTTP pass "
                      "each (20: OpenAI's and vLLM's default cap)")
  parser.add_argument("--n_ctx", type=int, default=2048)
  args = parser.parse_args()
  units = (run_steps(args.stage1, args.steps) if args.stage1 else
           demo_steps(args.steps))
  states = [u.state_text for u in units]
  actions = [u.action_text for u in units]
  gguf = paths.smollm2_gguf_path()

  cfg, params, tok = loading.load_policy(config_lib.model_config(
      "smollm2_135m", "bundled"))
  model = judges.ModelJudge(params, cfg, tok, max_len=args.n_ctx)
  start = time.perf_counter()
  p_model = model.score_or_none(states, actions)
  model_s = time.perf_counter() - start

  port = _free_port()
  log = tempfile.NamedTemporaryFile("w", prefix="llama_server_",
                                    suffix=".log", delete=False)
  server = start_server(gguf, port, args.n_ctx, log)
  results, p_http = {}, {}
  try:
    for k in map(int, args.top_logprobs.split(",")):
      http = judges.HTTPJudge(f"http://127.0.0.1:{port}", "smollm2",
                              top_logprobs=k, max_concurrency=1,
                              max_unparsable=1.0)
      start = time.perf_counter()
      p_http[k] = http.score_or_none(states, actions)
      results[f"top_logprobs_{k}"] = dict(
          compare(p_http[k], p_model),
          http_judge_s=round(time.perf_counter() - start, 2))
  finally:
    server.terminate()
    server.wait(timeout=60)
    log.close()

  for i, (u, m) in enumerate(zip(units, p_model)):
    if i < 8:
      got = "  ".join(f"http@{k} {'-' if p[i] is None else f'{p[i]:.4f}'}"
                      for k, p in p_http.items())
      print(f"step {i}: model {m:.4f}  {got}  {u.action_text[:50]!r}")
  print(json.dumps(dict(
      benchmark="judge_server", model=os.path.basename(gguf),
      source=args.stage1 or "demo gold and wrong steps", steps=len(units),
      model_judge_s=round(model_s, 2), **results)))


if __name__ == "__main__":
  main()
