"""How the tail fit counts the rest of a census design against the rest's true counts.

Issue #38. The pooled estimator counts the census exactly and the rest (N - C items) by the
tail machinery on the rest's hash sample. For the positives that mAP@k sees (exact rank within
k, at least one outranker), this prints the rest's estimated outranker count ((N - C) x each
positive's hardness) against its true count (brute force over the rest), beside the same for
the uniform sample at the budget over all N and for a uniform sample at the rest's own rate:
summed over positives (est / true) and the median per-positive log((est + 0.5) / (true + 0.5)).
The third design separates the smaller sample from the census's taking each query's top items
out of the rest. Query sets, census and flags as benchmarks/census.py (share 0.5, fill).

  python benchmarks/census_rest.py --cache=/work/cache/text --target=test-minilm-names \
      --proxy=test-e5-names --budgets=0.01 --max_sets=6 --seeds=2
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import census as bench  # noqa: E402

from tailaware.core import design, sampling  # noqa: E402
from tailaware.io import scores as scores_lib  # noqa: E402
from tailaware.protocol import census, prediction  # noqa: E402
from tailaware.search import exact  # noqa: E402
from tailaware.tail.settings import TailSettings  # noqa: E402


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="test-minilm-names")
    p.add_argument("--proxy", default="test-e5-names")
    bench.add_arguments(p)  # --budgets (the first is used), --seeds, --max_sets, --census_share
    return p.parse_args()


def ratios(est: np.ndarray, true: np.ndarray) -> tuple[float, float, float]:
    """(estimated sum, true sum, median per-positive log ratio) of outranker counts."""
    return float(est.sum()), float(true.sum()), float(np.median(np.log((est + 0.5) / (true + 0.5))))


def outrankers(s: np.ndarray, pos: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """[Q, P] how many of the items `cols` score above each positive (0 at padding)."""
    x = np.sort(s[:, cols], axis=1)[:, ::-1]
    return np.where(np.isnan(pos), 0, scores_lib.count_above(x, pos))


def main() -> None:
    args = _parse()
    root = os.path.join(args.cache, "benchmarks")
    tgt = bench.load(os.path.join(root, args.target, "features"))
    prx = bench.load(os.path.join(root, args.proxy, "features"))
    n, k, m = tgt.d.shape[0], args.k, TailSettings().top_m
    budget = float(args.budgets.split(",")[0])
    st = bench.settings(k, 0)
    order = np.argsort(sampling.hash_uniform(tgt.qids, 38))
    got: dict[str, list] = {"uniform": [], "uniform at the rest's rate": [], "census rest": []}
    for i in range(args.max_sets):
        rows = np.sort(order[i * args.set_size : (i + 1) * args.set_size])
        s = tgt.q[rows] @ tgt.d.T
        pos, fixed = exact.positive_scores(
            tgt.q[rows] @ tgt.p.T, tgt.slots[rows], tgt.relevant[rows]
        )
        k_all = outrankers(s, pos, np.ones(n, bool))
        near = ~np.isnan(pos) & (k_all < k) & (k_all > 0)
        top = bench.top_lists(prx, rows, args.depth)
        plan = design.plan(
            design.best_ranks([top], n), budget, census_share=args.census_share,
            queries=bench.queries(args, rows), max_depth=args.depth,
            priority=design.fused([top], n),
        )  # fmt: skip
        k_rest = outrankers(s, pos, ~plan.census)
        for seed in range(args.seeds):
            for name, rate in (
                ("uniform", budget),
                ("uniform at the rest's rate", plan.inclusion),
            ):
                h = prediction.estimate(
                    bench.file_of(s, pos, fixed, sampling.in_sample(tgt.dids, rate, seed), m), st
                )
                got[name].append(ratios((n * h.x)[near], k_all[near]))
            sc = bench.census_file(s, pos, fixed, tgt.dids, plan, seed, m)
            h = prediction.estimate(census.fold(sc, n), st)
            got["census rest"].append(ratios(((n - plan.n_census) * h.x)[near], k_rest[near]))
            print(f"set {i} seed {seed}: " + ", ".join(
                f"{name} {v[-1][0]:.0f}/{v[-1][1]:.0f}" for name, v in got.items()
            ), flush=True)  # fmt: skip
    for name, v in got.items():
        a = np.asarray(v)
        print(f"{name:<28} est / true {a[:, 0].sum() / a[:, 1].sum():.3f}, "
              f"median log ratio {np.median(a[:, 2]):+.3f} ({len(a)} draws)")  # fmt: skip


if __name__ == "__main__":
    main()
