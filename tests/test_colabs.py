"""The colabs run end to end in small mode (SWIRL_JAX_NOTEBOOK_SMALL=1).

Each notebook is executed in a fresh `python3` kernel with the working
directory set to a temporary one. The ablations notebook reads real run
directories: the test makes one with the CPU demo at smoke size.
"""

import os
import pathlib
import nbclient
import nbformat

import testutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLABS = ROOT / "colabs"


def _execute(name: str, cwd: pathlib.Path, **env) -> nbformat.NotebookNode:
  """Runs colabs/<name>; a cell that raises fails the test with its error."""
  nb = nbformat.read(str(COLABS / name), as_version=4)
  nbformat.validate(nb)
  assert not any(c.get("outputs") for c in nb.cells
                 if c.cell_type == "code"), f"{name}: clear the outputs"
  kernel_env = dict(os.environ, SWIRL_JAX_NOTEBOOK_SMALL="1",
                    XLA_FLAGS=testutil.FAST_XLA_FLAGS,
                    **testutil.jax_cache_env(), **env)
  kernel_env["PYTHONPATH"] = os.pathsep.join(
      [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
  client = nbclient.NotebookClient(
      nb, timeout=600, kernel_name="python3",
      resources={"metadata": {"path": str(cwd)}})
  client.execute(env=kernel_env)
  return nb


def _text(nb) -> str:
  """Every stream and text output of the executed notebook."""
  out = []
  for c in nb.cells:
    for o in c.get("outputs", []):
      if o.output_type == "stream":
        out.append(o.text)
      elif "data" in o:
        out += [o.data.get("text/plain", ""), o.data.get("text/markdown", "")]
  return "\n".join(out)


def _images(nb) -> int:
  return sum("image/png" in o.get("data", {})
             for c in nb.cells for o in c.get("outputs", []))


def test_quickstart(tmp_path):
  """The quickstart notebook: the unit table with its gold steps, and a
  training step's reward. It runs the real SmolLM2-135M through the
  notebook's steps (small mode): over a minute."""
  nb = _execute("quickstart.ipynb", tmp_path)
  text = _text(nb)
  assert "| unit | state (tail) | action | judge | outcome |" in text
  assert "GOOD" in text  # The gold steps.
  assert "step 0: reward" in text


def test_ablations_on_a_demo_run(tmp_path, demo_smoke_run):
  """The ablations notebook on the demo's smoke run (made once a session,
  tests/conftest.py) and a missing run: its tables and plots, the missing
  run skipped."""
  work = demo_smoke_run
  for f in ("eval/results.json", "filter/report.json", "rl/metrics.jsonl"):
    assert (work / f).exists(), f
  runs = f"demo={work},missing={tmp_path / 'no_such_run'}"
  nb = _execute("ablations.ipynb", tmp_path, SWIRL_JAX_RUNS=runs)
  text = _text(nb)
  assert "| run | policy | accuracy | process_correctness |" in text
  assert "| demo | base |" in text and "| demo | rl |" in text
  assert "| run | filter |" in text
  assert "[missing] skipped" in text
  assert _images(nb) >= 2  # SFT vs RL bars, reward curve, judged steps.
