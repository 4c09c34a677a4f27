"""Two models compared on one shared census against the true difference, on dev text galleries.

Issue #38. Systems A and B (two encoders' ILIAS-format folders of the same benchmark, written
by `benchmarks/text_galleries.py`) and a third model's folder as the proxy: per query set and
hash seed, both systems embed the same items, the census `core/design.plan` draws from the
proxy's brute-force top-D lists plus the rest's hash sample, each is predicted by
`protocol/census.predict`, and `protocol/comparison.compare` gives A - B with its interval for
these queries. Beside it, both systems on the uniform hash sample of the same budget. Each is
held against the exact difference (brute force over every distractor). Printed per (query
sets, budget, design): MAE and mean signed error of the difference, coverage of its 90%
interval and median half-width, the median correlation the compare took between the two
systems' sampling errors (their nested replicates, drawn by item id). Dev only; PyPI's
summaries are never read.

Command (after text_galleries.py has written the dev folders, minilm8 included):
  python benchmarks/census_compare.py --cache=/work/cache/text --a=dev-minilm-names \\
      --b=dev-lsa-names --proxy=dev-minilm8-names --budgets=0.01 --out=workdir/census_compare.jsonl
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import census as bench  # noqa: E402  (benchmarks/census.py: the folders and files)

from tailaware.core import design, metrics, sampling  # noqa: E402
from tailaware.protocol import census, comparison, prediction  # noqa: E402
from tailaware.tail.settings import TailSettings  # noqa: E402


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", default="dev-minilm-names")
    p.add_argument("--b", default="dev-lsa-names")
    p.add_argument("--proxy", default="dev-minilm8-names")
    bench.add_arguments(p)
    return p.parse_args()


def run_set(a, b, prx, rows, name, args, seeds) -> list[dict]:
    """Returns one record per (budget, seed, design) for the queries `rows`."""
    n, m = a.d.shape[0], TailSettings().top_m
    st = bench.settings(args.k, args.nested)
    sa, sb = bench.exact_run(a, rows), bench.exact_run(b, rows)
    truth = [metrics.map_from_counts(s[3], args.k, s[2]) for s in (sa, sb)]
    top = bench.top_lists(prx, rows, args.depth)
    best, fused = design.best_ranks([top], n), design.fused([top], n)
    out = []
    for f in (float(x) for x in args.budgets.split(",")):
        plan = design.plan(
            best, f, census_share=args.census_share, queries=bench.queries(args, rows),
            max_depth=args.depth, priority=fused,
        )  # fmt: skip
        for seed in range(seeds):
            t0 = time.monotonic()
            u = sampling.in_sample(a.dids, f, seed)
            preds = {"uniform": [], "census": []}
            for s, pos, fixed, _ in (sa, sb):
                preds["uniform"].append(
                    prediction.predict(bench.file_of(s, pos, fixed, u, m), st, n)
                )
                sc = bench.census_file(s, pos, fixed, a.dids, plan, seed, m)
                preds["census"].append(census.predict(sc, st, n)[1])
            for kind, (pa, pb) in preds.items():
                c = comparison.compare(pa, pb).ap
                out.append(
                    dict(
                        set=name, budget=f, seed=seed, design=kind, size=len(rows),
                        truth=float(truth[0] - truth[1]), value=c.difference,
                        lo=c.ci90[0], hi=c.ci90[1], sd=c.sd, n_census=plan.n_census,
                        corr=c.sampling_correlation,
                    )
                )  # fmt: skip
            r = out[-2:]
            print(
                f"  {name} f={f:g} seed={seed}: truth {r[0]['truth']:+.4f} uniform "
                f"{r[0]['value']:+.4f} [{r[0]['lo']:+.4f}, {r[0]['hi']:+.4f}] census "
                f"{r[1]['value']:+.4f} [{r[1]['lo']:+.4f}, {r[1]['hi']:+.4f}] "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    return out


def table(records) -> str:
    lines = ["queries  budget  design    n     MAE   signed  cover90  median half-width  corr"]
    keys = sorted({(r["size"], r["budget"], r["design"]) for r in records})
    for size, f, kind in keys:
        rs = [r for r in records if (r["size"], r["budget"], r["design"]) == (size, f, kind)]
        err = np.asarray([r["value"] - r["truth"] for r in rs])
        cov = np.mean([r["lo"] <= r["truth"] <= r["hi"] for r in rs])
        half = np.median([(r["hi"] - r["lo"]) / 2 for r in rs])
        corr = np.median([r.get("corr", np.nan) for r in rs])
        lines.append(
            f"{size:>7}  {f:>6g}  {kind:<8} {len(rs):>3}  {np.abs(err).mean():.4f}  "
            f"{err.mean():+.4f}  {cov:>7.2f}  {half:>17.4f}  {corr:>4.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    args = _parse()
    root = os.path.join(args.cache, "benchmarks")
    a, b, prx = (
        bench.load(os.path.join(root, x, "features")) for x in (args.a, args.b, args.proxy)
    )
    for other in (b, prx):
        if not (np.array_equal(a.qids, other.qids) and np.array_equal(a.dids, other.dids)):
            raise ValueError("the three folders are not the same benchmark's ids")
    records = bench.read_records(args.out)
    done = {r["set"] for r in records}
    order = np.argsort(sampling.hash_uniform(a.qids, 38))
    sets = [
        (f"q{args.set_size}_{i}", np.sort(order[i * args.set_size : (i + 1) * args.set_size]))
        for i in range(min(args.max_sets, len(a.qids) // args.set_size))
    ]
    if args.full_seeds:
        sets.append((f"all{len(a.qids)}", np.arange(len(a.qids))))
    for name, rows in sets:
        if name in done:
            continue
        seeds = args.full_seeds if name.startswith("all") else args.seeds
        new = run_set(a, b, prx, rows, name, args, seeds)
        records.extend(new)
        bench.append_records(args.out, new)
    print(table(records))


if __name__ == "__main__":
    main()
