"""Builds the viewer: one HTML page and its data, read from disk.

Layout. `<out>.html` holds the page (its script and style inline, no CDN)
and the manifest: the runs, the groups with their summary figures, and the
problems met while reading. The data is in chunks: per group one summary
chunk (its rows, read by the filters and sorting) and detail chunks of
`CHUNK` trajectories each (token ids, log-probs, texts), plus per run a
vocabulary chunk (the bytes of each token id used). A chunk is loaded the
first time the page needs it: a group's summary when the group is
selected, a detail chunk when one of its trajectories is opened.

Where the chunks live: a run whose chunks total at most `inline_limit`
bytes gets them inside the page, each in its own inert
`<script type="application/json">` element that the page parses on first
use (one file to open, copy or attach); a larger one gets them as
`<out>_data/<chunk>.js` files beside the page, which it loads by adding a
script element (pages opened from disk may not fetch files, but may load
scripts). Either way the page opens at the cost of the manifest alone.

Writes are atomic: the chunks go to a fresh directory that replaces the
old one, then the page replaces the old page.
"""

import dataclasses
import datetime
import json
import os
import pathlib
import re
import shutil
import time

from swirl_jax import jsonl
from swirl_jax.viewer import data as data_lib
from swirl_jax.viewer import extract
from swirl_jax.viewer import judged as judged_lib
from swirl_jax.viewer import sources
from swirl_jax.viewer import vocab as vocab_lib

CHUNK = 64  # Trajectories per detail chunk: one open loads 64 at most.
INLINE_LIMIT = 24 << 20  # Bytes of chunks a page holds inside itself.
REFERENCES = "viewer_references.json"  # Reference answers, kept for rebuilds.
_ASSETS = pathlib.Path(__file__).parent / "assets"


@dataclasses.dataclass
class Built:
  """What a build wrote."""
  path: pathlib.Path
  trajectories: int
  groups: int
  page_bytes: int
  data_bytes: int  # Of the chunk files beside the page (0: all inline).
  seconds: float
  problems: list[str]


@dataclasses.dataclass
class Run:
  """One workdir of a comparison (the first: the page's own)."""
  label: str
  workdir: pathlib.Path
  tokenizer: object = None  # Anything with token_bytes(id); None: found.
  tokenizer_spec: str = ""  # Loaded when the workdir holds no tokenizer.
  references: dict | None = None  # task id -> reference answer.
  max_iterations: int = 0  # Training iterations per place (0: all).


def _json(value) -> str:
  # Compact, readable non-ASCII; '</' and '<!--' escaped so that no text
  # can end or open markup inside a script element.
  return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                    allow_nan=False).replace("</", "<\\/").replace(
                        "<!--", "<\\u0021--")


class _Chunks:
  """Writes chunks as `<name>.js` files into a fresh directory."""

  def __init__(self, directory: pathlib.Path):
    self.dir = directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    self.sizes = {}
    self.groups = 0  # Groups written: each names its chunks by its index.

  def add(self, name: str, value) -> str:
    text = f"VIEWER_CHUNK({json.dumps(name)},{_json(value)});\n"
    data = text.encode("utf-8")
    (self.dir / f"{name}.js").write_bytes(data)
    self.sizes[name] = len(data)
    return name


def _references(run: Run, wheres) -> dict:
  """Reference answers by task id: those kept beside the groups (a run
  keeps what it gave, for rebuilds), then those given now."""
  refs = {}
  for where in dict.fromkeys([".", *wheres]):
    path = run.workdir / where / REFERENCES
    if path.exists():
      try:
        refs.update(jsonl.read_json(path))
      except jsonl.FormatError:
        pass  # A damaged copy: the page shows no references.
  if run.references:
    jsonl.write_bytes(run.workdir / REFERENCES,
                      _json(run.references).encode())
    refs.update(run.references)
  return refs


def _group(run_index: int, g: sources.Group, refs: dict, chunks: _Chunks,
           ids: set, problems: list[str]) -> dict:
  """Reads group `g`, writes its chunks; returns its manifest entry."""
  gid, chunks.groups = chunks.groups, chunks.groups + 1
  trajs = data_lib.read(g, problems)
  judged = judged_lib.read(g.filter_dir) if g.kind == "stage1" else None
  if judged is not None:
    problems += judged.problems
  rows, names = [], []
  for k in range(0, len(trajs), CHUNK):
    prompts, items = {}, []
    for t in trajs[k:k + CHUNK]:
      steps = data_lib.steps_of(t, judged) if judged else None
      row = extract.row(t, steps)
      ref = refs.get(t.task_id)
      if ref is not None:
        row["ref"] = ref
      row["c"], row["k"] = len(names), len(items)
      rows.append(row)
      item = extract.detail(t, steps)
      item["p"] = prompts.setdefault(item["p"], len(prompts))
      items.append(item)
      for turn in t.turns:
        ids.update(turn.action_ids)
    names.append(chunks.add(f"d{gid}_{len(names)}",
                            {"prompts": list(prompts), "items": items}))
  summary = chunks.add(f"s{gid}", rows)
  return dict(name=g.name, kind=g.kind, run=run_index, where=g.where,
              iteration=g.iteration, policy=g.policy, dataset=g.dataset,
              files=[str(p) for p in g.files], summary=summary,
              chunks=names, stats=data_lib.stats(rows),
              strategies=sorted(judged.kept) if judged else [],
              judge=judged.judge.get("kind", "") if judged else "")


