"""Issue #32's candidates against the default on the dev split: information beyond one query.

Each candidate predicts mAP@k at N from every draw of the frozen dev split (its simulated
families and its real-text benchmarks, half and large; `validation.SPLITS["dev"]`), next to the
default `evt_averaged`:

- `pooled`: each query's tail is the benchmark's tail pooled over all its queries, in
  standardised units: excesses over the query's threshold (at quantile q of its kept scores)
  divided by the query's mean excess; a positive at s is priced (n_u / S) G((s - u) / scale),
  G the pooled survival (each query weighing 1 / Q), conditioned on the scores' bound, an
  exponential beyond the pool's largest excess; counts elsewhere, as the estimators do.
- `mixed`: the default's atoms mixed with the pooled tail, x = (1 - pi) x_own + pi x_pooled,
  pi fitted per benchmark by maximum likelihood of the tail-priced positives' own sampled counts
  (Poisson, conditioned below `min_count`).
- `subsample`: the empirical-Bayes prior's shift chosen per benchmark on nested sub-samples
  S / 2^L: the shift at which the sub-sample's prediction of the sample's own realized mAP@k
  crosses it, against the shift the truth at N wants (`--subsample`; slow).

`--clusters` prints instead, per draw, statistics of each query's top sampled excesses against
its own plug-in fit (a benchmark-level test for near-duplicate clusters above the sampled
tails): the share of queries whose largest excess is beyond the fit at p < 0.05 and p < 0.01,
the median Anderson-Darling statistic, the median fitted count above the 5th largest excess.

Prints one line per draw and the MAE and bias per family (simulated, half, large) and fraction;
`--out` writes the records (JSON).

Command (the dev manifest of `benchmarks/text_galleries.py`):
  python benchmarks/shared_tails.py --manifest=CACHE/manifest.json [--subsample | --clusters]
"""

import argparse
import json
import os
import sys
import time

import numpy as np
from scipy import stats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import evaluate, metrics  # noqa: E402
from tailaware.protocol import baselines, budget, validation  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.tail import dequantize, estimators, evt, gpd  # noqa: E402

SHIFTS = np.array([-0.04, -0.02, 0.0, 0.02, 0.04, 0.06, 0.08, 0.10, 0.14])
PIS = np.linspace(0.0, 1.0, 41)


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--draws", type=int, default=2)
    p.add_argument("--num_queries", type=int, default=300, help="per simulated benchmark")
    p.add_argument("--subsample", action="store_true", help="also the sub-sample calibration")
    p.add_argument("--clusters", action="store_true", help="only the cluster statistics")
    p.add_argument("--out", default="")
    return p.parse_args()


def pooled_hardness(scores, settings, quantile):
    """Returns x [Q, P] of the pooled standardised tail (see the module docstring)."""
    mask = scores.mask
    m = min(scores.tail_scores.shape[1], int(scores.n_sample), settings.top_m)
    tail = dequantize.spread_ties(scores.tail_scores[:, :m], settings.tie_share).astype(float)
    q = tail.shape[0]
    finite = np.isfinite(tail).sum(axis=1)
    n_u = np.floor((1 - quantile) * finite + 0.5 + evt.ROUND_SLACK).astype(int)
    n_u = np.clip(n_u, np.minimum(evt.MIN_EXCESSES, finite - 1), finite - 1)
    u = tail[np.arange(q), n_u]
    zs, ws, scale = [], [], np.full(q, np.nan)
    for i in range(q):
        y = tail[i, : n_u[i]] - u[i]
        y = y[y > 0]
        if y.size:
            scale[i] = y.mean()
            zs.append(y / scale[i])
            ws.append(np.full(y.size, 1.0 / (q * y.size)))
    z, w = np.concatenate(zs), np.concatenate(ws)
    order = np.argsort(-z)
    z, cum = z[order], np.cumsum(w[order])
    top = z[:200]
    beta = max(float((top - top[-1]).mean()), 1e-6)

    def survival(v):
        above = np.searchsorted(-z, -v, side="left")  # pooled excesses above v
        g = np.where(above > 0, cum[np.maximum(above - 1, 0)], 0.0)
        g = np.where(v >= z[0], cum[0] * np.exp(-(v - z[0]) / beta), g)
        return np.where(v <= 0, 1.0, g)

    pos = np.where(mask, scores.pos_scores, np.nan).astype(float)
    counts = np.where(mask, scores.pos_counts, 0)
    s = float(scores.n_sample)
    at_bound = survival((settings.score_bound - u) / scale)[:, None]
    g = survival(np.nan_to_num((pos - u[:, None]) / scale[:, None], nan=0.0))
    g = np.maximum(g - at_bound, 0.0) / np.maximum(1.0 - at_bound, 1e-12)
    priced = mask & (counts < settings.min_count) & (pos >= u[:, None])
    priced &= np.isfinite(scale)[:, None]
    return np.where(mask, np.where(priced, n_u[:, None] / s * g, counts / s), 0.0)


