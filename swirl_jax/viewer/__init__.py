"""The rollout viewer: a static HTML page of a run's trajectories.

Every SimpleTIR training run and SWiRL pipeline writes
`<workdir>/rollouts.html` at its end (`write_for_run`), and a seeds job
each seed's; job `view` (configs/view.py) rebuilds it for any workdir, or
compares several. The page opens from disk, with no server and nothing
fetched from the network.

  sources    what a workdir holds: groups of trajectories and their files
  judged     SWiRL's judged steps: labels, P(GOOD), filters, judge replies
  extract    a trajectory as a summary row and a detail record
  data       reading a group (bad lines shown, not fatal), its statistics
  vocab      the token bytes the page decodes, from the run's tokenizer
  page       the build: the page, its manifest and its lazily loaded chunks
  job        job `view`
  wandb_log  optional export of metrics and sample tables to W&B

docs/viewer.md describes the page, its data and what it costs.
"""

import logging
import pathlib

from swirl_jax import distributed
from swirl_jax.viewer import vocab
from swirl_jax.viewer import wandb_log
from swirl_jax.viewer.page import Built, Run, build, read
from swirl_jax.viewer.sources import NoRollouts

REBUILD = "python -m swirl_jax.main --config=configs/view.py --workdir={}"
# Training iterations a run's own page holds (the first, the last and
# evenly spaced between): a paper-size iteration costs a minute and about
# as many bytes as its rollouts file (docs/viewer.md); the view job holds all.
RUN_ITERATIONS = 12


def references(tasks) -> dict[str, str]:
  """Task id -> its reference answer (aliases after ' | ')."""
  return {t.id: " | ".join(map(str, t.answers)) for t in tasks}


def write_for_run(workdir, *, tokenizer=None, tokenizer_spec: str = "",
                  references=None) -> Built | None:
  """The viewer a run writes at its end, on process 0 (every process
  calls it). `tokenizer`: the run's (else one found in the workdir, else
  `tokenizer_spec`'s). The run's outputs are written by then: a viewer
  that cannot be built is a warning with the command that rebuilds it,
  never a failed run."""
  work = pathlib.Path(workdir)
  with distributed.one_writer(f"{workdir} viewer") as writing:
    if not writing:
      return None
    try:
      built = build([Run(work.name, work, tokenizer, tokenizer_spec,
                         references, RUN_ITERATIONS)])
    except (OSError, ValueError, RuntimeError) as e:
      logging.warning("viewer not written (%s); rebuild it with: %s", e,
                      REBUILD.format(workdir))
      return None
  logging.info("viewer: %s (%d trajectories, %.1f s)", built.path.as_uri(),
               built.trajectories, built.seconds)
  return built
