"""Issue #42 on the dev split: a related model's exact run correcting a new model's estimate.

A dev benchmark of npm summaries (`tailaware.sim.text`, the dev half only: name-family
instances, capped, and a hash-chosen subset of the half's other summaries as distractors) is
embedded by MiniLM-L6 and by related encoders, each scored exactly against every distractor.
Pairs (target <- reference) of decreasing closeness: MiniLM corrected by its own PCA-256
projection, its float16 and int8 quantizations, MiniLM on the first 8 tokens of each text,
MiniLM with CLS or max pooling instead of mean, and LSA-128 (an unrelated encoder); and each
direction (the reference as the target, MiniLM as its reference) where it is not symmetric.
For each fraction and seed, a uniform sample of the distractors gives both models' sampled
scores of the same items (`tailaware.sim.paired.draw`), and the script prints, per pair and
fraction, the mean over the seeds of: |error| of mAP@k at N of the corrected prediction in each
form (`tailaware.protocol.reference.correct`: "ppi", today's error on A scaled by lambda taken
off; "difference", the difference estimator mixed in by lambda) with its lambda, whether its 90%
interval held the truth and its half-width (the median over the seeds); and |error| of today's
default (the configured estimator) and of plain counts (x = K / S). Then, per fraction and
seed, the compare job's result for the PCA-256 pair (`comparison.against_reference`: MiniLM -
PCA-256 from the correction alone) against the true difference.

MiniLM (mean pooling) is read from the text benchmarks' cache of every usable npm summary
(`benchmarks/text_galleries.py`, --minilm_cache; never recomputed here: a missing chunk is an
error). The other encoders are embedded once and cached under --workdir (first 8 tokens: about a
minute; CLS and max pooling, one pass: minutes on shared CPUs). PyPI summaries are never read.

Command:
  python benchmarks/reference_correction.py --workdir=workdir/reference > reference.log 2>&1
"""

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import metrics, sampling  # noqa: E402
from tailaware.protocol import comparison, reference  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.sim import paired  # noqa: E402
from tailaware.sim import text as tb  # noqa: E402

NPM = "/work/.library/env/packages/npm.tsv"


FIRST_TOKENS = 8  # the "first n tokens" encoder: n word pieces, then [SEP]


def _cached_minilm(texts: Sequence[str]) -> np.ndarray:
    raise RuntimeError("the MiniLM cache is incomplete: run benchmarks/text_galleries.py first")


def _pools(model: tb.MiniLM) -> Callable[[Sequence[str]], np.ndarray]:
    """Returns an encoder of texts to [n, 2 H]: MiniLM's CLS token and max-pooled states, each
    L2-normalised (one forward pass for both poolings)."""

    def encode(texts: Sequence[str]) -> np.ndarray:
        lengths = [len(t) for t in model.tokenizer(list(texts), truncation=True)["input_ids"]]
        order = np.argsort(lengths, kind="stable")
        out = np.zeros((len(texts), 2 * tb.MINILM_DIM), np.float32)
        for s in range(0, len(texts), model.batch_size):
            rows = order[s : s + model.batch_size]
            hidden, mask = model.hidden([texts[r] for r in rows])
            top = np.where(mask[:, :, None] > 0, hidden, -np.inf).max(axis=1)
            out[rows] = np.concatenate([tb.l2_normalize(hidden[:, 0]), tb.l2_normalize(top)], 1)
        return out

    return encode


