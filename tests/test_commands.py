"""Every command the README, the docs/ pages, launch/README.md and the
configs' docstrings show, run as a newcomer runs it: in a fresh `git clone`
of this checkout, without a data directory, `$HOME` and `/tmp` paths moved
into the test's own directory.

Each command ends with status 0, or with status 2 and one `error: ...`
line (no traceback) that names something absent a newcomer brings
(`ABSENT`): a data file (the line names the fetch command), a model
checkpoint, a directory an earlier run makes, the network (the data job
runs with HF_HUB_OFFLINE=1). Any other failure fails, e.g. a CPU pipeline
whose filter keeps no step. The launchers run with DRY_RUN=1.

Commands are parsed from the pages, so a new one is run too; `RULES` says
how each kind runs. Runs of minutes (the demos, the CPU pipelines on
synthetic data, the fit job, benchmarks) carry the `long` marker, which
the default run leaves out (pytest.ini; `python -m pytest -m long
tests/test_commands.py` runs them), at smoke size where a config has one;
the demos at smoke size are also run by tests/test_demo.py and
tests/test_simpletir.py. The long tests give every command but the data
job's the data directory when one is found (`paths.default_data_dir()`):
the long commands, and every other command a second time
(`test_documented_command_with_data`), so the CPU pipelines (`runlocal`)
run to their end. A command that then fails for want of data must name
a file the data directory truly lacks (`_truly_absent`): "no data
directory", or a missing file the directory holds, fails the test. The
data job gets none: without --workdir it would write there.

The pages are also checked for what they name: every repository path
(`swirl_jax/...`, `configs/...`, `docs/...`, ...) and every relative link
(with its #anchor) must exist, and the README's docs index must link every
page of docs/.
"""

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (substring of the command, how it runs): 'skip: why', 'long' (or
# 'long:<text appended to the config arg>'), or 'run'. First match wins;
# a python command without a match runs.
RULES = (
    ("pip install", "skip: the installation itself (CI runs it)"),
    ("-m venv", "skip: makes the environment the installation goes in"),
    ("-m pytest", "skip: the test suite itself"),
    ("apt-get", "skip: installs system packages"),
    ("configs/<x>.py", "skip: the command's form, not a command"),
    ("export SWIRL_JAX_DATA", "skip: sets the data directory of a shell"),
    ("accelerator_gpu.sh", "skip: needs an NVIDIA GPU"),
    ("python benchmarks/", "long"),
    ("--config.job=fit", "long"),
    ("configs/demo.py:seeds=", "long:,smoke"),
    ("configs/demo.py:smoke", "long"),
    ("--config.job=judge_calibration", "long"),
    ("configs/demo.py --workdir=$W", "long"),  # Ablations on the demo.
    ("configs/demo.py", "long::smoke"),
    ("configs/simpletir_demo.py:", "long:,smoke"),
    ("configs/simpletir_demo.py", "long::smoke"),
    ("swirl_synthetic_arith.py:runlocal", "long"),
    ("swirl_synthetic_multihop.py:runlocal", "long"),
)

# What a newcomer may lack, as the error line names it: a command that
# ends with status 2 must say one of these.
ABSENT = (
    "missing file",  # A data file; the line names the fetch command.
    "no data directory",
    "checkpoint is missing",
    # A directory an earlier run makes:
    "not a SimpleTIR training workdir", "no exported policy",
    "run stage1 first",
    "HF_HUB_OFFLINE",  # The network, for the data job.
)

# The pages whose commands and paths are checked.
PAGES = ("README.md", "launch/README.md",
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob(
             "*.md")))


def _logical_lines(text: str) -> list[str]:
  """Shell commands: continuations joined, a for-loop kept whole."""
  out, buf, depth = [], "", 0
  for raw in text.splitlines():
    line = raw.strip()
    if not line or (line.startswith("#") and not buf):
      continue
    buf = f"{buf} {line}" if buf else line
    if buf.endswith("\\"):
      buf = buf[:-1].rstrip()
      continue
    depth += len(re.findall(r"(?:^|[;\s])for\s", line))
    depth -= len(re.findall(r"(?:^|[;\s])done\b", line))
    if depth > 0:
      buf += "" if buf.endswith((";", " do")) else ";"
      continue
    out.append(buf)
    buf = ""
  return out


_FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.M | re.S)


def page_commands(page: str) -> list[str]:
  """The commands of a page: its bash blocks, and `python -m ...` or
  `python benchmarks/...` code spans in its prose."""
  text = (ROOT / page).read_text()
  cmds = [c for lang, body in _FENCE.findall(text) if lang == "bash"
          for c in _logical_lines(body)]
  prose = _FENCE.sub("", text)
  cmds += [" ".join(m.split()) for m in
           re.findall(r"`(python -m [^`]+|python benchmarks/[^`]+)`", prose)]
  return cmds


def docstring_commands() -> list[str]:
  cmds = []
  for path in sorted((ROOT / "configs").rglob("*.py")):
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    cmds += [c for c in _logical_lines(doc)
             if re.match(r"(python |for )", c)]
  return cmds


def commands() -> list[str]:
  cmds = [c for page in PAGES for c in page_commands(page)]
  return list(dict.fromkeys(cmds + docstring_commands()))


def rule(cmd: str) -> str:
  return next((how for key, how in RULES if key in cmd), "run")


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
  """A fresh clone of this checkout's HEAD, with a home of its own."""
  if not (ROOT / ".git").exists() or shutil.which("git") is None:
    pytest.skip("not a git checkout")
  base = tmp_path_factory.mktemp("newcomer")
  subprocess.run(["git", "clone", "-q", str(ROOT), str(base / "swirl_jax")],
                 check=True)
  (base / "home").mkdir()
  (base / "tmp").mkdir()
  return base


def _prepared(cmd: str, how: str, base: pathlib.Path) -> str:
  """The command as run here: /tmp and $HOME paths moved under `base`,
  `python` this interpreter, a smoke arg added where the rule says."""
  cmd = cmd.replace("/tmp/", f"{base}/tmp/").replace("DIR1", "dir1") \
      .replace("DIR2", "dir2")
  if how.startswith("long:"):
    arg = how.split(":", 1)[1]
    cmd = re.sub(r"(--config=\S+?\.py(?::\S*?)?)(?=\s)",
                 lambda m: m.group(1) + arg, cmd, count=1)
  return re.sub(r"(^|[;\s])python3? ", rf"\g<1>{sys.executable} ", cmd)


def _data_dir() -> str:
  """The data directory long runs get ('' where none is found)."""
  from swirl_jax import paths  # pylint: disable=g-import-not-at-top
  return paths.default_data_dir() or ""


def _given_data(cmd: str, data: bool) -> str:
  """The data directory `cmd` runs with: none as a newcomer, or (`data`)
  the one found, but never for the data job ('' for none)."""
  return _data_dir() if data and "configs/data.py" not in cmd else ""


def _env(base: pathlib.Path, data: str) -> dict:
  # XDG_CACHE_HOME too: the default data directory lies under it.
  env = {k: v for k, v in os.environ.items()
         if k not in ("SWIRL_JAX_DATA", "PYTHONPATH", "XDG_CACHE_HOME")}
  if data:
    env["SWIRL_JAX_DATA"] = data
  return dict(env, HOME=str(base / "home"), PYTHONPATH=str(base /
                                                          "swirl_jax"),
              HF_HUB_OFFLINE="1", DRY_RUN="1", SWIRL_JAX_SKIP_FIT_CHECK="1")


def _truly_absent(last: str, data: str, cwd: pathlib.Path) -> bool:
  """Whether what the error line `last` names as absent is absent: no
  data directory only where none was given, a missing data file only if
  the given one lacks it too, a missing checkpoint only if its path does
  not exist."""
  if "no data directory" in last:
    return not data
  m = re.search(r"missing file (\S+?);", last)
  if m and data:  # <data dir>/<dataset>/<file>: the same file in ours.
    return not pathlib.Path(data, *pathlib.Path(m[1]).parts[-2:]).exists()
  m = re.match(r"error: (\S+): checkpoint is missing", last)
  if m:
    return not (cwd / m[1]).exists()
  return True