def _run(i: int, run: Run, chunks: _Chunks, problems: list[str]
         ) -> tuple[dict, list[dict]]:
  groups = sources.require(sources.find_groups(run.workdir), run.workdir)
  groups, left_out = sources.spread(groups, run.max_iterations)
  refs, ids = _references(run, [g.where for g in groups]), set()
  entries = [_group(i, g, refs, chunks, ids, problems) for g in groups]
  tok = run.tokenizer
  if tok is None:
    tok = vocab_lib.load(vocab_lib.find(run.workdir, [g.where for g in groups])
                         or run.tokenizer_spec)
  vocab = chunks.add(f"v{i}", vocab_lib.table(tok, ids)) if tok else ""
  return dict(label=run.label, workdir=str(run.workdir), vocab=vocab,
              references=len(refs), left_out=left_out), entries


def _page(manifest: dict, inline: dict[str, str]) -> str:
  template = (_ASSETS / "page.html").read_text()
  parts = {"STYLE": (_ASSETS / "viewer.css").read_text(),
           "SCRIPT": (_ASSETS / "viewer.js").read_text(),
           "MANIFEST": _json(manifest),
           "TITLE": manifest["title"].replace("&", "&amp;").replace(
               "<", "&lt;"),
           "CHUNKS": "\n".join(
               f'<script type="application/json" id="chunk-{name}">'
               f"{text}</script>" for name, text in inline.items())}
  # One pass: no inserted text is searched for the next placeholder.
  return re.sub(r"/\*(STYLE|SCRIPT|MANIFEST|TITLE|CHUNKS)\*/",
                lambda m: parts[m.group(1)], template)


def _inline_texts(chunks: _Chunks) -> dict[str, str]:
  """Each chunk file's JSON, for the page to hold (the files then go)."""
  out = {}
  for name in chunks.sizes:
    text = (chunks.dir / f"{name}.js").read_text(encoding="utf-8")
    out[name] = text[text.index(",") + 1:text.rindex(");")]
  return out


# A JSON element of the page; '</' is escaped inside, so the first
# '</script>' ends it.
_ELEMENT = re.compile(r'<script type="application/json" id="(manifest|'
                      r'chunk-[^"]+)">(.*?)</script>', re.S)


def read(path) -> tuple[dict, dict]:
  """(manifest, {chunk name: value}) of a page `build` wrote, its chunks
  inline or beside it: the data the page shows, for tests and tools."""
  path = pathlib.Path(path)
  found = dict(_ELEMENT.findall(path.read_text(encoding="utf-8")))
  manifest = json.loads(found.pop("manifest"))
  chunks = {k[len("chunk-"):]: json.loads(v) for k, v in found.items()}
  if not manifest["inline"]:
    for f in sorted(path.with_name(manifest["data_dir"]).glob("*.js")):
      text = f.read_text(encoding="utf-8")
      chunks[f.stem] = json.loads(text[text.index(",") + 1:
                                       text.rindex(");")])
  return manifest, chunks


def build(runs: list[Run], out: pathlib.Path | str | None = None, *,
          inline_limit: int = INLINE_LIMIT) -> Built:
  """Writes the viewer of `runs` (the first's workdir holds it) to `out`
  (default `<workdir>/rollouts.html`); returns what it wrote."""
  t0 = time.perf_counter()
  out = pathlib.Path(out or runs[0].workdir / "rollouts.html")
  data_dir = out.with_name(out.stem + "_data")
  fresh = out.with_name(f"{out.stem}_data.tmp{os.getpid()}")
  chunks, problems = _Chunks(fresh), []
  try:
    run_entries, groups = [], []
    for i, run in enumerate(runs):
      entry, gs = _run(i, run, chunks, problems)
      run_entries.append(entry)
      groups += gs
    manifest = dict(
        title=" vs ".join(str(r.workdir) for r in runs), runs=run_entries,
        groups=groups, problems=problems, chunk_size=CHUNK,
        data_dir=data_dir.name, built=datetime.datetime.now(
            datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    inline = sum(chunks.sizes.values()) <= inline_limit
    manifest["inline"] = inline
    html = _page(manifest, _inline_texts(chunks) if inline else {})
    shutil.rmtree(data_dir, ignore_errors=True)
    if inline:
      shutil.rmtree(fresh)
    else:
      fresh.rename(data_dir)
  finally:
    shutil.rmtree(fresh, ignore_errors=True)
  page = html.encode("utf-8")
  jsonl.write_bytes(out, page)
  return Built(out, sum(g["stats"]["n"] for g in groups), len(groups),
               len(page), 0 if inline else sum(chunks.sizes.values()),
               time.perf_counter() - t0, problems)
