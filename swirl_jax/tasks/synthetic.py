"""Synthetic tasks with known solution graphs, for CPU-size runs.

Five families, each fully determined by its seed:

- Arithmetic word problems (`arithmetic_tasks`): 2 to 4 steps, each one
  operation on the problem's numbers or on earlier results. The solution
  graph lists the steps: operands, the expression with numbers filled in
  (what a calculator call would send) and its value. For the calculator
  and the Python tool.
- Chains (`chain_tasks`): arithmetic word problems of 2 or 3 steps whose
  numbers come in the order the steps use them, every number below 200
  (the CPU SWiRL demo's). Held-out split disjoint as for computations.
- Computations (`compute_tasks`): "What is the remainder of 47 * 86
  divided by 51?" and the like: one expression of two-digit numbers with
  an answer below 100. A
  small model cannot produce the answer without running code, so they
  are where SimpleTIR's tool use has to pay. The held-out split is
  disjoint from the others by construction (`compute_split`).
- Multi-hop questions over a generated world (`multihop_tasks`): invented
  products, companies, people and cities, described by `{title, text}`
  paragraphs (`multihop_corpus`, write it with `write_corpus_jsonl` for
  `SearchTool`). "Who founded the company that makes the X?" needs one
  search per hop; every other paragraph is a distractor. The solution graph
  lists the hops: query, entity, relation, answer, gold paragraph.
- Look-ups (`lookup_tasks`): "Which colour is box 37?", answered by one
  search of `lookup_corpus` ("Box 37 is red."). Each box's colour is
  drawn at random, so nothing in the question says it: a policy answers
  above chance only by calling the tool and reading its result. One-hop
  members of the multi-hop family (same answer checker, prompt and
  programmatic judge).

`reference_turns(task)` gives a gold trajectory in the SWiRL format
(`<math_exp>` / `<search_query>` steps, then `<answer>`), or for arithmetic
in SimpleTIR's (```python blocks, then `\\boxed{}`), with the
observations a tool would return, for use as demonstrations.

One module: the five families share the template machinery
(`_template_task`, `OPS`, `spaced_expression`), the hash splits and the
solution-graph format; apart, each would import the others' private
helpers.
"""

import hashlib
import operator
import random
import re

from swirl_jax import jsonl
from swirl_jax.tasks import records

Task = records.Task
# "demo": demonstrations for warm starts (swirl_jax/warmstart.py).
SPLIT_SEEDS = {"train": 0, "test": 1, "demo": 2}

# --------------------------------------------------------------- arithmetic.

_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo",
          "Ines", "Jonas", "Kira", "Liam", "Maya", "Noah", "Olga", "Pablo")
_ITEMS = ("marbles", "stickers", "apples", "cards", "shells", "stamps",
          "beads", "coins")
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul,
        "/": operator.truediv}

