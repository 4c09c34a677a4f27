"""Reads of a benchmark's bias from its own sample, held against the bias ten draws measure.

docs/validation.md, "One sample for every query (issue #41)": what is left of the whole sets'
misses is a bias of the benchmark. Five reads, printed per benchmark and fraction:

- `drift`: the budget check's halvings S/8 .. S extrapolated to N, -mean(move) x log2(N / S),
  from `benchmarks/sampling_spread.py` records (`--records`), beside the draws' mean error;
- `half`: fit the default estimator on one half of the sample (one coin per distractor,
  `budget.thin`), count the other half's distractors above the positives the first half does
  not see (count 0), and print observed / expected (two halvings per draw);
- `where`: the draws' predictions (`prediction.json`, k = 100) against the exact counts' AP at
  the same k, per query: the mean error over the draws and the part carried by the queries
  whose best positive no sampled distractor outranks, by how far it clears the sampled tail
  (in units of the spread of the tail's top 50 scores);
- `counts`: the draws' mean error beside the summary's tail-vs-counts check (observed /
  expected sampled counts of the positives the tail prices, `diagnostics.tail_counts`): whether
  the fitted tails' misfit at the sample's own scale tells the bias's sign;
- `pair`: the mean per-query difference between two draws' predictions against the sd of
  those differences over sqrt(queries) (what independent queries would give).

  python benchmarks/bias_reads.py drift --records=workdir/spread_dev.jsonl
  python benchmarks/bias_reads.py half --benchmarks=dev-e5-keywords --draws=2
  python benchmarks/bias_reads.py where --benchmarks=dev-e5-keywords --draws=6
  python benchmarks/bias_reads.py counts --benchmarks=dev-e5-keywords --draws=6
  python benchmarks/bias_reads.py pair --benchmarks=dev-e5-keywords
"""

import argparse
import collections
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.io import scores as scores_lib  # noqa: E402
from tailaware.protocol import budget, prediction  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.tail import estimators  # noqa: E402

GAPS = (0.0, 0.5, 1.0, 2.0, 4.0, np.inf)
BINS = tuple(zip(GAPS[:-1], GAPS[1:], strict=True))


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("read", choices=("drift", "half", "where", "counts", "pair"))
    p.add_argument("--cache", default="/work/cache/text")
    p.add_argument("--benchmarks", default="dev-e5-keywords")
    p.add_argument("--fractions", default="0.01,0.05")
    p.add_argument("--draws", type=int, default=2)
    p.add_argument("--records", default="", help="sampling_spread.py records (drift)")
    return p.parse_args()


def drift(records: list[dict]) -> None:
    cells = collections.defaultdict(list)
    for r in records:
        cells[(r["benchmark"], r["fraction"])].append(r)
    for (bench, frac), rs in sorted(cells.items()):
        moves = [np.diff(r["budget_predictions"]).mean() for r in rs]
        read = -np.mean(moves) * np.log2(1.0 / float(frac))
        bias = np.mean([r["map"] - r["truth"] for r in rs])
        print(f"{bench:<22}{frac:>6} draws {len(rs):>2} bias {bias:+.4f} drift read {read:+.4f}")


def half(bench: dict, frac: str, entry: dict) -> None:
    sc = scores_lib.load_scores(entry["scores"])
    settings = PredictSettings(k=100)
    observed = expected = 0.0
    for rep in range(2):
        a = budget.thin(sc, 0.5, np.random.default_rng(rep))
        x = estimators.estimate(a, settings.estimator, settings.tail).x
        blind = sc.mask & (a.pos_counts == 0)
        observed += (sc.pos_counts - a.pos_counts)[blind].sum()
        expected += ((sc.n_sample - a.n_sample) * x[blind]).sum()
    print(
        f"{bench['name']:<22}{frac:>6} draw {entry['draw']} observed / expected "
        f"{observed / expected:.2f} ({observed:.0f} counted)"
    )


def _prediction(entry: dict) -> dict:
    """Returns a draw's prediction.json (the ILIAS job's, beside its sampled scores)."""
    with open(os.path.join(os.path.dirname(entry["scores"]), "prediction.json")) as f:
        return json.load(f)


def _per_query(entry: dict) -> tuple[np.ndarray, int]:
    """Returns a draw's predicted per-query AP and its k."""
    p = _prediction(entry)
    return np.asarray(p["per_query_ap"], np.float64), int(p["k"])