def _check(proc, cmd: str, data: str = "",
           cwd: pathlib.Path = ROOT) -> None:
  """Status 0, or 2 with one `error:` line, last, naming what is absent
  (and truly absent: `_truly_absent`) when the command ran with `data`
  as its data directory from `cwd`."""
  out = (proc.stdout + proc.stderr)[-3000:]
  assert "Traceback" not in proc.stderr, f"{cmd}\n{out}"
  assert proc.returncode in (0, 2), f"{cmd}: status {proc.returncode}\n{out}"
  errors = [l for l in proc.stderr.splitlines() if "error:" in l]
  assert all(l.startswith("error: ") for l in errors), f"{cmd}\n{out}"
  if proc.returncode == 2:
    last = proc.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("error: "), f"{cmd}\n{out}"
    assert any(a in last for a in ABSENT), (
        f"{cmd}: fails for a reason other than something absent "
        f"({', '.join(ABSENT)}):\n{last}")
    assert _truly_absent(last, data, cwd), (
        f"{cmd}: names as absent what is there (data directory "
        f"{data or 'none'}):\n{last}")


def test_commands_are_found_and_classified():
  cmds = commands()
  assert len(cmds) >= 25, cmds
  for c in cmds:
    ok = re.match(r"(python|pip|apt-get|for |launch/|export |\w+=)", c)
    assert ok, f"a documented command no rule runs: {c}"
  assert any("configs/chat.py" in c for c in cmds)
  assert any(c.startswith("launch/") for c in cmds)


def _run_documented(cmd: str, clone: pathlib.Path, data: bool) -> None:
  """Runs `cmd` in the clone (`data`: with the data directory) and checks
  how it ended."""
  how = rule(cmd)
  if how.startswith("skip"):
    pytest.skip(how)
  if re.fullmatch(r"\w+=\S+", cmd):
    pytest.skip("a shell variable, set for the commands after it")
  script = _prepared(cmd, how, clone)
  if "$W" in script:
    script = f"W={clone}/tmp/swirl_demo; {script}"
  given = _given_data(cmd, data)
  proc = subprocess.run(["bash", "-c", script], cwd=clone / "swirl_jax",
                        env=_env(clone, given), capture_output=True,
                        text=True, timeout=3600 if data else 300,
                        check=False)
  _check(proc, cmd, given, clone / "swirl_jax")


@pytest.mark.parametrize("cmd", [
    pytest.param(c, marks=pytest.mark.long) if rule(c).startswith("long")
    else c for c in commands()])
def test_documented_command(cmd, clone):
  """The command as a newcomer runs it (a long one: at smoke size where
  its config has one, with the data directory)."""
  _run_documented(cmd, clone, data=rule(cmd).startswith("long"))


@pytest.mark.long
@pytest.mark.parametrize("cmd", [c for c in commands() if rule(c) == "run"])
def test_documented_command_with_data(cmd, clone):
  """A command the default run runs without data, run with the data
  directory: the CPU pipelines (`runlocal`) to their end."""
  _run_documented(cmd, clone, data=True)


def readme_quickstart() -> str:
  """The commands of the README's quickstart (its first bash block)."""
  text = (ROOT / "README.md").read_text().split("\n## Quickstart", 1)[1]
  return next(body for lang, body in _FENCE.findall(text) if lang == "bash")


@pytest.mark.long
def test_readme_quickstart_verbatim(clone):
  """The README's quickstart as a newcomer pastes it, in a fresh clone:
  its lines in one shell that stops at the first failure (the virtual
  environment lands in the test's own $HOME, /tmp paths in its
  directory), with nothing from this environment but the package index.
  It installs the package and its dependencies from the index (the
  network) and runs the whole SWiRL demo: minutes, hence long. The demo
  must end with its held-out table, base against SWiRL."""
  script = readme_quickstart().replace("/tmp/", f"{clone}/tmp/")
  assert "venv" in script and "pip install" in script, script
  env = {k: v for k, v in os.environ.items()
         if k not in ("SWIRL_JAX_DATA", "PYTHONPATH", "XDG_CACHE_HOME",
                      "VIRTUAL_ENV")}
  # Off this test's venv: `python3` is the system's, as a newcomer's is.
  env["PATH"] = os.pathsep.join(
      p for p in env.get("PATH", "").split(os.pathsep)
      if not (pathlib.Path(p) / "activate").exists())
  env["HOME"] = str(clone / "home")
  proc = subprocess.run(["bash", "-e", "-c", script],
                        cwd=clone / "swirl_jax", env=env,
                        capture_output=True, text=True, timeout=3600,
                        check=False)
  out = (proc.stdout + proc.stderr)[-3000:]
  assert proc.returncode == 0, f"{script}\n{out}"
  assert "| policy | accuracy |" in proc.stdout, out
  assert "| base |" in proc.stdout and "| rl |" in proc.stdout, out
  assert (clone / "home" / "swirl-venv" / "bin" / "activate").exists()
  assert (clone / "tmp" / "swirl_demo" / "report.md").exists()


