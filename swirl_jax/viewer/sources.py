"""What a workdir holds to view: its groups of trajectories and their files.

A group is one batch of trajectories read together, as the runs write them:

  train    <dir>/rollouts/iter_<i>.jsonl         SimpleTIR, one per iteration
  stage1   <dir>/stage1/shard_*.jsonl            SWiRL stage 1 (its judged
                                                 steps in <dir>/filter/)
  heldout  <dir>/eval/trajectories_<policy>.jsonl     SWiRL's evaluation
           <dir>/eval/<policy>/trajectories_<set>.jsonl  SimpleTIR's

`<dir>` is the workdir or any directory under it, so a seeds job's
`seed_<s>/<arm>/` and a SimpleTIR seed's `base/eval/...` are found too.
Checkpoints, exports and TensorBoard directories are not searched.
"""

import dataclasses
import os
import pathlib
import re

from swirl_jax import errors

# Directories that never hold trajectories (and can be large).
_SKIP = {"checkpoints", "tensorboard", "hf", "tokenizer", "search_index",
         "rollouts", "stage1", "filter", "warmstart"}
KINDS = ("train", "stage1", "heldout")


class NoRollouts(errors.UserError, FileNotFoundError):
  """A workdir with nothing to view."""


@dataclasses.dataclass
class Group:
  """Trajectories read together; `files` in reading order."""
  name: str  # As shown: 'iter 3', 'stage 1', 'held out: base'.
  kind: str  # One of KINDS.
  files: list[pathlib.Path]
  where: str = "."  # Its directory, relative to the run's workdir.
  iteration: int | None = None  # Training iteration (kind 'train').
  policy: str = ""  # Held-out policy (kind 'heldout').
  dataset: str = ""  # Held-out set, where the file names one.
  filter_dir: pathlib.Path | None = None  # SWiRL's judged steps.
  run: int = 0  # Index of its run in a comparison.


def _number(path: pathlib.Path) -> int:
  numbers = re.findall(r"\d+", path.name)
  return int(numbers[-1]) if numbers else 0


def _place(d: pathlib.Path, where: str) -> list[Group]:
  """The groups whose files lie directly in `d`'s known subdirectories."""
  out = []
  for path in sorted((d / "rollouts").glob("iter_*.jsonl"), key=_number):
    it = _number(path)
    out.append(Group(f"iter {it}", "train", [path], where, iteration=it))
  shards = sorted((d / "stage1").glob("shard_*.jsonl"))
  if shards:
    filt = d / "filter"
    out.append(Group("stage 1", "stage1", shards, where,
                     filter_dir=filt if filt.is_dir() else None))
  if d.name == "eval":
    for path in sorted(d.glob("trajectories_*.jsonl")):
      policy = path.stem[len("trajectories_"):]
      out.append(Group(f"held out: {policy}", "heldout", [path],
                       where, policy=policy))
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
      for path in sorted(sub.glob("trajectories_*.jsonl")):
        dataset = path.stem[len("trajectories_"):]
        out.append(Group(f"held out: {sub.name}", "heldout", [path],
                         where, policy=sub.name, dataset=dataset))
  return out


def find_groups(workdir) -> list[Group]:
  """Every group under `workdir`, training iterations in order, each
  directory's before those of its subdirectories."""
  root = pathlib.Path(workdir)
  if not root.is_dir():
    raise NoRollouts(f"{root}: no such directory")
  groups = []
  for d, subdirs, _ in os.walk(root):
    subdirs[:] = sorted(s for s in subdirs if s not in _SKIP and not
                        re.search(r"_data(\.tmp\d+)?$", s))  # Pages' data.
    d = pathlib.Path(d)
    rel = d.relative_to(root)
    groups += _place(d, str(rel.parent if d.name == "eval" else rel))
  _prefix_places(groups)
  return groups


def _prefix_places(groups: list[Group]) -> None:
  """Names 'seed_0/grpo: iter 3' where groups come from several places;
  a held-out set is named where a policy has several."""
  per_policy = {}
  for g in groups:
    if g.kind == "heldout":
      per_policy.setdefault((g.where, g.policy), set()).add(g.dataset)
  for g in groups:
    if g.kind == "heldout" and len(per_policy[(g.where, g.policy)]) > 1:
      g.name += f" ({g.dataset})"
  if len({g.where for g in groups}) > 1:
    for g in groups:
      if g.where != ".":
        g.name = f"{g.where}: {g.name}"


def require(groups: list[Group], workdir) -> list[Group]:
  """`groups`, or the one-line error saying what a workdir should hold."""
  if not groups:
    raise NoRollouts(
        f"{workdir}: no rollouts to view: not a SimpleTIR training workdir "
        "(rollouts/iter_*.jsonl) or a SWiRL one (stage1/shard_*.jsonl: run "
        "stage1 first), and no eval/ trajectories")
  return groups


def spread(groups: list[Group], n: int) -> tuple[list[Group], int]:
  """(`groups` with at most `n` training iterations per place: the first,
  the last and evenly spaced between; 0: all, the number left out)."""
  if n <= 0:
    return groups, 0
  drop = set()
  for where in {g.where for g in groups}:
    train = [g for g in groups if g.kind == "train" and g.where == where]
    if len(train) > n:
      keep = {round(i * (len(train) - 1) / max(1, n - 1)) for i in range(n)}
      drop.update(id(g) for i, g in enumerate(train) if i not in keep)
  return [g for g in groups if id(g) not in drop], len(drop)