def map_of(scores, atoms, weights, n, k):
    """Returns mAP@k at n of atoms [Q, P, A] under weightings [W, Q, A]: [W]."""
    v, _ = evaluate.predicted_values(
        [evaluate.Variant(atoms, weights)], scores.mask, [float(n)], k, scores.fixed_counts, scores
    )
    return v[:, 0, 0].mean(axis=-1)


def fit_mixture(h, x_pool, scores, min_count):
    """Returns pi maximising the tail-priced positives' counts' likelihood (see `mixed`)."""
    priced = h.tail_priced & scores.mask
    k = scores.pos_counts[priced]
    s = float(scores.n_sample)
    own = s * np.einsum("qpa,qa->qp", h.atoms, h.weights)[priced]
    lls = []
    for pi in PIS:
        lam = np.maximum((1 - pi) * own + pi * s * x_pool[priced], 1e-300)
        below = np.maximum(stats.poisson.cdf(min_count - 1, lam), 1e-300)
        lls.append(np.sum(stats.poisson.logpmf(k, lam) - np.log(below)))
    return float(PIS[int(np.argmax(lls))])


def shifted(h, settings):
    """Returns [D, Q, A] the posterior weights under the prior's mean moved by each of SHIFTS
    (an exact re-weighting of the same atoms: the prior enters the weights as a factor)."""
    xis = np.asarray(evt.xi_grid(settings.xi_tilt, xi_max=settings.xi_max)[0], np.float64)
    mu, tau = float(h.fit.prior_mean[0]), float(h.fit.prior_sd[0])

    def log_prior(shift):
        z = -0.5 * ((xis - mu - shift) / tau) ** 2
        return z - np.logaddexp.reduce(z)

    base = log_prior(settings.eb_shift)
    out = []
    for d in SHIFTS:
        lw = np.log(np.maximum(h.weights, 1e-300)) + (log_prior(d) - base)[None]
        w = np.exp(lw - lw.max(axis=1, keepdims=True))
        out.append(w / w.sum(axis=1, keepdims=True))
    return np.stack(out)


def crossing(err) -> float:
    """Returns the shift where `err` [len(SHIFTS)] (falling with the shift) crosses 0."""
    for i in range(len(err) - 1):
        if np.sign(err[i]) != np.sign(err[i + 1]):
            return float(SHIFTS[i] + (SHIFTS[i + 1] - SHIFTS[i]) * err[i] / (err[i] - err[i + 1]))
    return float(SHIFTS[0] if err[0] < 0 else SHIFTS[-1])


def cluster_stats(scores, h, settings) -> dict:
    """Returns the `--clusters` statistics of one draw (see the module docstring)."""
    fit = h.fit
    m = min(scores.tail_scores.shape[1], int(scores.n_sample), settings.top_m)
    tail = dequantize.spread_ties(scores.tail_scores[:, :m], settings.tie_share).astype(float)
    xi, sigma, u, n_u = (np.asarray(a, float) for a in (fit.xi, fit.sigma, fit.u, fit.n_exceed))
    survival = lambda y: np.exp(np.asarray(gpd.log_survival(y, xi, sigma), np.float64))
    top = survival(tail[:, 0] - u)
    p = -np.expm1(n_u * np.log1p(-np.clip(top, 0.0, 1.0 - 1e-15)))  # the maximum's p-value
    ok = np.isfinite(p) & (n_u > 0)
    fifth = n_u * survival(tail[:, 4] - u)
    return {
        "p<0.05": float(np.mean(p[ok] < 0.05)),
        "p<0.01": float(np.mean(p[ok] < 0.01)),
        "ad": float(np.nanmedian(np.asarray(fit.ad, float))),
        "above 5th": float(np.median(fifth[ok])),
    }


