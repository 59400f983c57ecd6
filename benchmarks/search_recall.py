r"""BM25 recall@k of gold paragraphs on HotPotQA dev (distractor, 500).

Each question is the query as is; a gold paragraph is one named in the
question's supporting facts (matched by title). The corpus is a named one
(`--corpus`): 'hotpotqa:dev', the unique paragraphs of the 500 questions'
own contexts (a closed book that holds every gold paragraph, the CPU
runs'), or 'hotpotqa:wiki', the 5.2M HotPotQA Wikipedia abstracts the
paper configs search (fetched and indexed by the data job:
`--config=configs/data.py:datasets=hotpotqa,hotpotqa_wiki`). Prints a
summary, then one JSON line.

  python benchmarks/search_recall.py [--data_dir=DIR] [--k=5] \
      [--corpus=hotpotqa:wiki]
"""

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from swirl_jax import paths  # pylint: disable=g-import-not-at-top
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry
from swirl_jax.tools import search


def recall_at_k(tool, tasks, k):
  """(mean share of gold paragraphs found, share of questions with all)."""
  hits = tool.retrieve([t.question for t in tasks], k)
  found_share, all_found = [], []
  for task, ids in zip(tasks, hits):
    gold = {title for title, _ in task.metadata["supporting_facts"]}
    got = {tool.passages[i].title for i in ids}
    found_share.append(len(gold & got) / len(gold))
    all_found.append(gold <= got)
  n = len(tasks)
  return sum(found_share) / n, sum(all_found) / n


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_dir", default=None,
                      help="data directory (default: the project's)")
  parser.add_argument("--k", type=int, default=5)
  parser.add_argument("--corpus", default="hotpotqa:dev",
                      help="named corpus: hotpotqa:dev or hotpotqa:wiki")
  parser.add_argument("--cache_dir", default=None,
                      help="BM25 index cache (default: the corpus's own "
                           "index, if the data job built one; else none)")
  args = parser.parse_args()
  data_dir = args.data_dir or paths.default_data_dir()

  start = time.time()
  tasks = datasets.load_tasks("hotpotqa", "dev", data_dir=data_dir)
  passages = registry.corpus(args.corpus, data_dir)
  tool = search.SearchTool(
      passages, k=args.k,
      cache_dir=args.cache_dir or registry.index_dir(args.corpus, data_dir))
  built = time.time() - start
  recall, both = recall_at_k(tool, tasks, args.k)
  total = time.time() - start

  print(f"HotPotQA dev: {len(tasks)} questions; corpus {args.corpus}: "
        f"{len(passages)} paragraphs")
  print(f"index + load: {built:.1f} s, total {total:.1f} s")
  print(f"recall@{args.k} of gold paragraphs: {recall:.3f}")
  print(f"questions with both gold paragraphs in the top {args.k}: "
        f"{both:.3f}")
  print(json.dumps({"benchmark": "search_recall", "corpus": args.corpus,
                    "k": args.k,
                    f"recall_at_{args.k}": round(recall, 4),
                    f"both_gold_at_{args.k}": round(both, 4),
                    "n_questions": len(tasks), "n_paragraphs": len(passages),
                    "seconds": round(total, 2)}))


if __name__ == "__main__":
  main()