def build(workdir: str, minilm_cache: str, needed: set, max_instances: int, distractors: int):
    """Returns ({encoder: embeddings [n, d]} of MiniLM and the `needed` encoders, query rows,
    positive slots [Q, P], distractor rows) of the dev benchmark, rows into the embeddings."""
    packages = tb.read_npm(NPM)
    dev_rows = np.flatnonzero(tb.split_mask(packages.names, "dev"))
    dev = packages.take(dev_rows)
    instances = tb.name_families(dev, max_instances=max_instances)
    lay = tb.layout(dev, instances)
    u = sampling.hash_uniform(np.asarray(lay.distractor_ids, dtype=str), tb.SPLIT_SEED + 7)
    chosen = np.sort(lay.distractor_rows[np.argsort(u, kind="stable")[:distractors]])
    rows = np.concatenate([lay.query_rows, lay.positive_rows, chosen])
    texts = [str(dev.summaries[r]) for r in rows]
    t0 = time.monotonic()
    out = {}
    if "first8" in needed:
        model = tb.MiniLM(max_len=FIRST_TOKENS + 2)  # [CLS], n word pieces, [SEP]
        out["first8"] = tb.embed_cached(texts, model, os.path.join(workdir, "minilm_first8"))
    if needed & {"cls", "max"}:
        pools = tb.embed_cached(texts, _pools(tb.MiniLM()), os.path.join(workdir, "minilm_pools"))
        out["cls"], out["max"] = pools[:, : tb.MINILM_DIM], pools[:, tb.MINILM_DIM :]
    every = tb.embed_cached(list(packages.summaries), _cached_minilm, minilm_cache)
    out["minilm"] = every[dev_rows[rows]]
    print(f"encoders of {len(texts)} texts in {time.monotonic() - t0:.0f} s", flush=True)
    if "lsa128" in needed:
        out["lsa128"] = tb.lsa(texts, dim=128)
    q = len(instances)
    width = max(len(i.positives) for i in instances)
    slots = np.full((q, width), -1, np.int64)
    start = q
    for i, inst in enumerate(instances):
        slots[i, : len(inst.positives)] = np.arange(start, start + len(inst.positives))
        start += len(inst.positives)
    return out, np.arange(q), slots, np.arange(start, len(rows))


