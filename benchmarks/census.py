"""Census designs against uniform sampling at the same embedding budget, on dev text galleries.

Issue #38. The target model's ILIAS-format folder and a proxy model's folder of the same
benchmark (the same ids: `benchmarks/text_galleries.py` writes both, e.g.
`dev-minilm-names` and `dev-lsa-names`) give, for each query set, the exact mAP@k (brute force
over every distractor), the proxy's per-query top-D lists (brute force, the official
similarity file's content) and, per budget f and hash seed:

- uniform: the id-hash sample at f (`core/sampling.py`), predicted as today;
- census: `core/design.plan` from the proxy's lists (census share of the budget at most
  `--census_share`, shrunk by the job's share rule unless `--share_rule=0`), the hash sample
  at the rate that makes the total embedded share f (census items it draws included, as the
  ILIAS job writes it), the pooled prediction (`protocol/census.predict`).

- reference (`--reference=R`): the uniform sample corrected by the proxy's exact run as a
  control variate (`protocol/reference.correct`, PPI form, R joint replicates; the predict and
  ILIAS jobs' `--config.reference`), the proxy's scores of the same sampled items its
  reference scores.

Query sets: the full set (queries x k / N as the benchmark has it) and disjoint sets of
`--set_size` queries (ILIAS-like queries x k / N), split by a hash of the query id. Printed per
(target, proxy, sets, budget): MAE, mean signed error and 90% coverage (the "these queries"
interval) of mAP@k over sets and seeds, for both designs, the census size (share of N, x k per
query) and the share of outrankers in it; then the sets pooled into one benchmark per seed
(`blocks`: their mean against the mAP@k of all their queries), every design. Dev only; PyPI's
summaries are never read.

Command (after text_galleries.py has written the dev folders):
  python benchmarks/census.py --cache=/work/cache/text \\
      --pairs=dev-minilm-names:dev-lsa-names,dev-lsa-names:dev-minilm-names
Runtime: ~1-3 s a prediction on 2 CPU cores; the default grid makes a few hundred.
"""

import argparse
import dataclasses
import json
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import design, metrics, sampling  # noqa: E402
from tailaware.io import features, ilias_folder  # noqa: E402
from tailaware.io import reference_counts as reference_counts_lib  # noqa: E402
from tailaware.io import scores as scores_lib  # noqa: E402
from tailaware.protocol import census, prediction, reference  # noqa: E402
from tailaware.protocol.settings import PredictSettings, ProtocolSettings  # noqa: E402
from tailaware.search import exact  # noqa: E402
from tailaware.sim import synthetic  # noqa: E402
from tailaware.tail.settings import TailSettings  # noqa: E402


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Adds the design's and the grid's flags (shared with census_compare.py)."""
    p.add_argument("--cache", default="/work/cache/text")
    p.add_argument("--budgets", default="0.01,0.02")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--set_size", type=int, default=40, help="queries per ILIAS-like set")
    p.add_argument("--max_sets", type=int, default=6, help="ILIAS-like sets per benchmark")
    p.add_argument("--census_share", type=float, default=0.5, help="the most the census may take")
    p.add_argument(
        "--share_rule", type=int, default=1, help="1: the job's share rule; 0: census_share fixed"
    )
    p.add_argument("--depth", type=int, default=1000, help="the proxy's list depth D")
    p.add_argument("--nested", type=int, default=20, help="nested bootstrap replicates")
    p.add_argument("--full_seeds", type=int, default=1, help="seeds on the full set (0: skip)")
    p.add_argument("--out", default="", help="a JSON-lines file of the records: resumes by set")
    p.add_argument(
        "--start", type=float, default=design.MIDPOINT,
        help="the census's systematic sample's start in (0, 1] (0: drawn from each seed, the "
        "earlier design, for the comparison)",
    )  # fmt: skip


def queries(args: argparse.Namespace, rows: np.ndarray) -> int:
    """Returns `design.plan`'s `queries`: the set's size under the share rule, else 0."""
    return len(rows) if args.share_rule else 0


def read_records(path: str) -> list[dict]:
    """Returns the JSON-lines records of `path` ([] when it is empty or not there)."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def append_records(path: str, records: list[dict]) -> None:
    """Appends `records` to the JSON-lines file `path` (nothing when `path` is empty)."""
    if path:
        with open(path, "a") as f:
            f.writelines(json.dumps(r, default=float) + "\n" for r in records)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default="dev-minilm-names:dev-lsa-names")
    p.add_argument("--fill", type=int, default=1, help="fill the share from rank d + 1 (1: yes)")
    p.add_argument(
        "--reference", type=int, default=0,
        help="replicates of a third design, the uniform sample corrected by the proxy's exact "
        "run (protocol/reference.correct, PPI form); 0: not run",
    )  # fmt: skip
    add_arguments(p)
    return p.parse_args()