# Each step: (left, op, right, what it computes). Operands name a number of
# the problem, an earlier step (s1, s2, ...), or are literal integers.
_ARITH_TEMPLATES = (
    dict(text="{name} has {a} {item}. {name} buys {b} boxes with {c} {item} "
              "in each box. How many {item} does {name} have now?",
         vars=dict(a=(5, 60), b=(2, 9), c=(3, 12)),
         steps=(("b", "*", "c", "number of {item} in the boxes"),
                ("a", "+", "s1", "total number of {item}"))),
    dict(text="{name} reads {a} pages every day for {b} days. The book has "
              "{c} pages. How many pages are left to read?",
         vars=dict(a=(5, 30), b=(2, 10), c=(100, 400)),
         steps=(("a", "*", "b", "number of pages read"),
                ("c", "-", "s1", "number of pages left"))),
    dict(text="{name} has {a} {item} and gives away {b} of them. {name} "
              "splits the rest equally into {c} bags. How many {item} are in "
              "each bag?",
         vars=dict(a=(20, 120), b=(2, 40), c=(2, 9)),
         steps=(("a", "-", "b", "number of {item} left"),
                ("s1", "/", "c", "number of {item} in each bag"))),
    dict(text="{name} buys {a} notebooks at ${p} each and {b} pens at ${q} "
              "each. How much does {name} spend in total?",
         vars=dict(a=(2, 9), p=(2, 15), b=(2, 12), q=(1, 6)),
         steps=(("a", "*", "p", "cost of the notebooks"),
                ("b", "*", "q", "cost of the pens"),
                ("s1", "+", "s2", "total cost"))),
    dict(text="A farm has {a} cows and {b} chickens. Each cow has 4 legs and "
              "each chicken has 2 legs. How many legs are there on the farm?",
         vars=dict(a=(3, 40), b=(3, 60)),
         steps=(("a", "*", 4, "number of cow legs"),
                ("b", "*", 2, "number of chicken legs"),
                ("s1", "+", "s2", "total number of legs"))),
    dict(text="{name} earns ${a} per hour and works {b} hours a day for {c} "
              "days, then spends ${d}. How many dollars does {name} have "
              "left?",
         vars=dict(a=(8, 30), b=(2, 8), c=(2, 6), d=(10, 200)),
         steps=(("a", "*", "b", "daily earnings"),
                ("s1", "*", "c", "total earnings"),
                ("s2", "-", "d", "money left"))),
    dict(text="{name} buys {a} notebooks at ${p} each and {b} pens at ${q} "
              "each, and pays with a ${m} bill. How much change does {name} "
              "get?",
         vars=dict(a=(2, 6), p=(2, 9), b=(2, 8), q=(1, 5), m=(100, 100)),
         steps=(("a", "*", "p", "cost of the notebooks"),
                ("b", "*", "q", "cost of the pens"),
                ("s1", "+", "s2", "total cost"),
                ("m", "-", "s3", "change"))),
    dict(text="A bakery bakes {a} trays of {b} muffins. It sells {c} muffins "
              "in the morning and {d} in the afternoon, and packs the rest "
              "equally into {e} boxes. How many muffins go in each box?",
         vars=dict(a=(3, 12), b=(6, 24), c=(5, 40), d=(5, 40), e=(2, 8)),
         steps=(("a", "*", "b", "number of muffins baked"),
                ("c", "+", "d", "number of muffins sold"),
                ("s1", "-", "s2", "number of muffins left"),
                ("s3", "/", "e", "number of muffins per box"))),
)


def _solve(template, values):
  """The steps with numbers filled in, or None if a step is not a
  non-negative integer (the caller then draws new numbers)."""
  env, steps = dict(values), []
  for i, (left, op, right, what) in enumerate(template["steps"], 1):
    a, b = (env[x] if isinstance(x, str) else x for x in (left, right))
    value = OPS[op](a, b)
    if value < 0 or value != int(value):
      return None
    value = int(value)
    env[f"s{i}"] = value
    steps.append({"step": i, "operands": [left, right], "op": op,
                  "expression": f"{a}{op}{b}", "value": value,
                  "description": what})
  return steps


def _arith_task(rng, index, split, seed):
  t_idx = rng.randrange(len(_ARITH_TEMPLATES))
  return _template_task(_ARITH_TEMPLATES, t_idx, rng, "synthetic_arith",
                        index, split, seed)


def _template_task(templates, t_idx, rng, family, index, split, seed):
  """A task of `templates[t_idx]` with numbers drawn from `rng`."""
  template = templates[t_idx]
  name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
  while True:
    values = {k: rng.randint(lo, hi) for k, (lo, hi) in
              template["vars"].items()}
    steps = _solve(template, values)
    if steps is not None and steps[-1]["value"] > 0:
      break
  for s in steps:
    s["description"] = s["description"].format(item=item)
  question = template["text"].format(name=name, item=item, **values)
  return Task(id=f"{family}/{split}/{index}", question=question,
              answers=(str(steps[-1]["value"]),), source="synthetic_arith",
              split=split,
              metadata={"solution_graph": steps, "quantities": values,
                        "template": t_idx, "seed": seed})


