"""Judge replies read as a judge means them: a corpus of replies as chat
models write them, each with the label it gives (None: no verdict, counted
as unparsable)."""

import pytest

from swirl_jax.judges import replies

GOOD, BAD, NONE = 1.0, 0.0, None

CORPUS = [
    # The word alone, as asked.
    ("GOOD", GOOD),
    ("BAD", BAD),
    ("good", GOOD),
    ("bad", BAD),
    ("Good.", GOOD),
    ("BAD!", BAD),
    ("**GOOD**", GOOD),
    ("`BAD`", BAD),
    ('"GOOD"', GOOD),
    ("  \n GOOD\n", GOOD),
    # The word first, then why.
    ("GOOD - the calculator call computes the needed product.", GOOD),
    ("BAD. The query repeats the previous search word for word.", BAD),
    ("Good, it makes progress toward the answer.", GOOD),
    ("BAD: the answer is given without enough support.", BAD),
    ("BAD. A good step would compute 12*4 first.", BAD),
    # Negations read as BAD.
    ("Not good.", BAD),
    ("not GOOD", BAD),
    ("No, bad.", BAD),
    ("This step is not good.", BAD),
    ("It isn't good.", BAD),
    ("The step is not a good one; it ignores the result.\nNot good.", BAD),
    ("I would say this is not good.", BAD),
    ("Yes, good.", GOOD),
    # The verdict in a closing sentence or line, after an explanation.
    ("The assistant calls the calculator with a relevant expression.\n"
     "Verdict: GOOD", GOOD),
    ("The step searches for an entity unrelated to the question.\n\n"
     "**Verdict:** BAD", BAD),
    ("It answers before computing the total. So the step is BAD.", BAD),
    ("The step uses the earlier result correctly.\nFinal answer: GOOD", GOOD),
    ("I think this step is good.", GOOD),
    ("Judgement - bad", BAD),
    ("Let me check the arithmetic: 7 * 8 = 56, which matches.\n\nGOOD", GOOD),
    # No verdict: unparsable.
    ("", NONE),
    ("I cannot judge this step without more context.", NONE),
    ("GOOD or BAD?", NONE),
    ("It is good that it searches, but the query is malformed.", NONE),
    ("Not bad.", NONE),  # Faint praise is not a verdict.
    ("Good question! Looking closer, the step is BAD.", NONE),  # Disagree.
    ("The step is neither clearly GOOD nor clearly BAD.", NONE),
    ('{"error": "model overloaded"}', NONE),
    ("The answer is", NONE),  # Cut short by max_tokens.
]


@pytest.mark.parametrize("text,want", CORPUS)
def test_process_replies(text, want):
  assert replies.prob_from_text(text, "GOOD", "BAD") == want


def test_the_corpus_is_large_and_covers_every_label():
  assert len(CORPUS) >= 30
  assert {w for _, w in CORPUS} == {GOOD, BAD, NONE}


@pytest.mark.parametrize("text,want", [
    ("YES", 1.0), ("No.", 0.0), ("Yes, they match.", 1.0),
    ("No, the values differ.", 0.0), ("They differ: 12 vs 13.\nAnswer: NO",
                                      0.0), ("Maybe.", None)])
def test_outcome_replies(text, want):
  assert replies.prob_from_text(text, "YES", "NO") == want


def _chat_reply(text, first_token=None, top=()):
  choice = {"message": {"content": text}}
  if first_token is not None:
    choice["logprobs"] = {"content": [{
        "token": first_token, "logprob": 0.0,
        "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top]}]}
  return {"choices": [choice]}


def test_logprobs_come_first_and_text_is_the_fallback():
  import math  # pylint: disable=g-import-not-at-top
  lp = math.log
  reply = _chat_reply("GOOD", "GOOD", [("GOOD", lp(0.6)), ("BAD", lp(0.2)),
                                       ("The", lp(0.2))])
  hit = replies.read_reply(reply, "GOOD", "BAD")
  assert replies.reply_prob(hit, "GOOD", "BAD") == pytest.approx(0.75)
  # Without log-probs, the text: a negation is BAD, prose is unreadable.
  for text, want in (("Not good.", 0.0), ("Hmm.", None)):
    hit = replies.read_reply(_chat_reply(text), "GOOD", "BAD")
    assert replies.reply_prob(hit, "GOOD", "BAD") == want


def _first_token(top):
  import math  # pylint: disable=g-import-not-at-top
  reply = _chat_reply("x", top[0][0], [(t, math.log(p)) for t, p in top])
  return replies.prob_from_logprobs(reply["choices"][0], "GOOD", "BAD")


def test_first_token_counts_each_variants_longest_prefix():
  # 'G' begins many words; with 'GO' listed, GOOD's no-space start is 'GO'.
  assert _first_token([("The", 0.5), ("G", 0.2), ("GO", 0.1), (" GOOD", 0.1),
                       ("B", 0.1)]) == pytest.approx(0.2 / 0.3)
  # Lower case is another word, as for the model judge's token ids.
  assert _first_token([("good", 0.6), ("GO", 0.1), ("B", 0.3)]) == \
      pytest.approx(0.25)


def test_a_word_past_the_listed_alternatives_is_bounded_not_zero():
  # BAD is not listed: its P is at most the least listed one's (0.05).
  assert _first_token([("The", 0.6), ("GO", 0.15), ("A", 0.05)]) == \
      pytest.approx(0.15 / 0.2)
  assert _first_token([("The", 0.6), ("B", 0.3), ("A", 0.1)]) == \
      pytest.approx(0.1 / 0.4)
  assert _first_token([("The", 0.9), ("A", 0.1)]) is None