@dataclasses.dataclass
class Folder:
    """A benchmark's features (float32) and ground truth."""

    qids: np.ndarray
    q: np.ndarray
    p: np.ndarray
    d: np.ndarray
    dids: np.ndarray
    slots: np.ndarray
    relevant: np.ndarray


def load(path: str) -> Folder:
    """Reads a benchmark's ILIAS-format folder (the readers' checks on, as any job's)."""
    queries = ilias_folder.read_split(path, features.IMAGE_QUERIES)
    dim = queries.features.shape[1]
    positives = ilias_folder.read_split(path, features.POSITIVES, dim=dim)
    shards = sorted(ilias_folder.distractor_shards(path, dim, 0), key=lambda s: s.number)
    d = np.concatenate([s.read_rows(np.arange(s.num_rows)) for s in shards]).astype(np.float32)
    dids = np.concatenate([np.asarray(s.read_ids()).astype(str) for s in shards])
    slots, relevant = ilias_folder.ground_truth(queries.ids, positives.ids)
    f32 = lambda x: np.asarray(x, np.float32)
    return Folder(
        np.asarray(queries.ids), f32(queries.features), f32(positives.features), d, dids,
        slots, relevant,
    )  # fmt: skip


def synthetic_pair(name: str, noise: float) -> tuple[Folder, Folder]:
    """Returns (target, proxy) folders of `tailaware.sim.synthetic`'s benchmark named
    "synthetic-N-Q" (N distractors, Q instances of one query and 5 positives, d = 64): the
    proxy is every descriptor moved by Gaussian noise of sd `noise` per dimension and
    renormalised (a related model), the same ids; a gallery large enough that a 1% budget's
    rest clears the job's sample floor."""
    _, n, q = name.split("-")
    bench = synthetic.make_benchmark(int(q), 1, 5, int(n), 64)
    d = np.concatenate([x for _, x in synthetic.distractor_blocks(bench)])
    dids = np.asarray(bench.distractor_ids(0, int(n)))
    relevant = bench.query_instance[:, None] == bench.positive_instance[None, :]
    slots = np.argsort(~relevant, axis=1, kind="stable")[:, : int(relevant.sum(1).max())]
    slots = np.where(np.take_along_axis(relevant, slots, 1), slots, -1)
    qids = np.asarray([f"inst{i:05d}/query.jpg" for i in bench.query_instance])
    rng = np.random.default_rng(1)

    def moved(x):
        y = x + rng.normal(0.0, noise, x.shape).astype(np.float32)
        return (y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32)

    parts = (bench.queries, bench.positives, d)
    tgt = Folder(qids, *parts, dids, slots, relevant)
    prx = Folder(qids, *(moved(x) for x in parts), dids, slots, relevant)
    return tgt, prx


def settings(k: int, nested: int) -> PredictSettings:
    proto = ProtocolSettings(nested_replicates=nested, query_replicates=200, budget_levels=1)
    return PredictSettings(k=k, tail=TailSettings(), protocol=proto)


