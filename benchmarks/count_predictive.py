"""Where recall@k's error on dev comes from, and a probe of an empirical-Bayes count predictive.

For each dev draw of the named cells (`validation.SPLITS["dev"]`, k = 100), the default's error
in mAP@k, recall@k and nDCG@k against their realized truth, three ways:

- `default`: `evt_averaged` as it predicts;
- `counts at truth` / `tail at truth`: the counted (resp. tail-priced) positives' hardness set
  to the full gallery's realized K / N, the other positives as predicted;
- `eb counts` (with `--eb`): each counted positive's K / S replaced by its posterior under a
  hardness prior fitted to all the draw's positives' counts (NPMLE on a log grid, by EM), read
  at each query's atom weights (the atom of cumulative weight w takes the posterior's
  w-quantile).

Prints one line per draw. Command (the dev manifest of `benchmarks/text_galleries.py`):
  python benchmarks/count_predictive.py --manifest=CACHE/manifest.json --eb \
      --cells=text/dev-minilm-keywords,text/dev-lsa-names
"""

import argparse
import os
import sys

import numpy as np
from scipy import stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import evaluate, metrics  # noqa: E402
from tailaware.protocol import validation  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.tail import estimators  # noqa: E402

METRIC_LIST = tuple(metrics.METRICS[m] for m in ("map", "recall", "ndcg"))


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--cells", required=True, help="comma-separated dev cell names")
    p.add_argument("--draws", type=int, default=3)
    p.add_argument("--eb", action="store_true", help="also the empirical-Bayes predictive")
    return p.parse_args()


def npmle(counts, s, grid, iters=300):
    """Returns the prior g on `grid` maximising the likelihood of counts ~ Poisson(s x) (EM)."""
    lik = np.exp(stats.poisson.logpmf(counts[:, None], s * grid[None, :]))
    g = np.full(grid.size, 1.0 / grid.size)
    for _ in range(iters):
        post = lik * g
        g = (post / post.sum(axis=1, keepdims=True)).mean(axis=0)
    return g


def eb_atoms(scores, h, counted):
    """Returns h.atoms with every counted positive's atoms read from its posterior."""
    s = float(scores.n_sample)
    c = scores.pos_counts[scores.mask].astype(float)
    grid = np.geomspace(1e-3 / s, min(1.0, 3.0 * (c.max() + 10) / s), 600)
    g = npmle(c, s, grid)
    qs, ps = np.nonzero(counted)
    post = g * np.exp(stats.poisson.logpmf(scores.pos_counts[qs, ps][:, None], s * grid))
    cdf = np.cumsum(post, axis=1) / post.sum(axis=1, keepdims=True)  # [n, grid]
    order = np.argsort(-h.weights, axis=1)  # each query's atoms, heaviest first
    w = np.take_along_axis(h.weights, order, axis=1)[qs]  # [n, A]
    mid = np.cumsum(w, axis=1) - w / 2  # each atom's mid cumulative weight
    at = np.minimum((cdf[:, None, :] < mid[:, :, None]).sum(axis=-1), grid.size - 1)
    atoms = h.atoms.copy()
    atoms[qs[:, None], ps[:, None], order[qs]] = grid[at]
    return atoms


def errors(scores, atoms, weights, n, truth):
    values, _ = evaluate.predicted_values(
        [evaluate.Variant(atoms, weights[None])],
        scores.mask,
        [float(n)],
        100,
        scores.fixed_counts,
        scores,
        metric_list=METRIC_LIST,
    )
    return np.round(values[0, 0].mean(axis=-1) - truth, 4).tolist()


def main():
    args = _parse()
    settings = PredictSettings(k=100)
    v = validation.ValidationSettings(split="dev", manifest=args.manifest, draws=args.draws)
    fractions, cells = validation._cells(settings, v, 0)
    wanted = set(args.cells.split(","))
    for cell in (c for c in cells if c.name in wanted):
        for j, f in enumerate(fractions):
            for scores, tc, n, _, seed in list(cell.samples(j, f))[: args.draws]:
                h = estimators.get("evt_averaged")(scores, settings.tail)
                mask = scores.mask
                full = np.where(mask, tc + scores.fixed_counts, -1)
                truth = np.array(
                    [metrics.value_from_counts(m, full, mask, 100).mean() for m in METRIC_LIST]
                )
                x = np.where(mask, tc / n, 0.0)[..., None]
                tail = h.tail_priced & mask
                counted = mask & ~h.tail_priced
                rows = {
                    "default": h.atoms,
                    "counts at truth": np.where(counted[..., None], x, h.atoms),
                    "tail at truth": np.where(tail[..., None], x, h.atoms),
                }
                if args.eb:
                    rows["eb counts"] = eb_atoms(scores, h, counted)
                got = {name: errors(scores, a, h.weights, n, truth) for name, a in rows.items()}
                print(cell.name, f, seed, "(map, recall, ndcg):", got, flush=True)


if __name__ == "__main__":
    main()
