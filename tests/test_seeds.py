"""The demo over seeds: the seed override, the mean and spread by hand, and
the driver through main on the smoke config."""

import json
import pathlib

import pytest

from swirl_jax import config_lib
from swirl_jax.evaluation import seeds

import testutil  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["demo.py", "simpletir_demo.py"])
def test_with_seed_is_the_config_built_with_that_seed(name):
  mod = config_lib.load_config_module(str(ROOT / "configs" / name))
  got = seeds.with_seed(mod.get_config("smoke=True"), 2).to_dict()
  want = mod.get_config("smoke=True,seed=2").to_dict()
  assert got == want
  assert got != mod.get_config("smoke=True").to_dict()


def test_aggregate_and_table_by_hand():
  per_seed = {s: {"base": {"accuracy": a, "process_correctness": 0.5},
                  "rl": {"accuracy": a + d}}
              for s, (a, d) in enumerate([(0.2, 0.1), (0.3, 0.0),
                                          (0.4, 0.2)])}
  agg = seeds.aggregate(per_seed, ("accuracy", "process_correctness"))
  acc = agg["base"]["accuracy"]
  assert acc["mean"] == pytest.approx(0.3)
  assert acc["std"] == pytest.approx(0.1)  # sqrt((.01 + 0 + .01) / 2)
  assert (acc["min"], acc["max"], acc["n"]) == (0.2, 0.4, 3)
  assert agg["rl"]["accuracy"]["mean"] == pytest.approx(0.4)
  assert agg["base"]["process_correctness"]["std"] == 0.0
  assert "process_correctness" not in agg["rl"]
  # The paired gain: 0.1, 0.0, 0.2; std 0.1, not beyond its spread.
  gain = agg["rl − base"]["accuracy"]
  assert gain["mean"] == pytest.approx(0.1)
  assert gain["std"] == pytest.approx(0.1)
  assert not seeds.exceeds_spread(gain)
  assert seeds.exceeds_spread(dict(mean=0.1, std=0.05, min=0.05, max=0.2))
  assert not seeds.exceeds_spread(dict(mean=0.1, std=0.05, min=-0.01,
                                       max=0.2))
  assert not seeds.exceeds_spread(dict(mean=0.1, std=0.0, min=0.1,
                                       max=0.1, n=1))
  text = seeds.table(agg, ("accuracy", "process_correctness"))
  assert "| base | 0.300 ± 0.100 (0.200–0.400) | 0.500 ± 0.000" in text
  # rl: 0.3, 0.3, 0.6; std sqrt((.01 + .01 + .04) / 2) = 0.173.
  assert "| rl | 0.400 ± 0.173 (0.300–0.600) | - |" in text
  assert "| rl − base | +0.100 ± 0.100 (+0.000–+0.200) | - |" in text
  assert gain["se"] == pytest.approx(0.1 / 3 ** 0.5)


def test_contrasts_are_paired_differences_of_two_policies():
  per_seed = {s: {"base": {"accuracy": 0.1}, "rl": {"accuracy": a},
                  "sft": {"accuracy": b}}
              for s, (a, b) in enumerate([(0.5, 0.2), (0.4, 0.35),
                                          (0.6, 0.3)])}
  agg = seeds.aggregate(per_seed, ("accuracy",), contrasts=("rl-sft",))
  diff = agg["rl − sft"]["accuracy"]  # 0.3, 0.05, 0.3.
  assert diff["mean"] == pytest.approx(0.65 / 3)
  assert (diff["min"], diff["max"]) == pytest.approx((0.05, 0.3))
  assert seeds.exceeds_spread(diff)
  assert "| rl − sft | +0.217* ± 0.144 (+0.050–+0.300) |" in seeds.table(
      agg, ("accuracy",))
  with pytest.raises(ValueError, match="two policies every seed has"):
    seeds.aggregate(per_seed, ("accuracy",), contrasts=("rl-rl_outcome",))


def test_demo_over_two_seeds_through_main(tmp_path):
  """The seeds job through `python -m swirl_jax.main`: two smoke-size
  warm starts and evaluations of the base policy (the driver is what is
  tested), each compiled in a fresh process: about a minute on 2 cores."""
  args = (f"--config={ROOT / 'configs' / 'demo.py'}:smoke=True,seeds=2",
          f"--workdir={tmp_path}", "--config.stages=warmstart,eval",
          "--config.eval.policies=base")
  out = testutil.run_main(*args, timeout=600, env=testutil.cpu_env(
      XLA_FLAGS=testutil.FAST_XLA_FLAGS))
  rep = json.loads(out.stdout.strip().splitlines()[-1])
  assert rep == json.loads((tmp_path / "seeds.json").read_text())
  assert rep["seeds"] == 2 and set(rep["policies"]) == {"base"}
  accs = [json.loads((tmp_path / f"seed_{s}" / "eval" / "results.json")
                     .read_text())["base"]["accuracy"] for s in (0, 1)]
  assert rep["policies"]["base"]["accuracy"]["mean"] == pytest.approx(
      sum(accs) / 2)
  done = json.loads((tmp_path / "seed_1" / "done.json").read_text())
  assert done["seed"] == 1 and done["wall_s"] > 0
  # Each seed's wall time and the commit it ran at, in the JSON and table.
  assert rep["runs"]["1"] == {"wall_s": done["wall_s"],
                              "commit": seeds.commit()}
  assert "seed 1: " in (tmp_path / "seeds.md").read_text()
  # A finished seed is read, not run again: edit its results and rerun.
  res = tmp_path / "seed_0" / "eval" / "results.json"
  r = json.loads(res.read_text())
  r["base"]["accuracy"] = 7.0
  res.write_text(json.dumps(r))
  out = testutil.run_main(*args, timeout=120, env=testutil.cpu_env())
  rep = json.loads(out.stdout.strip().splitlines()[-1])
  assert rep["policies"]["base"]["accuracy"]["max"] == 7.0


def test_first_seed_extends_the_table(tmp_path):
  """`first_seed` runs seeds N .. N+seeds-1 in the same workdir; the table
  then covers every finished seed, the earlier ones read, not rerun."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  ran = []

  def run_seed(c, workdir):
    ran.append(c.seed)
    p = pathlib.Path(workdir)
    p.mkdir(parents=True, exist_ok=True)
    (p / "r.json").write_text(json.dumps(
        {"base": {"acc": 0.1 * c.seed}, "rl": {"acc": 0.2 * c.seed + 0.1}}))

  def read_seed(workdir):
    return json.loads((pathlib.Path(workdir) / "r.json").read_text())

  def job(seeds_, first):
    c = ml_collections.ConfigDict(dict(seed=0, seeds=seeds_,
                                       first_seed=first))
    return seeds.run(c, str(tmp_path), run_seed=run_seed,
                     read_seed=read_seed, metrics=("acc",))
  first = job(2, 0)
  assert ran == [0, 1] and first["seeds"] == 2
  out = job(2, 2)
  assert ran == [0, 1, 2, 3]  # Seeds 0 and 1 were read, not rerun.
  assert out["seeds"] == 4 and list(out["per_seed"]) == ["0", "1", "2", "3"]
  assert out["policies"]["base"]["acc"]["max"] == pytest.approx(0.3)
  assert out["policies"]["rl − base"]["acc"]["mean"] == pytest.approx(
      0.1 + 0.1 * 1.5)
  with pytest.raises(ValueError, match="first_seed -1"):
    job(1, -1)