def arithmetic_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
  """`n` arithmetic word problems; the same seed gives the same tasks."""
  rng = random.Random(f"arith/{seed}")
  return [_arith_task(rng, i, split, seed) for i in range(n)]


# ------------------------------------------------------------------ chains.

# Word problems whose numbers come in the order the steps use them, each
# step taking the last result and the next number: a small policy learns
# to copy them, so what is left to get wrong is the steps themselves.
_CHAIN_TEMPLATES = (
    dict(text="{name} has {a} boxes with {b} {item} in each box. {name} "
              "finds {c} more {item}. How many {item} does {name} have now?",
         vars=dict(a=(2, 9), b=(3, 12), c=(5, 40)),
         steps=(("a", "*", "b", "number of {item} in the boxes"),
                ("s1", "+", "c", "total number of {item}"))),
    dict(text="{name} buys {a} packs of {b} {item} and gives {c} of them "
              "away. How many {item} does {name} keep?",
         vars=dict(a=(2, 9), b=(4, 12), c=(2, 20)),
         steps=(("a", "*", "b", "number of {item} bought"),
                ("s1", "-", "c", "number of {item} kept"))),
    dict(text="{name} has {a} boxes with {b} {item} in each box, finds {c} "
              "more and gives {d} away. How many {item} does {name} have "
              "now?",
         vars=dict(a=(2, 9), b=(3, 12), c=(5, 40), d=(2, 30)),
         steps=(("a", "*", "b", "number of {item} in the boxes"),
                ("s1", "+", "c", "number of {item} after finding more"),
                ("s2", "-", "d", "number of {item} left"))),
    dict(text="{name} buys {a} packs of {b} {item}, loses {c} of them and "
              "shares the rest equally among {d} friends. How many {item} "
              "does each friend get?",
         vars=dict(a=(2, 9), b=(4, 12), c=(1, 20), d=(2, 6)),
         steps=(("a", "*", "b", "number of {item} bought"),
                ("s1", "-", "c", "number of {item} left"),
                ("s2", "/", "d", "number of {item} each friend gets"))),
    dict(text="{name} earns ${a} an hour for {b} hours, gets a ${c} tip and "
              "spends ${d}. How many dollars does {name} have left?",
         vars=dict(a=(5, 15), b=(2, 8), c=(5, 30), d=(5, 60)),
         steps=(("a", "*", "b", "money earned"),
                ("s1", "+", "c", "money with the tip"),
                ("s2", "-", "d", "money left"))),
)
_CHAIN_MAX = 200  # Every number below it: one token each when learnt.
_CHAIN_SPLITS = ("train", "test", "demo")


def chain_tasks(n: int, split: str = "train") -> list[Task]:
  """`n` distinct chained word problems of `split` (the split is the
  seed; a problem's split is fixed by a hash of its text, as for
  `compute_tasks`)."""
  if split not in _CHAIN_SPLITS:
    raise ValueError(f"split {split!r}; valid: {', '.join(_CHAIN_SPLITS)}")
  rng, tasks, seen = random.Random(f"chain/{split}"), [], set()
  while len(tasks) < n:
    t_idx = rng.randrange(len(_CHAIN_TEMPLATES))
    task = _template_task(_CHAIN_TEMPLATES, t_idx, rng, "synthetic_chain",
                          len(tasks), split, split)
    numbers = [*task.metadata["quantities"].values(),
               *(s["value"] for s in task.metadata["solution_graph"])]
    if (task.question in seen or compute_split(task.question) != split
        or not all(0 < v < _CHAIN_MAX for v in numbers)):
      continue
    seen.add(task.question)
    tasks.append(task)
  return tasks


# ------------------------------------------------------------- computations.