def file_of(s, pos, fixed, sampled, m, *, census_mask=None, inclusion=None, start=design.MIDPOINT):
    """Returns the sampled-scores file of the items `sampled` ([N] bool) of scores `s` [Q, N],
    naming each stored score's item (its column) as the ILIAS job does (`tail_ids`); with a
    `census_mask`, a census design's file as the ILIAS job writes it: the items `sampled` holds
    outside the census, each query's systematic sample of the census at the rate `inclusion`
    (`design.systematic_sample` from `start`), and the census's counts."""
    extra = {}
    if census_mask is None:
        cols = np.broadcast_to(np.flatnonzero(sampled), (s.shape[0], int(sampled.sum())))
    else:
        rest = np.flatnonzero(sampled & ~census_mask)
        cen = np.flatnonzero(census_mask)
        picked, ranks = design.systematic_sample(s[:, cen], inclusion, start)
        cols = np.concatenate([np.broadcast_to(rest, (s.shape[0], rest.size)), cen[picked]], 1)
        census_counts = scores_lib.count_above(-np.sort(-s[:, cen], axis=1), pos)
        extra = dict(
            census_counts=np.where(np.isnan(pos), -1, census_counts),
            n_census=int(cen.size),
            inclusion=inclusion,
            drawn_counts=np.where(
                np.isnan(pos), 0, np.searchsorted(ranks, census_counts, side="right")
            ),
            n_drawn=int(ranks.size),
        )
    v = np.take_along_axis(s, cols, 1)
    order = np.argsort(-v, axis=1, kind="stable")
    x = np.take_along_axis(v, order, axis=1)
    ids = np.take_along_axis(cols, order[:, :m], 1)
    counts = np.where(np.isnan(pos), -1, scores_lib.count_above(x, pos))
    return scores_lib.make_scores(
        x[:, :m], pos, counts, int(cols.shape[1]), fixed_counts=fixed, tail_ids=ids, **extra
    )


def census_file(s, pos, fixed, ids, plan, seed, m, start=design.MIDPOINT):
    """Returns a census design's file (`file_of`) of the plan `design.Design`: the rest hashed
    from the item `ids` at its rate by `seed`, the census sampled systematically from `start`
    (0: a start drawn from `seed`, `random_start`)."""
    whole = sampling.in_sample(ids, plan.inclusion, seed)
    start = start or random_start(seed)
    return file_of(
        s, pos, fixed, whole, m, census_mask=plan.census, inclusion=plan.inclusion, start=start
    )


def random_start(seed: int) -> float:
    """Returns the systematic sample's start the library drew from each seed before the
    midpoint (uniform in (0, 1], the same stream): the comparison's other arm."""
    return float(1.0 - np.random.default_rng([int(seed), 0x5E5]).random())


def top_lists(prx: Folder, rows: np.ndarray, depth: int) -> np.ndarray:
    """Returns [Q, depth] the proxy's brute-force top lists of the queries `rows` over its
    distractors, best first (an official similarity file's content)."""
    ps = prx.q[rows] @ prx.d.T
    top = np.argpartition(-ps, depth, axis=1)[:, :depth]
    return np.take_along_axis(top, np.argsort(-np.take_along_axis(ps, top, 1), axis=1), 1)


def exact_run(f: Folder, rows: np.ndarray):
    """Returns (scores [Q, N], positive scores, fixed counts, exact counts [Q, P]) of the
    queries `rows` of the folder `f`, by brute force over every distractor."""
    s = f.q[rows] @ f.d.T
    pos, fixed = exact.positive_scores(f.q[rows] @ f.p.T, f.slots[rows], f.relevant[rows])
    x_all = np.sort(s, axis=1)[:, ::-1]
    return s, pos, fixed, np.where(np.isnan(pos), -1, scores_lib.count_above(x_all, pos))


def reference_counts_of(f: Folder, rows: np.ndarray, counts, fixed, k: int):
    """Returns the proxy's exact run of the queries `rows` as a reference-counts file holds it
    (`io/reference_counts`): its counts, ids and exact mAP@k."""
    value = metrics.map_from_counts(counts, k, fixed)
    pids = np.where(f.slots[rows] >= 0, f.slots[rows].astype(str), "")  # the slots name them
    return reference_counts_lib.make(
        counts, np.asarray(f.qids)[rows], pids, n_distractors=f.d.shape[0], k=k,
        metric_names=[f"map@{k}"], metric_values=[value],
    )  # fmt: skip


