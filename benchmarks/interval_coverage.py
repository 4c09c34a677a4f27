"""Coverage of the two 90% intervals against the realized truth, by query-set size (issue #41).

The estimand is the realized metric of *these* queries over the full gallery. On the real-text
benchmarks of `benchmarks/text_galleries.py` (one split only: dev chooses, test reports) each
benchmark's queries are split, by the order of their ids' hash, into query sets of `--size`
queries (so that queries x k / N is near ILIAS's 0.012; `--sets` of them) and kept whole; each
set is predicted from each sampled draw exactly as a user with that benchmark would (the
predict job's protocol: the default estimator, the nested bootstrap) and held against its own
realized mAP@k (from the exact run's counts). Printed per benchmark, fraction and set size:
MAE and mean signed error, coverage and median half-width of `ci90` (these queries) and
`ci90_queries` (queries like these), and the share of predictions whose `ci90_queries` contains
`ci90`. Every prediction is one JSON line of `--out` (a rerun skips those done).

  python benchmarks/interval_coverage.py --cache=/work/cache/text --split=dev \
      --out=workdir/coverage_dev.jsonl
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import metrics, realization  # noqa: E402
from tailaware.io import scores as scores_lib  # noqa: E402
from tailaware.protocol import intervals, prediction  # noqa: E402
from tailaware.protocol.settings import PredictSettings, ProtocolSettings  # noqa: E402


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds the flags `run` reads (which benchmarks, sets, fractions, draws; the output)."""
    p.add_argument("--cache", default="/work/cache/text")
    p.add_argument("--split", default="dev")
    p.add_argument("--benchmarks", default="", help="comma-separated names (default: the split's)")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--size", type=int, default=40, help="queries per small set")
    p.add_argument("--sets", type=int, default=6, help="small sets per benchmark")
    p.add_argument("--fractions", default="0.01,0.05")
    p.add_argument("--draws", type=int, default=2)
    p.add_argument("--nested", type=int, default=50)
    p.add_argument("--out", default="workdir/interval_coverage.jsonl")


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return p.parse_args()


def query_sets(ids, size: int, sets: int) -> list[tuple[str, np.ndarray]]:
    """Returns (name, query indices) of `sets` disjoint sets of `size` queries (by the hash of
    their ids, so a set does not follow the benchmark's order) and of all the queries."""
    order = np.argsort([hashlib.sha256(str(q).encode()).hexdigest() for q in ids], kind="stable")
    out = [(f"q{size}_{i}", np.sort(order[i * size : (i + 1) * size])) for i in range(sets)]
    out = [(name, idx) for name, idx in out if len(idx) == size]
    return out + [(f"all{len(ids)}", np.arange(len(ids)))]


def one(scores, truth_counts, n_full: int, settings: PredictSettings) -> dict:
    """Predicts one query set and returns its record against the realized truth."""
    t0 = time.time()
    hardness, p = prediction.estimate_and_predict(scores, settings, n_full)
    return record(scores, truth_counts, n_full, settings, hardness, p, t0)


def record(scores, truth_counts, n_full: int, settings, hardness, p, t0: float) -> dict:
    """Returns the record of prediction `p` (with its `hardness`, begun at time `t0`) of one
    query set against the realized truth."""
    mask = scores.mask
    fixed = np.where(mask, scores.fixed_counts, 0)
    spread = realization.spread(
        hardness.x if hardness.atoms is None else hardness.atoms,
        hardness.weights,
        mask,
        n_full,
        settings.k,
        fixed=fixed,
        counts=np.where(mask, scores.pos_counts, 0),
        n_sample=scores.n_sample,
        draws=settings.protocol.realized_draws,
        seed=settings.protocol.seed,
    )
    truth = float(
        metrics.value_from_counts(metrics.METRICS["map"], truth_counts, mask, settings.k).mean()
    )
    unc = p.interval
    budget = p.diagnostics.budget
    return {
        "map": p.map,
        "truth": truth,
        "ci90": list(unc.ci90.reported),
        "ci90_queries": list(unc.ci90.queries),
        "ci90_distractor": None if unc.ci90.distractor is None else list(unc.ci90.distractor),
        "sd_query": unc.sd_query,
        "sd_distractor": unc.sd_distractor,
        "sd_model": unc.sd_model,
        "prior_spread": unc.prior_spread,
        "prior_deviation": unc.prior_deviation,
        "threshold_deviation": unc.threshold_deviation,
        "sd_realized": unc.sd_realized,
        "sd_subsample": unc.sd_subsample,
        "sd_counts": float(realization.mean_sd(spread.counts[0])),
        "sd_posterior": float(realization.mean_sd(spread.total[0])),
        "last_change": None if budget is None else budget.last_change,
        "budget_predictions": None if budget is None else list(budget.predictions),
        "seconds": time.time() - t0,
    }


def sd_subsamples(r: dict) -> float:
    """Returns the sampling sd at S that the budget check's nested sub-samples S/8, S/4, S/2, S
    imply: a halving's move has the variance of the smaller sample's prediction (about 2^i
    times S's for the i-th halving from the top), so var(S) ~ mean_i(move_i^2 / 2^i)."""
    moves = np.diff(np.asarray(r["budget_predictions"], np.float64))[::-1]
    return float(np.sqrt(np.mean(moves**2 / 2.0 ** np.arange(moves.size)))) if moves.size else 0.0