def main():
    args = _parse()
    settings = PredictSettings(k=args.k)
    tail, k = settings.tail, args.k
    v = validation.ValidationSettings(
        split="dev", manifest=args.manifest, num_queries=args.num_queries, draws=args.draws
    )
    fractions, cells = validation._cells(settings, v, 0)
    records, t0 = [], time.time()
    for cell in cells:
        for j, f in enumerate(fractions):
            for scores, truth_counts, n, _, seed in list(cell.samples(j, f))[: v.draws]:
                truth = metrics.map_from_counts(truth_counts, k, scores.fixed_counts)
                h = estimators.get("evt_averaged")(scores, tail)
                rec = {"cell": cell.name, "f": f, "seed": seed, "truth": truth}
                if args.clusters:
                    rec.update(cluster_stats(scores, h, tail))
                    records.append(rec)
                    print(json.dumps(rec), f"({time.time() - t0:.0f} s)", flush=True)
                    continue
                rec["default"] = float(map_of(scores, h.atoms, h.weights[None], n, k)[0]) - truth
                for quantile in (0.95, 0.975):
                    x = pooled_hardness(scores, tail, quantile)
                    one = np.ones((1, x.shape[0], 1))
                    rec[f"pooled {quantile}"] = float(map_of(scores, x[..., None], one, n, k)[0])
                    rec[f"pooled {quantile}"] -= truth
                    pi = fit_mixture(h, x, scores, tail.min_count)
                    mix = np.where(
                        h.tail_priced[..., None], (1 - pi) * h.atoms + pi * x[..., None], h.atoms
                    )
                    rec[f"mixed {quantile}"] = float(map_of(scores, mix, h.weights[None], n, k)[0])
                    rec[f"mixed {quantile}"] -= truth
                    rec[f"pi {quantile}"] = pi
                if args.subsample:
                    full = map_of(scores, h.atoms, shifted(h, tail), n, k)
                    rec["shift wanted"] = crossing(full - truth)
                    at_s = baselines.at_sample_map(scores, k)
                    subs = budget.nested_subsamples(scores, 3, seed)[:3]
                    for level, sub in zip((8, 4, 2), subs, strict=True):
                        hs = estimators.get("evt_averaged")(sub, tail)
                        got = map_of(sub, hs.atoms, shifted(hs, tail), scores.n_sample, k)
                        rec[f"shift from S/{level}"] = crossing(got - at_s)
                records.append(rec)
                print(
                    json.dumps(
                        {key: round(v, 4) if isinstance(v, float) else v for key, v in rec.items()}
                    ),
                    f"({time.time() - t0:.0f} s)",
                    flush=True,
                )
    if args.clusters:
        return _write(records, args.out)
    family = lambda c: (
        "simulated" if not c.startswith("text") else ("large" if c.endswith("-large") else "half")
    )
    rows = [key for key in records[0] if key.startswith(("default", "pooled", "mixed"))]
    for f in fractions:
        for fam in ("simulated", "half", "large", "all"):
            sel = [r for r in records if r["f"] == f and fam in ("all", family(r["cell"]))]
            cells = "  ".join(
                f"{row} {np.mean([abs(r[row]) for r in sel]):.4f} "
                f"({np.mean([r[row] for r in sel]):+.4f})"
                for row in rows
            )
            print(f"f={f:<5} {fam:<9} MAE (bias): {cells}")
    if args.subsample:
        wanted = np.array([r["shift wanted"] for r in records])
        for level in (8, 4, 2):
            got = np.array([r[f"shift from S/{level}"] for r in records])
            print(
                f"shift from S/{level} vs wanted: correlation {np.corrcoef(got, wanted)[0, 1]:.2f}"
            )
    _write(records, args.out)


def _write(records, path):
    if path:
        with open(path, "w") as fh:
            json.dump(records, fh)


if __name__ == "__main__":
    main()
