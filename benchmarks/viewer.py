r"""Time to build the rollout viewer, its size, and the page's speed.

  python benchmarks/viewer.py --workdir=/tmp/viewer_bench

Measures `swirl_jax.viewer.build` on synthetic SimpleTIR runs written as a
run writes them (rollouts/iter_*.jsonl, the bundled SmolLM2 tokenizer's
ids when installed): the asked size, 16 prompts x 8 samples x 10
iterations with demo-like turns (--turns turns of --tokens action tokens,
a third of the turns with a tool output, a fifth void), then the same
trajectories with 10x the tokens over 2 iterations. The two builds give
the cost per trajectory and per action token (a 2x2 solve, each build the
best of --repeats), which extrapolate to a paper iteration: 512 prompts x
16 samples with --paper_tokens action tokens each (3000: a SimpleTIR
response of a 7B model on MATH; the cap, 16384, bounds it). With
Chromium and selenium it also opens a paper-size list (8192 rows, short
turns) and times loading its summary, filtering and sorting, and opening
one trajectory of --paper_tokens tokens (its chunk holds 64 such).
Prints a line per measurement, then one JSON object.
"""

import argparse
import json
import pathlib
import platform
import shutil
import subprocess
import sys
import time

import numpy as np

from swirl_jax.models import loading
from swirl_jax.rollout.records import Trajectory, Turn, write_jsonl
from swirl_jax.viewer import page as page_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def cpu_model() -> str:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True,
                         check=False).stdout
  except OSError:
    return platform.processor()
  for line in out.splitlines():
    if line.startswith("Model name:"):
      return line.split(":", 1)[1].strip()
  return platform.processor()


def tokenizer():
  try:
    return loading.load_tokenizer("bundled")
  except Exception:  # pylint: disable=broad-except
    return None  # Toy ids; the page then has no vocabulary chunk.