def run_set(tgt, prx, rows, args, budgets, out, label, seeds) -> None:
    """Appends one record per (budget, seed, design) for the queries `rows`."""
    s, pos, fixed, k_exact = exact_run(tgt, rows)
    truth = metrics.map_from_counts(k_exact, args.k, fixed)
    if args.reference:
        s_r, pos_r, fixed_r, k_r = exact_run(prx, rows)
        ref_counts = reference_counts_of(prx, rows, k_r, fixed_r, args.k)
        ref_settings = reference.ReferenceSettings(replicates=args.reference, seed=0)
    top = top_lists(prx, rows, args.depth)
    n = tgt.d.shape[0]
    best = design.best_ranks([top], n)
    m = TailSettings().top_m
    st = settings(args.k, args.nested)
    priority = design.fused([top], n) if args.fill else None
    for f in budgets:
        plan = design.plan(
            best, f, census_share=args.census_share, queries=queries(args, rows),
            max_depth=args.depth, priority=priority,
        )  # fmt: skip
        cen = plan.census
        in_census = np.where(np.isnan(pos), 0, scores_lib.count_above(
            np.sort(s[:, cen], axis=1)[:, ::-1], pos))  # fmt: skip
        found = in_census.sum() / max(np.where(np.isnan(pos), 0, k_exact).sum(), 1)
        # the same among the outrankers of positives ranked within k: the ones mAP@k sees
        near = ~np.isnan(pos) & (k_exact < args.k)
        found_k = in_census[near].sum() / max(k_exact[near].sum(), 1)
        for seed in range(seeds):
            t0 = time.monotonic()
            u = sampling.in_sample(tgt.dids, f, seed)
            uniform = file_of(s, pos, fixed, u, m)
            pu = prediction.predict(uniform, st, n)
            sc = census_file(s, pos, fixed, tgt.dids, plan, seed, m, args.start)
            _, pc = census.predict(sc, st, n)
            designs = [("uniform", pu.map, pu.interval.ci90.reported)]
            designs.append(("census", pc.map, pc.interval.ci90.reported))
            # the census design's own sample read as a uniform one (the job's "UNIFORM ONLY")
            extra = {"census": dict(uniform_only=pc.baselines["uniform_only"])}
            if args.reference:
                c = reference.correct(
                    uniform, file_of(s_r, pos_r, fixed_r, u, m), ref_counts, st, ref_settings,
                ).metrics[f"map@{args.k}"]  # fmt: skip
                designs.append(("reference", c.value, c.ci90))
            for name, value, (lo, hi) in designs:
                out.append(
                    dict(
                        label=label, budget=f, seed=seed, design=name, truth=truth,
                        value=value, lo=lo, hi=hi, share=plan.n_census / n,
                        per_k=plan.n_census / (len(rows) * args.k), found=found,
                        qkn=len(rows) * args.k / n, depth=plan.depth, found_k=found_k,
                        census_share=args.census_share, rule=args.share_rule,
                        **extra.get(name, {}),
                    )
                )  # fmt: skip
            print(
                f"  {label} f={f:g} seed={seed}: truth {truth:.4f} "
                + " ".join(f"{name} {value:.4f}" for name, value, _ in designs)
                + f" (C={plan.n_census}, d={plan.depth}, found "
                f"{100 * found:.0f}%, within k {100 * found_k:.0f}%) {time.monotonic() - t0:.0f}s",
                flush=True,
            )
            # Shapes differ from draw to draw: kept, their compiled programs exhaust the
            # process's memory maps over a long run (LLVM "Cannot allocate memory").
            jax.clear_caches()


