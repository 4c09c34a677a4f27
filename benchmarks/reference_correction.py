"""Issue #42 on the dev split: a related model's exact run correcting a new model's estimate.

A dev benchmark of npm summaries (`tailaware.sim.text`, the dev half only: name-family
instances, capped, and a hash-chosen subset of the half's other summaries as distractors) is
embedded by MiniLM-L6 (the target B) and scored exactly against every distractor. References A
of decreasing closeness: B's own PCA-256 projection, its float16 and int8 quantizations, and
LSA-128 (an unrelated encoder). For each fraction and seed, a uniform sample of the distractors
gives B's and A's sampled scores of the same items (`tailaware.sim.paired.draw`), and the
script prints, per reference and fraction, the mean over the seeds of: |error| of mAP@k at N
of the corrected prediction in each form (`tailaware.protocol.reference.correct`: "ppi",
today's error on A scaled by lambda taken off; "difference", the difference estimator mixed in
by lambda) with its lambda, whether its 90% interval held the truth and its half-width; and
|error| of today's default (the configured estimator) and of plain counts (x = K / S).

Embeddings are cached under --workdir (MiniLM ~5 min on one core the first time; a rerun
skips it). PyPI summaries are never read.

Command:
  python benchmarks/reference_correction.py --workdir=workdir/reference > reference.log 2>&1
"""

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tailaware.core import metrics, sampling  # noqa: E402
from tailaware.protocol import reference  # noqa: E402
from tailaware.protocol.settings import PredictSettings  # noqa: E402
from tailaware.sim import paired  # noqa: E402
from tailaware.sim import text as tb  # noqa: E402

NPM = "/work/.library/env/packages/npm.tsv"


def build(workdir: str, max_instances: int, distractors: int):
    """Returns (MiniLM, LSA-128 embeddings [n, d], query rows, positive slots [Q, P], distractor
    rows) of the dev benchmark, rows into the embeddings."""
    packages = tb.read_npm(NPM)
    dev = packages.take(np.flatnonzero(tb.split_mask(packages.names, "dev")))
    instances = tb.name_families(dev, max_instances=max_instances)
    lay = tb.layout(dev, instances)
    u = sampling.hash_uniform(np.asarray(lay.distractor_ids, dtype=str), tb.SPLIT_SEED + 7)
    chosen = np.sort(lay.distractor_rows[np.argsort(u, kind="stable")[:distractors]])
    rows = np.concatenate([lay.query_rows, lay.positive_rows, chosen])
    texts = [str(dev.summaries[r]) for r in rows]
    t0 = time.monotonic()
    minilm = tb.embed_cached(texts, tb.MiniLM(), os.path.join(workdir, "minilm"))
    print(f"MiniLM: {len(texts)} texts in {time.monotonic() - t0:.0f} s", flush=True)
    lsa = tb.lsa(texts, dim=128)
    q = len(instances)
    width = max(len(i.positives) for i in instances)
    slots = np.full((q, width), -1, np.int64)
    start = q
    for i, inst in enumerate(instances):
        slots[i, : len(inst.positives)] = np.arange(start, start + len(inst.positives))
        start += len(inst.positives)
    return minilm, lsa, np.arange(q), slots, np.arange(start, len(rows))


def pca(x: np.ndarray, dim: int) -> np.ndarray:
    """Returns x projected on its top `dim` principal directions (uncentred), L2-normalised."""
    _, _, vt = np.linalg.svd(x[:: max(len(x) // 20000, 1)], full_matrices=False)
    return tb.l2_normalize(x @ vt[:dim].T)


def int8(x: np.ndarray) -> np.ndarray:
    """Returns x quantized to int8 per dimension (symmetric, max-abs scale), L2-normalised."""
    scale = np.abs(x).max(axis=0) / 127.0
    return tb.l2_normalize(np.round(x / scale) * scale)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="workdir/reference")
    parser.add_argument("--instances", type=int, default=300)
    parser.add_argument("--distractors", type=int, default=25000)
    parser.add_argument("--fractions", default="0.01,0.05")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--replicates", type=int, default=30)
    parser.add_argument("--k", type=int, default=100)
    args = parser.parse_args()
    t0 = time.monotonic()
    minilm, lsa, q_rows, slots, d_rows = build(args.workdir, args.instances, args.distractors)
    refs = {
        "pca256": pca(minilm, 256),
        "float16": tb.l2_normalize(minilm.astype(np.float16).astype(np.float32)),
        "int8": int8(minilm),
        "lsa128": lsa,
    }
    settings = PredictSettings(k=args.k)
    counting = dataclasses.replace(settings, estimator="count")
    only_map = (metrics.METRICS["map"],)
    target = paired.System.from_embeddings(minilm, q_rows, slots, d_rows)
    systems = {
        name: paired.System.from_embeddings(e, q_rows, slots, d_rows) for name, e in refs.items()
    }
    n = target.n_distractors
    exact_b = metrics.map_from_counts(target.counts, args.k)
    print(
        f"dev benchmark: {len(q_rows)} queries, {int((slots >= 0).sum())} positives, "
        f"{n} distractors; exact MiniLM mAP@{args.k} = {exact_b:.4f}",
        flush=True,
    )
    for name, sys_a in systems.items():
        print(f"  {name}: exact mAP@{args.k} = {metrics.map_from_counts(sys_a.counts, args.k):.4f}")
    label = f"map@{args.k}"
    print(
        f"\n| reference | fraction | PPI form | lambda | cov90 | half-width | difference form | "
        f"lambda | cov90 | half-width | today ({settings.estimator}) | count |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for fraction in map(float, args.fractions.split(",")):
        rows = {name: [] for name in systems}
        for seed in range(args.seeds):
            b_scores = paired.draw(target, fraction, seed=seed, top_m=settings.tail.top_m)
            count_map = float(reference.today(b_scores, counting, n, only_map)[0].mean())
            cache = {}
            for name, sys_a in systems.items():
                a_scores = paired.draw(sys_a, fraction, seed=seed, top_m=settings.tail.top_m)
                row = []
                for form in reference.FORMS:
                    m = reference.correct(
                        b_scores,
                        a_scores,
                        sys_a.reference_counts(args.k),
                        settings,
                        reference.ReferenceSettings(
                            replicates=args.replicates, seed=seed, form=form
                        ),
                        metric_list=only_map,
                        cache=cache,
                    ).metrics[label]
                    lo, hi = m.ci90
                    row += [abs(m.value - exact_b), m.lam, lo <= exact_b <= hi, (hi - lo) / 2]
                rows[name].append(row + [abs(m.uncorrected - exact_b), abs(count_map - exact_b)])
            print(f"  f={fraction} seed={seed} done at {time.monotonic() - t0:.0f} s", flush=True)
        for name, r in rows.items():
            a = np.asarray(r, np.float64).mean(axis=0)
            print(
                f"| {name} | {fraction:g} | {a[0]:.4f} | {a[1]:.2f} | {a[2]:.2f} | {a[3]:.4f} | "
                f"{a[4]:.4f} | {a[5]:.2f} | {a[6]:.2f} | {a[7]:.4f} | {a[8]:.4f} | {a[9]:.4f} |",
                flush=True,
            )
    print(f"\ntotal {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