# (question, expression, description, ranges of a, b, c).
_COMPUTE_TEMPLATES = (
    ("What is the remainder of {a} * {b} divided by {c}?", "{a}*{b}%{c}",
     "remainder"),
    ("What are the last two digits of {a} * {b}?", "{a}*{b}%100",
     "number"),
    ("What is {a} * {b} divided by {c}, rounded down?", "{a}*{b}//{c}",
     "quotient"),
)
# Every number has two digits, the answer too: a vocabulary learnt on the
# problems keeps each one whole, so running the code and reading its
# result back need only copies of single tokens, while computing the
# answer without the code is out of a small model's reach.
_COMPUTE_RANGE = (12, 99)
# A problem belongs to one split by a hash of its text: the held-out split
# shares no question with the training or demonstration splits, whatever
# their sizes.
_COMPUTE_SPLITS = ("train", "test", "demo")


def compute_split(question: str) -> str:
  """The only split `question` may appear in."""
  h = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16)
  return _COMPUTE_SPLITS[h % len(_COMPUTE_SPLITS)]


def compute_tasks(n: int, split: str = "train") -> list[Task]:
  """`n` distinct computations of `split`; the same split gives the same
  tasks (the split is the seed)."""
  if split not in _COMPUTE_SPLITS:
    raise ValueError(f"split {split!r}; valid: {', '.join(_COMPUTE_SPLITS)}")
  rng, tasks, seen = random.Random(f"compute/{split}"), [], set()
  while len(tasks) < n:
    t_idx = rng.randrange(len(_COMPUTE_TEMPLATES))
    text, expr, what = _COMPUTE_TEMPLATES[t_idx]
    values = {k: rng.randint(*_COMPUTE_RANGE) for k in "abc"
              if "{" + k + "}" in text}
    question = text.format(**values)
    if len(set(values.values())) < len(values):
      continue  # "... of 88 * 39 divided by 88" would answer 0.
    if question in seen or compute_split(question) != split:
      continue
    seen.add(question)
    expression = expr.format(**values)
    value = eval(expression, {"__builtins__": {}})  # pylint: disable=eval-used
    if not 2 <= value < 100 or value in values.values():
      continue  # Copying a number of the question never answers it.
    tasks.append(Task(
        id=f"synthetic_compute/{split}/{len(tasks)}", question=question,
        answers=(str(value),), source="synthetic_arith", split=split,
        metadata={"solution_graph": [
            {"step": 1, "operands": sorted(values), "op": expression,
             "expression": expression, "value": value,
             "description": what}],
            "quantities": values, "template": t_idx, "family": "compute"}))
  return tasks


# ---------------------------------------------------------------- multi-hop.

_SYLLABLES = ("ka", "lo", "mir", "ven", "ta", "zor", "qui", "bel", "dra",
              "nu", "sel", "rin", "vo", "tam", "ex", "ol", "pra", "sun", "gai",
              "fen", "ru", "cal", "mo", "thi")
_COMPANY_SUFFIXES = ("Dynamics", "Industries", "Labs", "Works", "Systems",
                     "Holdings")
_PRODUCT_KINDS = ("tablet", "bicycle", "synthesizer", "drone", "camera",
                  "kettle", "telescope", "scooter")
_INDUSTRIES = ("technology", "manufacturing", "electronics", "design",
               "engineering")
_JOBS = ("engineer", "inventor", "designer", "chemist", "entrepreneur")


def _word(rng, parts):
  return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


class _Namer:
  """Invented names, never repeated within a world."""

  def __init__(self, rng):
    self.rng, self.used = rng, set()

  def __call__(self, make):
    while True:
      name = make(self.rng)
      if name not in self.used:
        self.used.add(name)
        return name


