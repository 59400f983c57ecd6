"""Every command the README and the configs' docstrings show, run as a
newcomer runs it: in a fresh `git clone` of this checkout, without a data
directory, `$HOME` and `/tmp` paths moved into the test's own directory.

Each command ends with status 0, or with status 2 and one `error: ...`
line (no traceback) where what it needs is absent: data files (the line
names the fetch command), a checkpoint, a directory of an earlier run, the
network (the data job runs with HF_HUB_OFFLINE=1). The launchers run with
DRY_RUN=1.

Commands are parsed from the docs, so a new one is run too; `RULES` says
how each kind runs. Runs of minutes (the demos, the CPU pipelines on
synthetic data, the fit job, benchmarks) are marked long and run only with
SWIRL_JAX_LONG_COMMANDS=1, at smoke size where a config has one; the demos
at smoke size are also run by tests/test_demo.py and tests/test_simpletir.py.
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
LONG = os.environ.get("SWIRL_JAX_LONG_COMMANDS") == "1"

# (substring of the command, how it runs): 'skip: why', 'long' (or
# 'long:<text appended to the config arg>'), or 'run'. First match wins;
# a python command without a match runs.
RULES = (
    ("pip install", "skip: the installation itself (CI runs it)"),
    ("configs/<x>.py", "skip: the command's form, not a command"),
    ("export SWIRL_JAX_DATA", "skip: sets the data directory of a shell"),
    ("python benchmarks/", "long"),
    ("--config.job=fit", "long"),
    ("configs/demo.py:seeds=3", "long:,smoke"),
    ("--config.job=judge_calibration", "long"),
    ("configs/demo.py --workdir=$W", "long"),  # Ablations on the demo.
    ("configs/demo.py", "long::smoke"),
    ("configs/simpletir_demo.py:", "long:,smoke"),
    ("configs/simpletir_demo.py", "long::smoke"),
    ("swirl_synthetic_arith.py:runlocal", "long"),
    ("swirl_synthetic_multihop.py:runlocal", "long"),
)


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


def readme_commands() -> list[str]:
  text = (ROOT / "README.md").read_text()
  fence = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
  cmds = [c for lang, body in fence.findall(text) if lang == "bash"
          for c in _logical_lines(body)]
  prose = fence.sub("", text)
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
  return list(dict.fromkeys(readme_commands() + docstring_commands()))


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
  if how.startswith("long:") and LONG:
    arg = how.split(":", 1)[1]
    cmd = re.sub(r"(--config=\S+?\.py(?::\S*?)?)(?=\s)",
                 lambda m: m.group(1) + arg, cmd, count=1)
  return re.sub(r"(^|[;\s])python3? ", rf"\g<1>{sys.executable} ", cmd)


def _env(base: pathlib.Path) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("SWIRL_JAX_DATA", "PYTHONPATH")}
  return dict(env, HOME=str(base / "home"), PYTHONPATH=str(base /
                                                          "swirl_jax"),
              HF_HUB_OFFLINE="1", DRY_RUN="1", SWIRL_JAX_SKIP_FIT_CHECK="1")


def _check(proc, cmd: str) -> None:
  """Status 0, or 2 with each failing run's `error:` line alone."""
  out = (proc.stdout + proc.stderr)[-3000:]
  assert "Traceback" not in proc.stderr, f"{cmd}\n{out}"
  assert proc.returncode in (0, 2), f"{cmd}: status {proc.returncode}\n{out}"
  errors = [l for l in proc.stderr.splitlines() if "error:" in l]
  assert all(l.startswith("error: ") for l in errors), f"{cmd}\n{out}"
  if proc.returncode == 2:
    last = proc.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("error: "), f"{cmd}\n{out}"


def test_commands_are_found_and_classified():
  cmds = commands()
  assert len(cmds) >= 25, cmds
  for c in cmds:
    ok = re.match(r"(python|pip|for |launch/|export |\w+=)", c)
    assert ok, f"a documented command no rule runs: {c}"
  assert any("configs/chat.py" in c for c in cmds)
  assert any(c.startswith("launch/") for c in cmds)


@pytest.mark.parametrize("cmd", commands())
def test_documented_command(cmd, clone):
  how = rule(cmd)
  if how.startswith("skip"):
    pytest.skip(how)
  if how.startswith("long") and not LONG:
    pytest.skip("long: runs with SWIRL_JAX_LONG_COMMANDS=1")
  if re.fullmatch(r"\w+=\S+", cmd):
    pytest.skip("a shell variable, set for the commands after it")
  script = _prepared(cmd, how, clone)
  if "$W" in script:
    script = f"W={clone}/tmp/swirl_demo; {script}"
  proc = subprocess.run(["bash", "-c", script], cwd=clone / "swirl_jax",
                        env=_env(clone), capture_output=True, text=True,
                        timeout=3600 if LONG else 300, check=False)
  _check(proc, cmd)