# Candidate intervals for these queries: the prediction +- 1.645 x the quadrature sum of its
# terms (sds), cut to [0, 1], as `intervals.intervals` builds them. "+counts" is `ci90` as
# reported (the realized counts' noise, `core.realization`); "+posterior" draws the atoms too;
# "+sub" adds the sub-samples' sampling sd to it (`ci90` from 7cb3485 to 9cbdb45's parent);
# "max" takes the larger of the distractor and the sub-samples' sds instead (`ci90` since).
CANDIDATES = (
    ("dist+model", lambda r: [r["sd_distractor"] or 0.0, r["sd_model"]]),
    ("+counts", lambda r: [r["sd_distractor"] or 0.0, r["sd_model"], r["sd_counts"]]),
    ("+posterior", lambda r: [r["sd_distractor"] or 0.0, r["sd_model"], r["sd_posterior"]]),
    (
        "+sub",
        lambda r: [r["sd_distractor"] or 0.0, r["sd_model"], r["sd_counts"], sd_subsamples(r)],
    ),
    (
        "max",
        lambda r: [
            intervals.sampling_sd(r["sd_distractor"], sd_subsamples(r)),
            r["sd_model"],
            r["sd_counts"],
        ],
    ),
)


def candidate(r: dict, terms) -> tuple[float, float]:
    """Returns the record's 90% interval for these queries from its `terms` (a record -> sds)."""
    sd = float(np.sqrt(np.sum(np.square(terms(r)))))
    return intervals.in_range(r["map"] - 1.645 * sd, r["map"] + 1.645 * sd)


def contains(outer, inner) -> bool:
    """Returns whether the interval `outer` (lo, hi) contains `inner`."""
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def summarize(records: list[dict]) -> list[str]:
    """Returns the table: one row per benchmark, fraction and set size."""
    groups = {}
    for r in records:
        size = "all" if r["set"].startswith("all") else r["set"].split("_")[0]
        groups.setdefault((r["benchmark"], r["fraction"], size, r["qkn"]), []).append(r)
        groups.setdefault(("(pooled)", "*", size, 0.0), []).append(r)  # every benchmark, fraction
    head = f"{'benchmark':<22}{'frac':>5}{'set':>5}{'QK/N':>6}{'n':>4}{'MAE':>8}{'signed':>8}"
    head += "".join(f"{name:>12}{'h/MAE':>6}" for name, _ in CANDIDATES)
    head += f"{'ciQ':>6}{'Q>=90':>6}"
    lines = [head]
    for (bench, frac, size, qkn), rs in sorted(groups.items()):
        err = np.array([r["map"] - r["truth"] for r in rs])
        mae = np.abs(err).mean()
        line = f"{bench:<22}{frac:>5}{size:>5}{qkn:>6.3f}{len(rs):>4}{mae:>8.4f}{err.mean():>+8.4f}"
        for _, terms in CANDIDATES:
            ci = [candidate(r, terms) for r in rs]
            cov = np.mean([lo <= r["truth"] <= hi for (lo, hi), r in zip(ci, rs, strict=True)])
            half = np.median([(hi - lo) / 2 for lo, hi in ci])
            line += f"{cov:>6.2f} {half:.4f}{half / max(mae, 1e-12):>6.1f}"
        cov_q = np.mean([r["ci90_queries"][0] <= r["truth"] <= r["ci90_queries"][1] for r in rs])
        holds = np.mean([contains(r["ci90_queries"], r["ci90"]) for r in rs])
        lines.append(line + f"{cov_q:>6.2f}{holds:>6.2f}")
    return lines


def run(args, predict) -> dict[str, dict]:
    """Predicts every query set of the split's benchmarks (by `args`) that `args.out` does not
    hold yet, `predict(scores, truth_counts, n_full, settings)` -> its record, and appends each
    record to `args.out`; returns every record, old and new, by key."""
    with open(os.path.join(args.cache, "manifest.json")) as f:
        manifest = json.load(f)
    wanted = set(filter(None, args.benchmarks.split(",")))
    done = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            for line in f:
                r = json.loads(line)
                done[r["key"]] = r
    settings = PredictSettings(
        k=args.k, protocol=ProtocolSettings(nested_replicates=args.nested, curve_points=2)
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for bench in manifest["benchmarks"]:
        if bench["split"] != args.split or (wanted and bench["name"] not in wanted):
            continue
        exact = scores_lib.load_scores(bench["truth"])
        n_full = int(exact.n_sample)
        truth_all = np.where(exact.mask, exact.pos_counts + exact.fixed_counts, -1)
        for frac in args.fractions.split(","):
            for entry in bench["sampled"].get(frac, [])[: args.draws]:
                sampled = scores_lib.load_scores(entry["scores"])
                assert list(sampled.query_ids) == list(exact.query_ids), bench["name"]
                for name, idx in query_sets(sampled.query_ids, args.size, args.sets):
                    key = f"{bench['name']}|{frac}|{entry['draw']}|{name}"
                    if key in done:
                        continue
                    rec = predict(sampled.subset(idx), truth_all[idx], n_full, settings)
                    rec.update(
                        key=key,
                        benchmark=bench["name"],
                        fraction=frac,
                        draw=entry["draw"],
                        set=name,
                        qkn=len(idx) * args.k / n_full,
                    )
                    done[key] = rec
                    with open(args.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    print(
                        f"{key}: {rec['map']:.4f} truth {rec['truth']:.4f} ci90 "
                        f"[{rec['ci90'][0]:.4f}, {rec['ci90'][1]:.4f}] {rec['seconds']:.1f} s",
                        flush=True,
                    )
    return done


def main():
    args = _parse()
    print("\n".join(summarize(list(run(args, one).values()))))


if __name__ == "__main__":
    main()
