"""Judge calibration: agreement with the exact step labels of synthetic
tasks (hand-computed kappa; the programmatic reference against the labels
the test's trajectories were built with; the job through main, right and
wrong judges)."""

import http.server
import json
import pathlib
import threading

import pytest

from swirl_jax import config_lib
from swirl_jax import judges
from swirl_jax.judges import calibration
from swirl_jax.rollout import decompose
from swirl_jax.rollout.records import Trajectory, Turn, write_jsonl
from swirl_jax.swirl import calibration as job
from swirl_jax.swirl import stage1
from swirl_jax.tasks import datasets, synthetic

import testutil  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "configs" / "demo.py")


def test_kappa_and_confusion_by_hand():
  ref = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
  got = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]
  a = calibration.agreement(got, ref)
  assert a["confusion"] == [[5, 1], [1, 3]]
  # p_o = 0.8; p_e = 0.4 * 0.4 + 0.6 * 0.6 = 0.52; (0.8 - 0.52) / 0.48.
  assert a["kappa"] == pytest.approx(0.28 / 0.48)
  assert a["agreement"] == pytest.approx(0.8)
  assert a["judge_good_rate"] == a["ref_good_rate"] == pytest.approx(0.4)
  assert calibration.agreement(ref, ref)["kappa"] == pytest.approx(1.0)
  inverted = [1 - x for x in ref]
  assert calibration.agreement(inverted, ref)["kappa"] == pytest.approx(
      -0.48 / 0.52)  # p_o = 0, p_e = 0.48.
  assert calibration.agreement([1] * 10, ref)["kappa"] == pytest.approx(0.0)
  assert calibration.agreement([1, 1], [1, 1])["kappa"] is None


def test_report_by_position_and_unreadable_as_bad():
  r = calibration.report([0.9, None, 0.2, 0.8], [1.0, 1.0, 0.0, 0.0],
                         [0, 0, 1, 1])
  assert r["unreadable"] == 1
  assert r["confusion"] == [[1, 1], [1, 1]]
  assert r["by_position"][0]["confusion"] == [[0, 0], [1, 1]]
  assert r["by_position"][1]["confusion"] == [[1, 1], [0, 0]]
  assert r["by_position"][1]["judge_good_rate"] == 0.5
  # Readable: GOOD {0.9} vs BAD {0.2, 0.8}: 0.9 beats both.
  assert r["auc"] == 1.0
  assert r["mean_prob_ref_good"] == 0.9
  assert r["mean_prob_ref_bad"] == pytest.approx(0.5)
  # GOOD {0.3, 0.1} vs BAD {0.3, 0.6}: one tie (0.5) in four pairs.
  assert calibration.auc([0.3, 0.3, 0.1, 0.6], [1, 0, 1, 0]) == \
      pytest.approx(0.125)
  assert calibration.auc([0.3, 0.4], [1, 1]) is None
  # Reference all GOOD, the judge half: p_o = p_e = 0.5.
  assert r["by_position"][0]["kappa"] == pytest.approx(0.0)


def _config():
  return config_lib.load_config_module(DEMO).get_config("smoke=True")


WRONG_CALL = "<math_exp>1234567*3</math_exp>"  # No value of any graph.


def _workdir(tmp_path) -> tuple[str, int, int]:
  """Stage 1 of 3 tasks: a gold trajectory (sample 0, every step GOOD) and
  a wrong one (sample 1: a call to no value of the task's, then the answer
  plus one; both BAD) each."""
  c = _config()
  tasks = datasets.load_tasks(c.data.train, c.data.train_split, None,
                              c.data.train_limit)[:3]
  trajs, good = [], 0
  for t in tasks:
    gold = [Turn(text=s["action"], observation=s["observation"] or "")
            for s in synthetic.reference_turns(t)]
    good += len(gold)
    wrong = [Turn(text=WRONG_CALL, observation="x"),
             Turn(text=f"<answer>{int(t.answer) + 1}</answer>")]
    trajs += [Trajectory(task_id=t.id, prompt=t.question, turns=gold),
              Trajectory(task_id=t.id, sample_index=1, prompt=t.question,
                         turns=wrong)]
  (tmp_path / "stage1").mkdir()
  write_jsonl(str(tmp_path / "stage1" / "shard_00000.jsonl"), trajs)
  return str(tmp_path), good, 2 * len(tasks)


def test_programmatic_judge_against_the_labels_built_in(tmp_path):
  """The job's reference, step by step, against labels set by hand when
  the trajectories were written (not by any judge): kappa 1."""
  work, good, bad = _workdir(tmp_path)
  c = _config()
  units = decompose.decompose_all(
      stage1.read_trajectories(str(pathlib.Path(work) / "stage1")))
  hand = [int(u.trajectory_id.endswith("/0")) for u in units]
  assert (sum(hand), len(hand) - sum(hand)) == (good, bad)
  wrong = [u.action_text for u, h in zip(units, hand) if not h]
  assert wrong.count(WRONG_CALL) == 3  # The hand-written BAD steps.
  tasks = datasets.load_tasks(c.data.train, c.data.train_split, None,
                              c.data.train_limit)
  got = judges.ProgrammaticJudge(tasks).label(
      [u.state_text for u in units], [u.action_text for u in units],
      task_ids=[u.task_id for u in units])
  a = calibration.agreement([int(g) for g in got], hand)
  assert a["confusion"] == [[bad, 0], [0, good]]
  assert a["kappa"] == 1.0


def test_job_through_main(tmp_path):
  """The job's plumbing: the programmatic judge against itself (kappa 1
  by definition; its labels are checked above), the counts by hand."""
  work, good, bad = _workdir(tmp_path)
  out = testutil.run_main(f"--config={DEMO}:smoke", f"--workdir={work}",
                         "--config.job=judge_calibration", timeout=300,
                         env=testutil.cpu_env())
  rep = json.loads(out.stdout.strip().splitlines()[-1])
  assert rep["kappa"] == 1.0 and rep["agreement"] == 1.0
  assert rep["confusion"] == [[bad, 0], [0, good]]
  assert rep["judge_good_rate"] == pytest.approx(good / (good + bad))
  assert rep["by_position"]["0"]["steps"] == 6  # Two trajectories a task.
  assert json.loads(pathlib.Path(rep["path"]).read_text())["kappa"] == 1.0


class _AlwaysGood(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def do_POST(self):
    self.rfile.read(int(self.headers["Content-Length"]))
    data = json.dumps({"choices": [{"index": 0, "message": {
        "role": "assistant", "content": "GOOD"}}]}).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


def test_job_with_a_judge_that_calls_every_step_good(tmp_path):
  work, good, bad = _workdir(tmp_path)
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysGood)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  try:
    c = _config()
    c.judge.update(kind="http", model_name="always-good", max_retries=1,
                   base_url=f"http://127.0.0.1:{srv.server_address[1]}")
    rep = job.run(c, work)
  finally:
    srv.shutdown()
    srv.server_close()
  assert rep["confusion"] == [[0, bad], [0, good]]
  assert rep["kappa"] == pytest.approx(0.0)  # No better than chance.
  assert rep["judge_good_rate"] == 1.0
  assert rep["agreement"] == pytest.approx(good / (good + bad))


def test_job_needs_synthetic_tasks(tmp_path):
  work, _, _ = _workdir(tmp_path)
  c = _config()
  c.data.train = "gsm8k"
  with pytest.raises(ValueError, match="not a synthetic task"):
    job.run(c, work)
