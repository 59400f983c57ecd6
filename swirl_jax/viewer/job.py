"""Job `view`: (re)builds the viewer of a workdir, or compares workdirs.

  python -m swirl_jax.main --config=configs/view.py --workdir=RUN

writes `RUN/rollouts.html` (configs/view.py: the args). With `compare`,
the page holds the groups of every run and its Compare tab pairs any two
(base vs trained, filter on vs off, two seeds), and goes to
`RUN/compare.html` unless `out` names another file. With `wandb.mode`, the
runs' metrics and a table of sample trajectories per iteration also go to
Weights & Biases (`wandb_log`). Prints the page's `file://` address.
"""

import pathlib

from absl import logging

from swirl_jax import distributed
from swirl_jax.viewer import page as page_lib
from swirl_jax.viewer import vocab as vocab_lib
from swirl_jax.viewer import wandb_log


def _runs(c, workdir) -> list[page_lib.Run]:
  """The page's run, then each of `c.compare` ('DIR' or 'label=DIR',
  several joined by '+')."""
  tok = vocab_lib.load(c.tokenizer) if c.tokenizer else None
  main = pathlib.Path(workdir)
  runs = [page_lib.Run(main.name or str(main), main, tok,
                       max_iterations=c.iterations)]
  for item in filter(None, (s.strip() for s in c.compare.split("+"))):
    label, eq, path = item.partition("=")
    path = pathlib.Path(path if eq else label)  # Read by the build.
    runs.append(page_lib.Run(label if eq else path.name, path, tok,
                             max_iterations=c.iterations))
  return runs


def run(config, workdir: str):
  c = config
  runs = _runs(c, workdir)
  out = c.out or (pathlib.Path(workdir) /
                  ("compare.html" if len(runs) > 1 else "rollouts.html"))
  built = None
  with distributed.one_writer(f"{workdir} viewer") as writing:
    if writing:
      built = page_lib.build(runs, out,
                             inline_limit=int(c.inline_mb * (1 << 20)))
      if c.wandb.mode:
        wandb_log.export(runs, c.wandb)
  if built is None:
    return None
  for problem in built.problems:
    logging.warning("viewer: %s", problem)
  print(f"{built.trajectories} trajectories in {built.groups} groups, "
        f"{(built.page_bytes + built.data_bytes) / 1e6:.1f} MB, "
        f"{built.seconds:.1f} s: {built.path.resolve().as_uri()}")
  return built
