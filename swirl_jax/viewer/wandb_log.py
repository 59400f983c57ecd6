"""Weights & Biases export (optional: the `wandb` extra; off by default).

TensorBoard stays the runs' own log. This sends what a workdir holds to
W&B, online or offline (`mode='offline'` writes a run directory that
`wandb sync` uploads later; no account needed to write it): for each
training log (`metrics.jsonl` anywhere under the workdir, e.g. SimpleTIR's,
SWiRL's `rl/`, a warm start's), one W&B run with every record at its
step, and after each iteration's last record a table of up to `samples`
of that iteration's trajectories (`rollouts/iter_<i>.jsonl` beside it):
id, reward, void, turns, tokens, lowest token log-prob, answer and text.
"""

import pathlib

from swirl_jax import errors, jsonl
from swirl_jax.rollout.records import Trajectory
from swirl_jax.viewer import extract

COLUMNS = ("id", "reward", "outcome", "void", "tool_errors", "turns",
           "tokens", "min_logp", "answer", "text")
_TEXT_CHARS = 4000
MODES = ("online", "offline")


def _import_wandb():
  try:
    import wandb  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.UserError(
        "W&B export needs the wandb package: pip install -e '.[wandb]'"
    ) from e
  return wandb


def sample_rows(path: pathlib.Path, n: int) -> list[list]:
  """The table rows of the first `n` trajectories of a rollouts file."""
  rows = []
  for t in jsonl.iterate(path, Trajectory.from_dict, torn_tail=True):
    if len(rows) >= n:
      break
    r = extract.row(t)
    text = "".join(turn.text + turn.observation for turn in t.turns)
    rows.append([r["id"], r["r"], r["o"], r["v"], r["te"], r["nt"], r["nk"],
                 r["ml"], r["ans"], text[:_TEXT_CHARS]])
  return rows


def _iterations(records: list[dict]):
  """(record, iteration it ends or None) per record, in order."""
  for i, rec in enumerate(records):
    it = rec.get("iteration")
    nxt = records[i + 1].get("iteration") if i + 1 < len(records) else None
    ends = it is not None and "val_iteration" not in rec and nxt != it
    yield rec, int(it) if ends else None


def _log_one(wandb, wc, label: str, metrics: pathlib.Path) -> None:
  records = jsonl.read(metrics, torn_tail=True)
  rollouts = metrics.parent / "rollouts"
  run = wandb.init(project=wc.project, mode=wc.mode, name=label,
                   dir=str(metrics.parent),
                   config={"workdir": str(metrics.parent)})
  try:
    logged = set()
    for rec, ended in _iterations(records):
      step = int(rec.get("step", 0))
      run.log({k: v for k, v in rec.items()
               if k != "step" and isinstance(v, (int, float))}, step=step)
      path = rollouts / f"iter_{ended:06d}.jsonl" if ended is not None \
          else None
      if path is not None and path.exists() and ended not in logged:
        logged.add(ended)
        run.log({"rollouts": wandb.Table(
            columns=list(COLUMNS), data=sample_rows(path, wc.samples)),
                 "rollouts_iteration": ended}, step=step)
  finally:
    run.finish()


def export(runs, wc) -> list[str]:
  """Sends every training log of `runs` (page.Run) to W&B; returns the
  names of the W&B runs."""
  if wc.mode not in MODES:
    raise errors.UserError(f"wandb.mode {wc.mode!r}; valid: '' (off), "
                           f"{', '.join(MODES)}")
  wandb = _import_wandb()
  names = []
  for r in runs:
    for metrics in sorted(pathlib.Path(r.workdir).glob("**/metrics.jsonl")):
      rel = metrics.parent.relative_to(r.workdir)
      label = r.label if str(rel) == "." else f"{r.label}/{rel}"
      _log_one(wandb, wc, label, metrics)
      names.append(label)
  return names