def pca(x: np.ndarray, dim: int) -> np.ndarray:
    """Returns x projected on its top `dim` principal directions (uncentred), L2-normalised."""
    _, _, vt = np.linalg.svd(x[:: max(len(x) // 20000, 1)], full_matrices=False)
    return tb.l2_normalize(x @ vt[:dim].T)


def int8(x: np.ndarray) -> np.ndarray:
    """Returns x quantized to int8 per dimension (symmetric, max-abs scale), L2-normalised."""
    scale = np.abs(x).max(axis=0) / 127.0
    return tb.l2_normalize(np.round(x / scale) * scale)


FORWARD = ("pca256", "float16", "int8", "first8", "cls", "max", "lsa128")
REVERSE = ("pca256", "first8", "cls", "max", "lsa128")  # the reference as the target


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="workdir/reference")
    parser.add_argument("--minilm_cache", default="/work/cache/text/minilm")
    parser.add_argument("--instances", type=int, default=300)
    parser.add_argument("--distractors", type=int, default=25000)
    parser.add_argument("--fractions", default="0.01,0.05")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--replicates", type=int, default=30)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--pairs", default="", help="target:reference,... (default: all)")
    args = parser.parse_args()
    t0 = time.monotonic()
    pairs = [("minilm", r) for r in FORWARD] + [(r, "minilm") for r in REVERSE]
    if args.pairs:
        pairs = [tuple(p.split(":")) for p in args.pairs.split(",")]
    used = sorted({name for pair in pairs for name in pair})
    emb, q_rows, slots, d_rows = build(
        args.workdir, args.minilm_cache, set(used), args.instances, args.distractors
    )
    minilm = emb["minilm"]
    emb["pca256"] = pca(minilm, 256)
    emb["float16"] = tb.l2_normalize(minilm.astype(np.float16).astype(np.float32))
    emb["int8"] = int8(minilm)
    settings = PredictSettings(k=args.k)
    counting = dataclasses.replace(settings, estimator="count")
    only_map = (metrics.METRICS["map"],)
    systems = {
        name: paired.System.from_embeddings(emb[name], q_rows, slots, d_rows) for name in used
    }
    n = systems["minilm"].n_distractors
    exact = {name: metrics.map_from_counts(s.counts, args.k) for name, s in systems.items()}
    print(
        f"dev benchmark: {len(q_rows)} queries, {int((slots >= 0).sum())} positives, "
        f"{n} distractors; exact mAP@{args.k}: "
        + ", ".join(f"{name} {v:.4f}" for name, v in exact.items()),
        flush=True,
    )
    label = f"map@{args.k}"
    truth_cmp = exact["minilm"] - exact.get("pca256", np.nan)
    print(
        f"\n| target <- reference | exact B - A | fraction | PPI form | lambda | cov90 | "
        f"half-width | difference form | lambda | cov90 | half-width | "
        f"today ({settings.estimator}) | count |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    compared = []
    for fraction in map(float, args.fractions.split(",")):
        rows = {pair: [] for pair in pairs}
        for seed in range(args.seeds):
            drawn = {
                name: paired.draw(s, fraction, seed=seed, top_m=settings.tail.top_m)
                for name, s in systems.items()
            }
            caches = {name: {} for name in systems}  # today's point and replicates per target
            for target, ref in pairs:
                truth = exact[target]
                count_map = float(reference.today(drawn[target], counting, n, only_map)[0].mean())
                row = []
                for form in reference.FORMS:
                    c = reference.correct(
                        drawn[target],
                        drawn[ref],
                        systems[ref].reference_counts(args.k),
                        settings,
                        reference.ReferenceSettings(
                            replicates=args.replicates, seed=seed, form=form
                        ),
                        metric_list=only_map,
                        cache=caches[target],
                    )
                    m = c.metrics[label]
                    lo, hi = m.ci90
                    row += [abs(m.value - truth), m.lam, lo <= truth <= hi, (hi - lo) / 2]
                    if form == "ppi" and (target, ref) == ("minilm", "pca256"):
                        p = comparison.against_reference(c, k=args.k).ap
                        compared.append((fraction, seed, p))
                        print(
                            f"  compare minilm - pca256 (truth {truth_cmp:+.4f}): "
                            f"{p.difference:+.4f} [{p.ci90[0]:+.4f}, {p.ci90[1]:+.4f}]",
                            flush=True,
                        )
                rows[(target, ref)].append(
                    row + [abs(m.uncorrected - truth), abs(count_map - truth)]
                )
                print(f"  f={fraction} seed={seed} {target} <- {ref}: {row[:2]}", flush=True)
            print(f"  f={fraction} seed={seed} done at {time.monotonic() - t0:.0f} s", flush=True)
        for (target, ref), r in rows.items():
            a = np.asarray(r, np.float64).mean(axis=0)
            a[[3, 7]] = np.median(np.asarray(r, np.float64)[:, [3, 7]], axis=0)
            print(
                f"| {target} <- {ref} | {exact[target] - exact[ref]:+.4f} | {fraction:g} | "
                f"{a[0]:.4f} | {a[1]:.2f} | {a[2]:.2f} | {a[3]:.4f} | {a[4]:.4f} | {a[5]:.2f} | "
                f"{a[6]:.2f} | {a[7]:.4f} | {a[8]:.4f} | {a[9]:.4f} |",
                flush=True,
            )
    if compared:
        print(
            f"\ncompare minilm - pca256 from the PPI correction (true difference {truth_cmp:+.4f}):"
        )
        print("| fraction | seed | difference | ci90 | covers | excludes 0 | ci90, queries |")
        print("|---|---|---|---|---|---|---|")
        for fraction, seed, p in compared:
            lo, hi = p.ci90
            qlo, qhi = p.ci90_queries
            print(
                f"| {fraction:g} | {seed} | {p.difference:+.4f} | [{lo:+.4f}, {hi:+.4f}] | "
                f"{'yes' if lo <= truth_cmp <= hi else 'no'} | {'yes' if p.resolved else 'no'} | "
                f"[{qlo:+.4f}, {qhi:+.4f}] |"
            )
    print(f"\ntotal {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
