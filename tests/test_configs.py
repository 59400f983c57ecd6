"""Every config in configs/ loads the way `swirl_jax.main` loads it, with
the commands its docstring documents; derived fields follow overrides."""

import pathlib
import re
import shlex

import pytest
from absl import flags
from ml_collections import config_flags

from swirl_jax import config_lib
from swirl_jax import jobs as job_registry
from swirl_jax.simpletir import train as simpletir_train
from swirl_jax.swirl import jobs

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.relative_to(ROOT).as_posix()
                 for p in (ROOT / "configs").rglob("*.py"))


def _parse(argv):
  """The config `main` would get for these command-line args."""
  fv, argv = flags.FlagValues(), ["main", *argv]
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv,
                                  lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  fv(argv)
  return fv.config


def _documented(path: str) -> list[list[str]]:
  """The `swirl_jax.main` args of each command in the file's docstring; a
  shell `for v in a b; do` loop gives one command per value."""
  doc = config_lib.load_config_module(str(ROOT / path)).__doc__
  text = doc.replace("\\\n", " ")
  loops = dict(re.findall(r"for (\w+) in ([^;]+);", text))
  out = []
  for line in text.splitlines():
    if "swirl_jax.main" not in line:
      continue
    args = shlex.split(line.split("swirl_jax.main", 1)[1])
    names = [v for v in loops if f"${v}" in line]
    values = loops[names[0]].split() if names else [None]
    for value in values:
      out.append([a.replace(f"${names[0]}", value) if value else a
                  for a in args])
  return out


def test_every_config_is_found():
  for path in ("configs/demo.py", "configs/simpletir_math.py",
               "configs/swirl_hotpotqa.py",
               "configs/ablations/swirl_filter.py"):
    assert path in CONFIGS


@pytest.mark.parametrize("path", CONFIGS)
def test_documented_commands_load(path, monkeypatch):
  monkeypatch.chdir(ROOT)  # The commands name configs/ from the repo root.
  commands = _documented(path)
  if path != "configs/swirl_base.py":  # Named only by the experiments.
    assert any(f"--config={path}" in a for cmd in commands for a in cmd)
  for argv in [[f"--config={path}", "--workdir=/tmp/w"], *commands]:
    c = _parse(argv)
    assert c.job in job_registry.JOBS, (argv, c.job)
    for a in argv:  # Each documented override landed where it says.
      key, _, value = a.partition("=")
      if key.startswith("--config."):
        node = c
        for part in key[len("--config."):].split("."):
          node = node[part]
        assert str(node) == value, a


def test_ablations_are_their_experiment_with_their_own_stages():
  base = config_lib.load_config_module(str(ROOT / "configs/swirl_base.py"))
  for data in base.DATA:
    want = base.experiment(data).get_config("runlocal,seed=3").to_dict()
    got = _parse([f"--config=configs/ablations/swirl_filter.py:"
                  f"filter=outcome,data={data},runlocal,seed=3"]).to_dict()
    want.update(stages=("stage1", "filter", "rl", "eval"),
                rl_name="rl_outcome", eval={**want["eval"], "policies": (
                    "base", "rl_outcome")},
                filter={**want["filter"], "strategy": "outcome"})
    assert got == want, data
    sft_vs_rl = _parse([f"--config=configs/ablations/swirl_sft_vs_rl.py:"
                        f"data={data},runlocal,seed=3"]).to_dict()
    assert sft_vs_rl == base.experiment(data).get_config(
        "runlocal,seed=3").to_dict()  # The experiment's stages and policies.
  with pytest.raises(config_lib.ConfigError,
                     match=r"^data='gsm9k'; valid: gsm8k, hotpotqa, "):
    base.experiment("gsm9k")


def _num_steps(*overrides, config="configs/swirl_gsm8k.py:runlocal"):
  """rl_train.num_steps as the job sees it (through the pipeline's entry)."""
  seen = {}
  c = _parse([f"--config={config}", *overrides, "--config.stages=rl"])
  before = c.rl_train.num_steps
  with pytest.MonkeyPatch.context() as m:
    m.setitem(jobs._RUN, "rl",  # pylint: disable=protected-access
              lambda cfg, _: seen.setdefault(len(seen), cfg))
    jobs.run_pipeline(c, "/unused")
    jobs.stage_job("rl")(c, "/unused")  # Job swirl_rl.
  assert c.rl_train.num_steps == before  # The flags' config is left as is.
  return tuple(cfg.rl_train.num_steps for cfg in seen.values())


@pytest.mark.parametrize("overrides,want", [
    # rl_iterations × (states_per_step × samples_per_state // mini_batch):
    # runlocal 4 × (8 × 4 // 8) = 16.
    ((), 16),
    (("--config.stage2.states_per_step=16",), 32),  # 4 × (64 // 8)
    (("--config.rl_train.mini_batch_size=16",), 8),  # 4 × (32 // 16)
    (("--config.rl_iterations=10",), 40),  # 10 × (32 // 8)
    (("--config.rl_train.mini_batch_size=0",), 4),  # 0: the whole batch.
    (("--config.rl_train.num_steps=7",), 7),  # Set: kept as it is.
])
def test_derived_steps_follow_overrides_at_job_start(overrides, want):
  assert _num_steps(*overrides) == (want, want)


def test_derived_steps_at_full_size():
  # 500 iterations × (64 states × 4 actions // 64 rows a step) = 2000.
  assert _num_steps(config="configs/swirl_hotpotqa.py") == (2000, 2000)
  # configs/demo.py: 24 iterations × (16 × 4 // 64) = 24; smoke 2 × 1.
  assert _num_steps(config="configs/demo.py") == (24, 24)
  assert _num_steps(config="configs/demo.py:smoke") == (2, 2)


@pytest.mark.parametrize("config,overrides,want", [
    # num_iterations × (prompts_per_step × group_size // mini_batch_size),
    # mini_batch_size = mini_batch_prompts × group_size unless set.
    ("configs/simpletir_math.py", (), 200 * (512 * 16 // (128 * 16))),
    ("configs/simpletir_math.py", ("--config.num_iterations=10",), 40),
    ("configs/simpletir_math.py", ("--config.mini_batch_prompts=64",), 1600),
    ("configs/simpletir_math.py", ("--config.grpo.group_size=8",
                                   "--config.mini_batch_prompts=256"), 400),
    ("configs/simpletir_math.py", ("--config.train.mini_batch_size=128",),
     200 * 64),
    ("configs/simpletir_math.py:runlocal", (), 8 * (4 * 4 // 8)),
    ("configs/simpletir_demo.py", ("--config.train.mini_batch_size=32",),
     10 * (16 * 8 // 32)),
    ("configs/simpletir_math.py", ("--config.train.num_steps=7",), 7),
])
def test_simpletir_derived_steps_follow_overrides(config, overrides, want):
  c = _parse([f"--config={config}", *overrides])
  before = c.train.num_steps
  assert simpletir_train.resolve(c).train.num_steps == want
  assert c.train.num_steps == before  # The flags' config is left as is.