def test_the_quickstart_is_found():
  """What test_readme_quickstart_verbatim runs: the venv, the install and
  the demo's command, in the README's order."""
  lines = readme_quickstart().splitlines()
  at = [next((i for i, l in enumerate(lines) if key in l), None)
        for key in ("-m venv", "pip install -e .", "-m swirl_jax.main")]
  assert None not in at and at == sorted(at), lines


def test_check_fails_a_command_that_misses_data_that_is_there(tmp_path):
  """With a data directory given, "no data directory" and a missing file
  the directory holds fail; a file it lacks, or no directory given, pass."""
  (tmp_path / "gsm8k").mkdir()
  (tmp_path / "gsm8k" / "train.jsonl").write_text("")
  def ends(line):
    return subprocess.CompletedProcess([], 2, "", f"log\nerror: {line}\n")
  no_dir = ends("gsm8k split 'train': no data directory (expected ...)")
  held = ends("x: missing file /elsewhere/gsm8k/train.jsonl; fetch it")
  lacked = ends(f"x: missing file {tmp_path}/math/aime24.parquet; fetch it")
  for proc in (no_dir, held):
    with pytest.raises(AssertionError, match="names as absent"):
      _check(proc, "cmd", str(tmp_path))
    _check(proc, "cmd")  # A newcomer: nothing given, truly absent.
  _check(lacked, "cmd", str(tmp_path))
  with pytest.raises(AssertionError, match="names as absent"):
    _check(ends(f"{tmp_path}: checkpoint is missing (a .gguf file)"), "cmd")


# ------------------------------------------------------ what pages name

# A repository path in prose or code: `swirl_jax/...`, `configs/...`, ...
_PATH = re.compile(r"(?<![\w./-])((?:swirl_jax|configs|benchmarks|tests|"
                   r"docs|launch|colabs)/[\w./-]*)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
  """The anchor GitHub gives a Markdown heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  text = _FENCE.sub("", path.read_text())
  return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def _broken_links(page: str) -> list[str]:
  """The relative links of `page` whose file or #anchor does not exist."""
  src = ROOT / page
  broken = []
  for target in _LINK.findall(src.read_text()):
    if re.match(r"\w+:", target):  # http:, https:, mailto:
      continue
    file, _, anchor = target.partition("#")
    path = (src.parent / file).resolve() if file else src
    if not path.exists():
      broken.append(target)
    elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
      broken.append(target)
  return broken


def test_pages_name_only_files_that_exist():
  missing = [(page, p) for page in PAGES
             for p in _PATH.findall((ROOT / page).read_text())
             if not (ROOT / p.rstrip(".")).exists()]
  assert not missing, missing
  broken = [(page, link) for page in PAGES for link in _broken_links(page)]
  assert not broken, broken


def test_a_missing_file_or_anchor_is_caught(tmp_path, monkeypatch):
  """The checks above on a page that names what is not there."""
  page = tmp_path / "docs" / "page.md"
  page.parent.mkdir()
  page.write_text("# Top\n\nSee `configs/nonesuch.py`, [top](#top), "
                  "[gone](#gone) and [file](other.md).\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  assert _PATH.findall(page.read_text()) == ["configs/nonesuch.py"]
  assert _broken_links("docs/page.md") == ["#gone", "other.md"]


def test_readme_docs_index_links_every_page():
  readme = (ROOT / "README.md").read_text()
  index = readme.split("\n## Docs\n", 1)[1].split("\n## ", 1)[0]
  linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", index))
  pages = {p for p in PAGES if p.startswith("docs/")}
  assert pages and linked == pages, (sorted(linked), sorted(pages))


def test_each_docs_page_opens_with_what_it_is_for():
  for page in PAGES:
    if page.startswith("docs/"):
      first = (ROOT / page).read_text().split("\n\n")[1]
      assert first.startswith("This page is for"), (page, first[:80])