def table(records) -> str:
    lines = [
        "| target <- proxy | sets | Qk/N | budget | census % of N | x k per query | outrankers "
        "in census | within k | MAE uniform | MAE census | signed uniform | signed census "
        "| cover90 uniform | cover90 census | half-width census |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["label"], r["budget"]) for r in records})
    for label, f in keys:
        rs = [r for r in records if r["label"] == label and r["budget"] == f]
        by = {d: [r for r in rs if r["design"] == d] for d in ("uniform", "census")}
        err = {d: np.asarray([r["value"] - r["truth"] for r in v]) for d, v in by.items()}
        cov = {d: np.mean([r["lo"] <= r["truth"] <= r["hi"] for r in v]) for d, v in by.items()}
        c = by["census"]
        lines.append(
            f"| {label} | {len(c) // len({r['seed'] for r in c})} "
            f"| {np.mean([r['qkn'] for r in c]):.3f} | {f:.0%} "
            f"| {100 * np.mean([r['share'] for r in c]):.2f} "
            f"| {np.mean([r['per_k'] for r in c]):.2f} "
            f"| {100 * np.mean([r['found'] for r in c]):.0f}% "
            f"| {100 * np.mean([r.get('found_k', np.nan) for r in c]):.0f}% "
            f"| {np.abs(err['uniform']).mean():.4f} | {np.abs(err['census']).mean():.4f} "
            f"| {err['uniform'].mean():+.4f} | {err['census'].mean():+.4f} "
            f"| {cov['uniform']:.0%} | {cov['census']:.0%} "
            f"| {np.median([(r['hi'] - r['lo']) / 2 for r in c]):.4f} |"
        )
    return "\n".join(lines)


def blocks(records) -> str:
    """Returns the query sets pooled into one benchmark per (label, budget, design, seed): the
    mean over the sets of the estimate against the mean of their truths (the mAP@k of all their
    queries, as the sets are disjoint and of one size), with the half-width of the sets' mean
    if their intervals were independent. Sets of one seed share the gallery's hash sample, as
    the queries of one benchmark do. A full query set is one set: its draws' errors. Where the
    census records carry it, a row for the census design's own sample read as a uniform one."""
    lines = [
        "| target <- proxy | budget | design | sets | queries | errors by seed | MAE | signed "
        "| half-width (independent sets) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, f in sorted({(r["label"], r["budget"]) for r in records}):
        for d in ("uniform", "census", "census's sample alone", "reference"):
            key = "census" if d == "census's sample alone" else d
            rs = [r for r in records if (r["label"], r["budget"], r["design"]) == (label, f, key)]
            if key != d:
                if not rs or not all("uniform_only" in r for r in rs):
                    continue
                rs = [r | {"value": r["uniform_only"], "lo": np.nan, "hi": np.nan} for r in rs]
            if not rs:
                continue
            seeds = sorted({r["seed"] for r in rs})
            by = [[r for r in rs if r["seed"] == s] for s in seeds]
            err = np.asarray([np.mean([r["value"] - r["truth"] for r in b]) for b in by])
            hw = [np.sqrt(np.sum([((r["hi"] - r["lo"]) / 2) ** 2 for r in b])) / len(b) for b in by]
            size = int(label.rsplit(", ", 1)[1].split()[-2])  # "40 q" or "all 1000 q"
            lines.append(
                f"| {label} | {f:.0%} | {d} | {len(by[0])} | {len(by[0]) * size} "
                f"| {' '.join(f'{e:+.4f}' for e in err)} | {np.abs(err).mean():.4f} "
                f"| {err.mean():+.4f} | {'-' if key != d else f'{np.median(hw):.4f}'} |"
            )
    return "\n".join(lines)


def main() -> None:
    args = _parse()
    budgets = [float(b) for b in args.budgets.split(",")]
    records = read_records(args.out)
    done = {r["set"] for r in records}

    def one(rows, label, name, seeds):
        """Runs one query set unless the records hold it; appends its records to --out."""
        if name in done:
            return
        new: list[dict] = []
        run_set(tgt, prx, rows, args, budgets, new, label, seeds)
        for r in new:
            r["set"] = name
        records.extend(new)
        append_records(args.out, new)

    for pair in args.pairs.split(","):
        t_name, p_name = pair.split(":")
        if t_name.startswith("synthetic-"):
            tgt, prx = synthetic_pair(t_name, float(p_name))
            base = f"{t_name} <- noise {p_name}"
        else:
            root = os.path.join(args.cache, "benchmarks")
            tgt = load(os.path.join(root, t_name, "features"))
            prx = load(os.path.join(root, p_name, "features"))
            enc = lambda name: (name.split("-") + [name])[1]
            base = f"{t_name} <- {enc(p_name)}"
        if not (np.array_equal(tgt.qids, prx.qids) and np.array_equal(tgt.dids, prx.dids)):
            raise ValueError(f"{t_name} and {p_name} are not the same benchmark's ids")
        n_q = len(tgt.qids)
        order = np.argsort(sampling.hash_uniform(tgt.qids, 38))
        n_sets = min(args.max_sets, n_q // args.set_size)
        for i in range(n_sets):
            rows = np.sort(order[i * args.set_size : (i + 1) * args.set_size])
            label = f"{base}, {args.set_size} q"
            one(rows, label, f"{label} #{i}", args.seeds)
        if args.full_seeds:
            label = f"{base}, all {n_q} q"
            one(np.arange(n_q), label, label, args.full_seeds)
    print(table(records))
    print(blocks(records))


if __name__ == "__main__":
    main()
