"""How far one draw of the uniform random baseline can fall from chance on the validated benchmark.

    .venv/bin/python benchmarks/random_draws.py [--benchmark data/benchmark/validated.jsonl] [--seeds 200]

The infer stage's Random run is one draw: `spatialvqa.models.RandomAdapter` with seed 0 (a letter per question from a
hash of the seed and the qid). This script runs the same adapter with seeds 0 ... N-1 over the multiple-choice
questions, in-process and without prediction files (seconds), and prints the MCA AVG (mean of the task accuracies, as
in Table 2) of seed 0, the mean and standard deviation over the seeds, and the share of seeds that do at least as
well as seed 0; plus the letters of the key. Table 2 itself reports Random (and the other seeded baselines) as the
mean of `draws.n` runs through the whole infer and score path: the `draws` stage (`spatialvqa.results.seed_draws`).
"""
from __future__ import annotations

import argparse
import collections
import statistics

from spatialvqa.core import read_records
from spatialvqa.models import ModelInput, RandomAdapter
from spatialvqa.parse import parse_answer


def mca_avg(records, seed: int) -> float:
    ad = RandomAdapter(seed=seed)
    by = collections.defaultdict(list)
    for r in records:
        reply = ad.answer(ModelInput(record=r, prompt=""))
        by[r["task"]].append(parse_answer(r, reply).value == r["answer"])
    return 100 * statistics.mean(statistics.mean(v) for v in by.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--benchmark", default="data/benchmark/validated.jsonl")
    p.add_argument("--seeds", type=int, default=200)
    a = p.parse_args(argv)
    mc = [r for r in read_records(a.benchmark) if r["format"] == "mc"]
    draws = [mca_avg(mc, s) for s in range(a.seeds)]
    sd = statistics.pstdev(draws)
    print(f"{len(mc)} multiple-choice questions; key letters {dict(sorted(collections.Counter(r['answer'] for r in mc).items()))}")
    print(f"Random MCA AVG: seed 0 {draws[0]:.1f}; over {a.seeds} seeds mean {statistics.mean(draws):.1f}, sd {sd:.1f}, "
          f"range {min(draws):.1f}-{max(draws):.1f}; seeds at least as high as seed 0: {sum(d >= draws[0] for d in draws) / a.seeds:.1%}")


if __name__ == "__main__":
    main()
