"""The paper configs against docs/differences.md, "Differences from the papers".

Every `config.key=value` code span in that page's table is read and
checked against the config file it names, loaded at its default args, so
the table and the configs cannot drift apart. Then the paper configs'
bad inputs: each fails in one line naming what to run (exit 2).
"""

import ast
import pathlib
import re
import shutil

import pytest

from swirl_jax import config_lib, paths

import testutil  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAPER_CONFIGS = ("simpletir_math", "swirl_gsm8k", "swirl_hotpotqa",
                 "swirl_transfer", "data")
_SPAN = re.compile(r"`(\w+)\.([\w.]+)=([^`]+)`")


def _section() -> str:
  """docs/differences.md, the whole page (the table and its sources)."""
  text = (ROOT / "docs" / "differences.md").read_text()
  assert text.startswith("# Differences from the papers\n"), text[:80]
  return text


def _claims() -> list[tuple[str, str, object]]:
  """(config, dotted key, value) of every code span in the table's rows."""
  rows = [l for l in _section().splitlines() if l.startswith("| ")]
  return [(cfg, key, ast.literal_eval(value)) for row in rows
          for cfg, key, value in _SPAN.findall(row) if cfg in PAPER_CONFIGS]


def _config(name: str):
  return config_lib.load_config_module(
      str(ROOT / "configs" / f"{name}.py")).get_config()


def _get(c, key: str):
  for part in key.split("."):
    c = c[part]
  return tuple(c) if isinstance(c, list) else c


def test_every_value_the_table_claims_is_the_configs():
  claims = _claims()
  configs = {name: _config(name) for name in PAPER_CONFIGS}
  wrong = [(cfg, key, want, _get(configs[cfg], key))
           for cfg, key, want in claims if _get(configs[cfg], key) != want]
  assert not wrong, wrong
  # Every paper config is in the table, and the table keeps its checks.
  assert {cfg for cfg, _, _ in claims} == set(PAPER_CONFIGS)
  assert len(claims) >= 60, len(claims)


def test_the_table_cites_the_public_code_and_every_config_points_to_it():
  section = _section()
  for path in ("train.sh", "recipe/simpletir/simpletir_ray_trainer.py",
               "recipe/simpletir/agent_utils.py", "README.md",
               "recipe/simpletir/config/simpletir_trainer.yaml",
               "workers/fsdp_workers.py"):
    assert path in section, path
  for name in ("simpletir_math", "swirl_base", "swirl_gsm8k",
               "swirl_hotpotqa", "swirl_transfer"):
    doc = " ".join((ROOT / "configs" / f"{name}.py").read_text().split())
    assert "Differences from the papers" in doc, name


def test_key_values_the_brief_fixes():
  """The SimpleTIR values the paper and its code set, read directly."""
  c = _config("simpletir_math")
  assert c.rollout.max_response_tokens == 16384
  assert c.oversample * c.prompts_per_step >= 1280
  assert c.train.mini_batch_size == 128 * 16  # Rows: prompts x samples.
  assert c.old_logprobs == "trainer"
  assert c.eval.k == 32 and c.train.export_hf
  h = _config("swirl_hotpotqa")
  assert h.judge.kind == h.reward.kind == "http"
  assert h.judge.model_name and h.tools.search_corpus == "hotpotqa:wiki"
  assert h.stage2.advantage == "none"
  local = config_lib.load_config_module(
      str(ROOT / "configs" / "swirl_hotpotqa.py")).get_config("runlocal")
  # The CPU runs' judge: the bundled SmolLM2-135M, their default policy.
  assert local.judge.kind == "model"
  assert local.judge.model.checkpoint == "bundled"
  assert local.tools.search_corpus == "hotpotqa:train"
  assert local.stage2.advantage == "mean"
  # That judge calls every step BAD, so its CPU runs train on every step;
  # the paper settings and an exact judge keep the process filter.
  assert h.filter.strategy == "process" and local.filter.strategy == "none"
  exact = config_lib.load_config_module(
      str(ROOT / "configs" / "swirl_hotpotqa.py")).get_config(
          "runlocal,judge=programmatic")
  assert exact.filter.strategy == "process"


# ------------------------------------------------------------- bad input


def _fails(*args, want: str):
  proc = testutil.run_main(*args, rc=None, timeout=600)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 2 and last.startswith("error: "), proc.stderr
  assert want in last, last
  return last


def test_unknown_eval_dataset_is_one_line(tmp_path):
  _fails("--config=configs/simpletir_math.py:runlocal",
         "--config.job=simpletir_eval", "--config.eval.datasets=('amc24',)",
         f"--workdir={tmp_path}",
         want="unknown dataset 'amc24'; valid: aime, aime24, aime25, amc23")
  _fails("--config=configs/swirl_transfer.py:eval=beerqa",
         f"--workdir={tmp_path}",
         want="eval='beerqa'; valid: gsm8k, hotpotqa, musique")
  assert not (tmp_path / "eval").exists()


def test_transfer_without_a_trained_policy_is_one_line(tmp_path):
  _fails("--config=configs/swirl_transfer.py:eval=gsm8k,runlocal,"
         f"policy={tmp_path / 'no_run' / 'rl' / 'hf'}",
         f"--workdir={tmp_path / 'w'}",
         want=f"{tmp_path / 'no_run' / 'rl' / 'hf'}: no exported policy; "
         "train it first")
  assert not (tmp_path / "w" / "eval").exists()


def test_missing_corpus_names_the_data_job(tmp_path):
  data = paths.default_data_dir()
  if not data:
    pytest.skip("data directory not found")
  mine = tmp_path / "data"
  (mine / "hotpotqa").mkdir(parents=True)
  for f in ("hotpotqa_train.json", "dev_distractor_500.jsonl"):
    shutil.copy(pathlib.Path(data) / "hotpotqa" / f, mine / "hotpotqa" / f)
  _fails("--config=configs/swirl_hotpotqa.py", "--config.job=swirl_stage1",
         f"--config.data.data_dir={mine}", f"--workdir={tmp_path / 'w'}",
         want=f"search corpus 'hotpotqa:wiki': missing file "
         f"{mine}/hotpotqa/wiki_abstracts.jsonl; fetch it with: python -m "
         "swirl_jax.main --config=configs/data.py:datasets=hotpotqa_wiki")
  _fails("--config=configs/swirl_hotpotqa.py", "--config.job=swirl_stage1",
         f"--config.data.data_dir={mine}", f"--workdir={tmp_path / 'w'}",
         f"--config.tools.search_corpus={tmp_path}/none.jsonl",
         want=f"corpus file not found: {tmp_path}/none.jsonl (")
  assert not (tmp_path / "w" / "stage1").exists()


@pytest.mark.parametrize("data,tools,corpus,turns", [
    ("gsm8k", ("calculator",), "", 10),
    ("hotpotqa", ("search",), "hotpotqa:wiki", 5),
    ("musique", ("search",), "musique:train", 5)])
def test_transfer_evaluates_with_the_tools_the_data_needs(data, tools,
                                                         corpus, turns):
  c = config_lib.load_config_module(
      str(ROOT / "configs" / "swirl_transfer.py")).get_config(
          f"eval={data},policy=/runs/x/rl/hf")
  assert (c.job, tuple(c.stages)) == ("swirl_eval", ("eval",))
  assert c.data.eval == data and tuple(c.tools.names) == tools
  assert c.tools.search_corpus == corpus and c.stage1.max_turns == turns
  assert tuple(c.eval.policies) == ("base", "trained=/runs/x/rl/hf")
  assert c.judge.kind == "http" and c.eval.llm_correct