def _make_world(seed, num_companies):
  rng = random.Random(f"world/{seed}")
  new = _Namer(rng)
  countries = [new(lambda r: _word(r, 3) + "ia") for _ in range(6)]
  cities = [{"name": new(lambda r: _word(r, 2) + " " + _word(r, 1)),
             "country": rng.choice(countries),
             "population": rng.randrange(20, 900) * 1000}
            for _ in range(max(8, num_companies))]
  people = [{"name": new(lambda r: _word(r, 2) + " " + _word(r, 2)),
             "job": rng.choice(_JOBS), "born": rng.randint(1930, 1990),
             "city": rng.choice(cities)["name"]}
            for _ in range(num_companies * 3 // 2)]
  companies, products = [], []
  for i in range(num_companies):
    company = {"name": new(lambda r: _word(r, 2) + " "
                           + r.choice(_COMPANY_SUFFIXES)),
               "industry": rng.choice(_INDUSTRIES),
               "founded": rng.randint(1950, 2015),
               "founder": people[i]["name"],
               "city": rng.choice(cities)["name"]}
    companies.append(company)
    for _ in range(2):
      kind = rng.choice(_PRODUCT_KINDS)
      products.append({"name": new(lambda r, k=kind: _word(r, 2) + " " + k),
                       "kind": kind, "maker": company["name"],
                       "year": rng.randint(company["founded"], 2023)})
  return {"cities": cities, "people": people, "companies": companies,
          "products": products}


def _a(word):
  return ("an " if word[0] in "aeiou" else "a ") + word


def _paragraphs(world):
  """Title -> text for every entity of the world."""
  out = {}
  for p in world["products"]:
    out[p["name"]] = (f"The {p['name']} is {_a(p['kind'])} made by "
                      f"{p['maker']}. It was first released in {p['year']}.")
  for c in world["companies"]:
    out[c["name"]] = (f"{c['name']} is {_a(c['industry'])} company founded in "
                      f"{c['founded']} by {c['founder']}. Its headquarters "
                      f"are in {c['city']}.")
  for p in world["people"]:
    out[p["name"]] = (f"{p['name']} is {_a(p['job'])} born in {p['born']} "
                      f"in {p['city']}.")
  for c in world["cities"]:
    out[c["name"]] = (f"{c['name']} is a city in {c['country']}, with about "
                      f"{c['population']:,} inhabitants.")
  return out


def multihop_corpus(seed: int = 0, num_companies: int = 50) -> list[dict]:
  """The world's paragraphs as `{title, text}` rows (search corpus)."""
  return [{"title": t, "text": x} for t, x in
          _paragraphs(_make_world(seed, num_companies)).items()]


def write_corpus_jsonl(corpus, path) -> None:
  """Writes `{title, text}` rows as JSONL (read by search.load_corpus)."""
  jsonl.write(path, ({"title": row["title"], "text": row["text"]}
                     for row in corpus))


_QUESTIONS = {
    "founder": "Who founded the company that makes the {product}?",
    "headquarters": "In which city is the company that makes the {product} "
                    "headquartered?",
    "founder_birthplace": "In which city was the founder of the company that "
                          "makes the {product} born?",
    "headquarters_country": "In which country are the headquarters of the "
                            "company that makes the {product}?",
}


def _hops(kind, product, world, paragraphs):
  company = next(c for c in world["companies"]
                 if c["name"] == product["maker"])
  hop = lambda entity, relation, answer: {
      "query": entity, "entity": entity, "relation": relation,
      "answer": answer, "title": entity, "paragraph": paragraphs[entity]}
  hops = [hop(product["name"], "made by", company["name"])]
  if kind in ("founder", "founder_birthplace"):
    hops.append(hop(company["name"], "founded by", company["founder"]))
    if kind == "founder_birthplace":
      person = next(p for p in world["people"]
                    if p["name"] == company["founder"])
      hops.append(hop(person["name"], "born in", person["city"]))
  else:
    hops.append(hop(company["name"], "headquartered in", company["city"]))
    if kind == "headquarters_country":
      city = next(c for c in world["cities"] if c["name"] == company["city"])
      hops.append(hop(city["name"], "in country", city["country"]))
  return hops


def multihop_tasks(n: int, seed: int = 0, split: str = "train",
                   num_companies: int = 50) -> list[Task]:
  """`n` distinct multi-hop questions over the world `multihop_corpus(seed,
  num_companies)` describes; the same seed gives the same tasks."""
  world = _make_world(seed, num_companies)
  paragraphs = _paragraphs(world)
  pool = [(kind, i) for i in range(len(world["products"]))
          for kind in _QUESTIONS]
  if n > len(pool):
    raise ValueError(f"only {len(pool)} distinct questions with "
                     f"num_companies={num_companies}; asked for {n}")
  rng = random.Random(f"multihop/{seed}")
  tasks = []
  for index, (kind, i) in enumerate(rng.sample(pool, n)):
    product = world["products"][i]
    hops = _hops(kind, product, world, paragraphs)
    tasks.append(Task(
        id=f"synthetic_multihop/{split}/{index}",
        question=_QUESTIONS[kind].format(product=product["name"]),
        answers=(hops[-1]["answer"],), source="synthetic_multihop",
        split=split,
        metadata={"solution_graph": hops, "kind": kind, "seed": seed,
                  "num_companies": num_companies}))
  return tasks


# ----------------------------------------------------------------- look-ups.

COLOURS = ("red", "blue", "green", "yellow", "black", "white", "orange",
           "purple", "pink", "brown", "grey", "gold", "silver", "violet",
           "cyan", "teal")


def _lookup_world(seed: int, num_boxes: int, num_colours: int):
  """Box number -> colour; boxes are numbered from 10 (two digits or more,
  so the search tool indexes the number as a word)."""
  if not 0 < num_colours <= len(COLOURS):
    raise ValueError(f"num_colours must be in 1..{len(COLOURS)}")
  rng = random.Random(f"lookup/{seed}")
  return {10 + i: rng.choice(COLOURS[:num_colours]) for i in range(num_boxes)}


def lookup_corpus(seed: int = 0, num_boxes: int = 90,
                  num_colours: int = 16) -> list[dict]:
  """One `{title, text}` paragraph per box: "Box 37 is red."."""
  return [{"title": f"Box {b}", "text": f"Box {b} is {c}."}
          for b, c in _lookup_world(seed, num_boxes, num_colours).items()]


def lookup_tasks(boxes, seed: int = 0, split: str = "train",
                 num_boxes: int = 90, num_colours: int = 16) -> list[Task]:
  """"Which colour is box B?" for each B of `boxes` (numbers in
  10 .. 10 + num_boxes - 1), over the world `lookup_corpus(seed, ...)`."""
  world = _lookup_world(seed, num_boxes, num_colours)
  tasks = []
  for index, b in enumerate(boxes):
    if b not in world:
      raise ValueError(f"box {b} is not in 10..{9 + num_boxes}")
    entity = f"box {b}"
    hop = {"query": entity, "entity": entity, "relation": "has colour",
           "answer": world[b], "title": f"Box {b}",
           "paragraph": f"Box {b} is {world[b]}."}
    tasks.append(Task(
        id=f"synthetic_lookup/{split}/{index}",
        question=f"Which colour is box {b}?", answers=(world[b],),
        source="synthetic_multihop", split=split,
        metadata={"solution_graph": [hop], "kind": "lookup", "seed": seed,
                  "num_boxes": num_boxes, "num_colours": num_colours}))
  return tasks


# ------------------------------------------------------ reference solutions.

_NEEDS = {"made by": "which company makes the {}",
          "founded by": "who founded {}", "born in": "where {} was born",
          "headquartered in": "where {} is headquartered",
          "in country": "which country {} is in",
          "has colour": "which colour {} is"}


def spaced_expression(expression: str) -> str:
  """`expression` with a space on each side of every operator."""
  return " ".join(re.sub(r"(//|[*/+%-])", r" \1 ", expression).split())


def reference_turns(task: Task, observe=None, spaced: bool = False,
                    fmt: str = "swirl") -> list[dict]:
  """The gold trajectory of a synthetic task, in format `fmt`.

  Returns one dict per model turn: `action` (reasoning and one call) and
  `observation` (what the tool returns; None after the answer). By default
  observations are what the tool returns for the step (the calculator, the
  gold paragraph alone in the search tool's format, or the sandbox's
  `Code execution result:`); pass `observe(tool, argument) -> str` to use
  live tools instead.

  `fmt='swirl'`: `<math_exp>` / `<search_query>` steps, then `<answer>`.
  `fmt='simpletir'` (arithmetic only): each step prints its expression in
  a ```python block (integer division, so values stay whole), then
  `\\boxed{answer}`.
  `spaced` writes `<math_exp> 6 * 7 </math_exp>`, `print( 6 * 7 )` and
  `<answer> 42 </answer>`: every number then follows a space, as in the
  question, so a tokenizer without a digit split gives it the same token
  everywhere.
  """
  if fmt == "simpletir":
    return _simpletir_turns(task, observe, spaced)
  if fmt != "swirl":
    raise ValueError(f"unknown format {fmt!r}; valid: swirl, simpletir")
  pad = " " if spaced else ""
  graph = task.metadata["solution_graph"]
  turns = []
  if task.source == "synthetic_arith":
    for s in graph:
      expr = spaced_expression(s["expression"]) if spaced else s["expression"]
      action = (f"Next I need the {s['description']}.\n"
                f"<math_exp>{pad}{expr}{pad}</math_exp>")
      obs = (observe("calculator", s["expression"]) if observe else
             f"{s['expression']} -> {s['value']}")
      turns.append({"action": action, "observation": obs})
    final = f"The {graph[-1]['description']} is {task.answer}."
  elif task.source == "synthetic_multihop":
    for h in graph:
      need = _NEEDS[h["relation"]].format(h["entity"])
      action = (f"I need to find out {need}.\n"
                f"<search_query>{h['query']}</search_query>")
      obs = (observe("search", h["query"]) if observe else
             f"{h['query']} -> [1] {h['title']}: {h['paragraph']}")
      turns.append({"action": action, "observation": obs})
    final = f"So the answer is {task.answer}."
  else:
    raise ValueError(f"no reference trajectory for source {task.source!r}")
  turns.append({"action": f"{final}\n<answer>{pad}{task.answer}{pad}</answer>",
                "observation": None})
  return turns


def _simpletir_turns(task: Task, observe, spaced: bool) -> list[dict]:
  if task.source != "synthetic_arith":
    raise ValueError(f"no SimpleTIR reference trajectory for source "
                     f"{task.source!r} (arithmetic only)")
  pad = " " if spaced else ""
  graph, turns = task.metadata["solution_graph"], []
  for s in graph:
    expr = spaced_expression(s["expression"]) if spaced else s["expression"]
    code = f"print({pad}{re.sub(r'(?<!/)/(?!/)', '//', expr)}{pad})"
    action = f"Next I need the {s['description']}.\n```python\n{code}\n```"
    obs = (observe("python", code + "\n") if observe else
           f"\nCode execution result: {s['value']}\n\n")
    turns.append({"action": action, "observation": obs})
  final = f"The {graph[-1]['description']} is {task.answer}."
  turns.append({"action": f"{final}\n\\boxed{{{pad}{task.answer}{pad}}}",
                "observation": None})
  return turns


def reference_trajectory(task: Task, observe=None) -> str:
  """`reference_turns` as one text: action, observation, action, ..."""
  parts = []
  for turn in reference_turns(task, observe):
    parts.append(turn["action"])
    if turn["observation"] is not None:
      parts.append(turn["observation"])
  return "\n".join(parts)