def trajectory(rng, task: str, k: int, turns: int, tokens: int,
               tok) -> Trajectory:
  """One SimpleTIR-like trajectory of `turns` turns of `tokens` ids."""
  vocab = 49152 if tok is not None else 1000
  out = []
  for i in range(turns):
    ids = rng.integers(100, vocab, tokens).tolist()
    lps = np.minimum(0.0, rng.normal(-0.4, 1.2, tokens)).round(6).tolist()
    text = tok.decode(ids) if tok is not None else "x" * (4 * tokens)
    last = i == turns - 1
    void = last and rng.random() < 0.2
    obs = "" if last or rng.random() > 0.33 else \
        "\nCode execution result: " + "7" * 40 + "\n"
    out.append(Turn(text=text, action_ids=ids, action_logprobs=lps,
                    observation=obs, observation_ids=[13] * (len(obs) // 4),
                    tool="python" if obs else None, void=void,
                    answer=None if void or not last else "7",
                    stop_reason="length" if void else "eos"))
  prompt = ("<|im_start|>user\nProblem: what is 6 + 1? " + task +
            "<|im_end|>\n<|im_start|>assistant\n")
  return Trajectory(task, k, prompt, list(range(60)), out,
                    final_answer=out[-1].answer,
                    outcome=bool(out[-1].answer), reward=float(
                        bool(out[-1].answer)),
                    source="bench", meta={"fmt": "simpletir"})


def write_run(work: pathlib.Path, prompts, samples, iterations, turns,
              tokens, tok, seed=0) -> int:
  """A workdir of synthetic rollouts; returns its action tokens."""
  shutil.rmtree(work, ignore_errors=True)
  rng, n = np.random.default_rng(seed), 0
  for it in range(iterations):
    trajs = [trajectory(rng, f"bench/train/{it * prompts + p}", k, turns,
                        tokens, tok)
             for p in range(prompts) for k in range(samples)]
    n += sum(len(t.action_ids) for tr in trajs for t in tr.turns)
    write_jsonl(str(work / "rollouts" / f"iter_{it:06d}.jsonl"), trajs)
  return n


def measure(work, tok, repeats, **size) -> dict:
  tokens = write_run(work, tok=tok, **size)
  best = None
  for _ in range(repeats):
    built = page_lib.build([page_lib.Run("bench", work, tok)])
    if best is None or built.seconds < best.seconds:
      best = built
  trajs = size["prompts"] * size["samples"] * size["iterations"]
  out = dict(size, trajectories=trajs, action_tokens=tokens,
             build_s=round(best.seconds, 3),
             bytes=best.page_bytes + best.data_bytes,
             inline=best.data_bytes == 0,
             jsonl_bytes=sum(p.stat().st_size for p in
                             (work / "rollouts").glob("*.jsonl")))
  print(json.dumps(out), flush=True)
  return out


def fit(a: dict, b: dict, key: str) -> tuple[float, float]:
  """(per trajectory, per action token) of `key` from two builds."""
  m = np.array([[a["trajectories"], a["action_tokens"]],
                [b["trajectories"], b["action_tokens"]]], np.float64)
  return tuple(float(x) for x in np.linalg.solve(m, [a[key], b[key]]))


def _until(test, timeout=120.0) -> None:
  end = time.perf_counter() + timeout
  while not test():
    if time.perf_counter() > end:
      raise TimeoutError("the page did not get there in time")
    time.sleep(0.01)


def browser_times(work, tok, paper_tokens) -> dict | None:
  """Chromium: the paper-size list (8192 rows), then one long trajectory."""
  try:
    # pylint: disable=g-import-not-at-top
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    # pylint: enable=g-import-not-at-top
  except ImportError:
    return None
  binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
  if not binary or not driver:
    return None
  write_run(work, 512, 16, 1, 1, 8, tok)
  long_run = work.with_name(work.name + "_long")  # Not under `work`.
  write_run(long_run, 8, 8, 1, 1, paper_tokens, tok)  # One detail chunk.
  built = page_lib.build([page_lib.Run("paper", work, tok),
                          page_lib.Run("long", long_run, tok)],
                         inline_limit=0)
  opts = webdriver.ChromeOptions()
  opts.binary_location = binary
  for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage"):
    opts.add_argument(arg)
  browser = webdriver.Chrome(service=Service(driver), options=opts)
  wait = "return document.getElementById('status').textContent"
  rows = 512 * 16 + 64
  try:
    t0 = time.perf_counter()
    browser.get(built.path.as_uri())
    _until(lambda: browser.execute_script(wait).startswith(
        f"{rows} of {rows}"))
    open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    browser.execute_script(
        "const s = document.getElementById('f-sort'); s.value = 'ml';"
        "s.dispatchEvent(new Event('change'));"
        "const v = document.getElementById('f-void'); v.value = '1';"
        "v.dispatchEvent(new Event('change'));")
    filter_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    browser.execute_script(
        "const v = document.getElementById('f-void'); v.value = '';"
        "v.dispatchEvent(new Event('change'));"
        "const s = document.getElementById('f-sort'); s.value = 'nk';"
        "s.dispatchEvent(new Event('change'));"
        "document.getElementById('f-dir').value = '-1';"
        "document.getElementById('f-dir').dispatchEvent(new Event('change'));"
        "document.querySelector('#rows tr.row').click();")
    _until(lambda: browser.execute_script(
        "return document.querySelectorAll('.detail .tok').length"))
    detail_s = time.perf_counter() - t0
  finally:
    browser.quit()
  out = dict(rows=rows, open_and_list_s=round(open_s, 3),
             filter_and_sort_s=round(filter_s, 3),
             open_trajectory_s=round(detail_s, 3),
             trajectory_tokens=paper_tokens,
             summary_chunk_bytes=(built.path.with_name("rollouts_data") /
                                  "s0.js").stat().st_size)
  print(json.dumps(out), flush=True)
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", default="/tmp/viewer_bench")
  p.add_argument("--turns", type=int, default=2)
  p.add_argument("--tokens", type=int, default=40)
  p.add_argument("--paper_tokens", type=int, default=3000)
  p.add_argument("--paper_turns", type=int, default=3)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--browser", type=int, default=1)
  a = p.parse_args(argv)
  work, tok = pathlib.Path(a.workdir), tokenizer()
  asked = measure(work / "asked", tok, a.repeats, prompts=16, samples=8,
                  iterations=10, turns=a.turns, tokens=a.tokens)
  longer = measure(work / "long", tok, a.repeats, prompts=16, samples=8,
                   iterations=2, turns=a.turns, tokens=10 * a.tokens)
  paper_trajs, paper_tokens = 512 * 16, 512 * 16 * a.paper_tokens
  per = {k: fit(asked, longer, k) for k in ("build_s", "bytes")}
  paper = dict(prompts=512, samples=16, iterations=1,
               action_tokens_per_trajectory=a.paper_tokens,
               how="per-trajectory and per-token costs solved from the "
                   "two builds above, times 8192 trajectories and their "
                   "tokens")
  for k, (per_traj, per_tok) in per.items():
    paper[k] = round(per_traj * paper_trajs + per_tok * paper_tokens, 1)
    paper[k + "_per_trajectory"] = per_traj
    paper[k + "_per_token"] = per_tok
  browser = browser_times(work / "browser", tok, a.paper_tokens) \
      if a.browser else None
  print(json.dumps(dict(
      benchmark="viewer", cpu=cpu_model(), python=sys.version.split()[0],
      tokenizer="bundled SmolLM2" if tok is not None else "none (toy ids)",
      asked=asked, longer=longer, paper_extrapolated=paper,
      browser=browser)), flush=True)


if __name__ == "__main__":
  main()
