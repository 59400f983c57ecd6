"""What a newcomer reads: whole-config validation before anything is
written, one-line errors without class names or escaping, no torch notice,
log lines and errors never on a progress bar's line, each table once."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

# pylint: disable=redefined-outer-name,protected-access

from swirl_jax import config_lib, errors, jobs
from swirl_jax.swirl import filters
from swirl_jax.swirl import jobs as swirl_jobs

from test_errors import cli  # pylint: disable=unused-import
from test_errors import _assert_one_line_error

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args, line", [
    (("--config=configs/demo.py:smok",),
     "unknown config arg 'smok'; valid: filters, first_seed, orderings, "
     "seed, seeds, smoke"),
    (("--config=configs/demo.py:smoke=maybe",),
     "config arg smoke='maybe': expected a boolean"),
    (("--config=configs/demo.py", "--config.rl_train.optim.lrr=1"),
     "unknown config key 'lrr' in --config.rl_train.optim.lrr=1; did you "
     "mean 'lr'?"),
    (("--config=configs/demo.py", "--config.rl_train.nosuch.x=1"),
     "unknown config key 'nosuch' in --config.rl_train.nosuch.x=1"),
    (("--config=configs/demo.py", "--config.rl_iterations=abc"),
     "flag --config.rl_iterations=abc: invalid literal for int() with base "
     "10: 'abc'"),
])
def test_config_typos_read_as_one_plain_line(cli, tmp_path, args, line):
  code, err = cli(*args, f"--workdir={tmp_path / 'w'}")
  _assert_one_line_error(code, err, line)
  assert not (tmp_path / "w").exists()


def test_a_misspelt_preset_fails_before_the_warm_start_writes(cli, tmp_path):
  code, err = cli("--config=configs/simpletir_demo.py:smoke",
                  "--config.model.preset=minii", f"--workdir={tmp_path / 'w'}")
  assert code == 2 and err.startswith("error: unknown model preset 'minii'")
  assert not (tmp_path / "w").exists()  # No warmstart/tokenizer/.


def test_a_preset_typo_is_not_masked_by_missing_data(cli, tmp_path):
  code, err = cli("--config=configs/swirl_gsm8k.py:model=minii,runlocal",
                  f"--config.data.data_dir={tmp_path / 'none'}",
                  f"--workdir={tmp_path / 'w'}")
  assert code == 2 and err.startswith("error: unknown model preset 'minii'")
  code, err = cli("--config=configs/swirl_gsm8k.py:model=mini,runlocal",
                  f"--config.data.data_dir={tmp_path / 'none'}",
                  f"--workdir={tmp_path / 'w'}")
  assert code == 2 and err.startswith("error: gsm8k split 'train': missing "
                                      "file")
  assert not (tmp_path / "w").exists()


def test_validation_reads_each_jobs_data_sets():
  c = config_lib.load_config_module(
      str(REPO / "configs" / "swirl_gsm8k.py")).get_config("runlocal")
  assert jobs._data_blocks(c) == [("gsm8k", "train"), ("gsm8k", "test")]
  c.stages = ("sft", "report")  # Read saved steps and files only.
  assert jobs._data_blocks(c) == []
  c.data.eval_split = "tst"
  c.stages = ("eval",)
  with pytest.raises(config_lib.ConfigError, match="no split 'tst'"):
    jobs.validate(c)


def _quiet_env(hide_torch: bool, tmp_path) -> dict:
  env = dict(os.environ, PYTHONPATH=str(REPO))
  if hide_torch:  # As installed without torch (the core does not need it).
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.modules['torch'] = None\n")
    env["PYTHONPATH"] = f"{tmp_path}:{REPO}"
  return env


def test_no_torch_notice_without_torch(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "swirl_jax.main", "--config=configs/chat.py:"
       "model=tiny", "--config.max_new_tokens=2",
       f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True,
      text=True, env=_quiet_env(True, tmp_path), timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "PyTorch" not in proc.stderr + proc.stdout


_BAR_JOB = textwrap.dedent("""
    import sys
    import tqdm
    from absl import app, logging
    from swirl_jax import errors, jobs, main

    def run(config, workdir):  # A bar, a log line mid-bar, then a fault.
      bar = tqdm.tqdm(total=4, unit="step")
      bar.update(1)
      logging.info("halfway there")
      bar.update(1)
      raise errors.UserError("disk says no")

    sys.modules["bar_job"] = sys.modules[__name__]
    jobs.register("bar_job", "bar_job:run")
    app.run(main.main, flags_parser=main._parse_flags)
    """)


def _screen_lines(text: str) -> list[str]:
  """What a terminal shows: each line as its last carriage return left it."""
  return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_log_lines_and_errors_never_share_a_bar_line(tmp_path):
  (tmp_path / "job.py").write_text(_BAR_JOB)
  (tmp_path / "cfg.py").write_text(
      "import ml_collections\n\ndef get_config():\n"
      "  return ml_collections.ConfigDict(dict(job='bar_job'))\n")
  proc = subprocess.run(
      [sys.executable, str(tmp_path / "job.py"), f"--config={tmp_path}/"
       "cfg.py", f"--workdir={tmp_path / 'w'}"], cwd=REPO,
      capture_output=True, text=True, env=_quiet_env(False, tmp_path),
      timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = _screen_lines(proc.stderr)
  logged = [l for l in lines if "halfway there" in l]
  assert len(logged) == 1 and re.match(r"I\d{4} ", logged[0]), lines
  assert [l for l in lines if "error:" in l] == ["error: disk says no"]
  assert any("2/4" in l for l in lines)  # The bar, on lines of its own.


def test_a_filter_that_keeps_nothing_says_why_in_one_line(tmp_path):
  c = config_lib.load_config_module(
      str(REPO / "configs" / "swirl_gsm8k.py")).get_config("runlocal")
  c.filter.strategy = "process"  # runlocal's model judge trains on all.
  out = tmp_path / "filter"
  out.mkdir()
  (out / "units_process.jsonl").touch()
  (out / "report.json").write_text(json.dumps({"process": dict(
      steps_in=32, steps_judged_good=0, steps_kept=0, trajectories_in=8,
      trajectories_kept=0)}))
  with pytest.raises(filters.NothingKept) as e:
    swirl_jobs.run_rl(swirl_jobs.resolve(c), str(tmp_path))
  line = errors.one_line(e.value)
  assert line == str(e.value) and "\n" not in line
  assert line == (
      f"{out}/units_process.jsonl: the 'process' filter kept no step: the "
      "model judge called 0 of 32 steps GOOD (GOOD rate 0.000); try "
      "--config.filter.strategy=none, another judge (--config.judge.kind, "
      "--config.judge.threshold) or more stage 1 samples "
      "(--config.stage1.samples, now 2)")


def test_the_pipeline_prints_the_results_table_once(monkeypatch, tmp_path):
  calls = []
  for stage in ("eval", "report"):
    monkeypatch.setitem(swirl_jobs._RUN, stage,
                        lambda c, w, stage=stage, **kw: calls.append(
                            (stage, kw)))
  c = config_lib.load_config_module(
      str(REPO / "configs" / "swirl_gsm8k.py")).get_config("runlocal")
  c.stages = ("eval", "report")
  swirl_jobs.run_pipeline(c, str(tmp_path))
  # The report prints the table, so eval does not.
  assert calls == [("eval", {"show": False}), ("report", {})]
  calls.clear()
  c.stages = ("eval",)
  swirl_jobs.run_pipeline(c, str(tmp_path))
  assert calls == [("eval", {})]