def where(bench: dict, frac: str, entries: list[dict]) -> None:
    """Prints the draws' mean error and the part of it each group of queries carries: those
    some sampled distractor outranks, and those none does by their gap; each draw's groups are
    its own (a query's gap moves with the sample)."""
    truth: dict[int, np.ndarray] = {}  # the exact per-query AP at each k the draws predict
    whole = scores_lib.load_scores(bench["truth"])
    above = np.where(whole.mask, whole.pos_counts, np.iinfo(np.int64).max).min(axis=1)
    deep = []  # the whole gallery's count above each blind query's best positive
    parts = np.zeros((len(entries), len(GAPS)))  # [draws, seen + gap bins]
    sizes = np.zeros_like(parts)
    for i, entry in enumerate(entries):
        predicted, k = _per_query(entry)
        if k not in truth:  # the truth at the prediction's k, from the exact counts
            exact = prediction.exact(whole, k, 1)
            truth[k] = exact.metrics[f"map@{k}"].per_query
        err = predicted - truth[k]
        sc = scores_lib.load_scores(entry["scores"])
        best = np.where(sc.mask, sc.pos_scores, -np.inf).max(axis=1)
        blind = np.where(sc.mask, sc.pos_counts, np.iinfo(np.int64).max).min(axis=1) == 0
        tail = sc.tail_scores
        gap = (best - tail[:, 0]) / np.maximum(tail[:, 0] - tail[:, 49], 1e-6)
        deep.append(above[blind])
        groups = [~blind] + [blind & (gap >= lo) & (gap < hi) for lo, hi in BINS]
        for g, m in enumerate(groups):
            parts[i, g], sizes[i, g] = err[m].sum() / err.size, m.sum()
    mean, n = parts.mean(axis=0), sizes.mean(axis=0)
    print(
        f"{bench['name']:<22}{frac:>6} draws {len(entries)}: error {parts.sum(axis=1).mean():+.4f}"
        f" (sd over draws {parts.sum(axis=1).std(ddof=1) if len(entries) > 1 else 0.0:.4f}); "
        f"outranked by a sampled distractor: {n[0]:.0f} queries, {mean[0]:+.4f}; by none (the "
        f"gallery's count above the best positive: median {np.median(np.concatenate(deep)):.0f}),"
        " by gap / spread of the top 50:"
    )
    for (lo, hi), part, size in zip(BINS, mean[1:], n[1:], strict=True):
        print(f"    [{lo}, {hi}): {size:>6.1f} queries, {part:+.4f}")


def counts(bench: dict, frac: str, entries: list[dict]) -> None:
    """Prints the draws' mean error and mean tail-vs-counts ratio (and its z)."""
    errors, ratios, zs = [], [], []
    for entry in entries:
        p = _prediction(entry)
        tc = p["diagnostics"]["tail_counts"]
        errors.append(p["map"] - bench[f"exact_map{p['k']}"])
        ratios.append(tc["observed"] / tc["expected"])
        zs.append((tc["observed"] - tc["expected"]) / tc["sd"])
    print(
        f"{bench['name']:<22}{frac:>6} draws {len(entries)}: error {np.mean(errors):+.4f}, "
        f"observed / expected {np.mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}), "
        f"z {np.mean(zs):+.1f}"
    )


def pair(bench: dict, frac: str, entries: list[dict]) -> None:
    a, b = (_per_query(e)[0] for e in entries[:2])
    d = a - b
    print(
        f"{bench['name']:<22}{frac:>6} draws 0-1: mean difference {d.mean():+.4f}, "
        f"independent queries would give sd {d.std() / np.sqrt(d.size):.4f}"
    )


def main():
    args = _parse()
    if args.read == "drift":
        with open(args.records) as f:
            drift([json.loads(line) for line in f if line.strip()])
        return
    with open(os.path.join(args.cache, "manifest.json")) as f:
        manifest = {b["name"]: b for b in json.load(f)["benchmarks"]}
    for name in args.benchmarks.split(","):
        bench = manifest[name]
        for frac in args.fractions.split(","):
            entries = bench["sampled"][frac][: args.draws]
            if args.read in ("pair", "where", "counts"):
                {"pair": pair, "where": where, "counts": counts}[args.read](bench, frac, entries)
                continue
            for entry in entries:
                half(bench, frac, entry)


if __name__ == "__main__":
    main()
